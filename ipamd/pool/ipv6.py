"""IPv6 mode's pool: one /80 prefix on the primary ENI, and nothing else to manage.

In IPv6 mode (ENABLE_IPv6) a pod gets a /128 from a /80 EC2 delegated to the primary ENI. A /80
holds 2^48 addresses, far more than max pods, so there is no warm pool to keep: no target is
planned, no secondary ENI is made, nothing is ever released (VPC CNI runs IPv6 the same way). What
is left is to make sure the primary ENI has its /80:

- EC2 is asked first: a /80 it already lists on the primary ENI (the node's earlier run, or
  a delegation made outside ipamd) is taken into the inventory, never a second one asked for;
- only when it lists none is one assigned (AssignIpv6Addresses with a prefix count of 1), and it
  enters the inventory from EC2's own answer.

The daemon does this before it is ready (`before_ready`), so the first ADD finds the /80; the pool's
loop does it again each round while the inventory holds no active /80 (a /80 EC2 stopped listing is
`lost` to the drift, and pods wait on the loop's demand round for a new one). A failed round backs
off as any pool round does. The drift reconciles the /80 by content like any unit; the releaser
refuses one (`ipamd.pool.release.NeverReleased`).
"""

from __future__ import annotations

import logging

from cloud.errors import CloudError
from cloud.ports import Ec2Api
from ipamd.engine.inventory import diff_inventory, eni_record
from ipamd.engine.state import IPV6_PREFIX
from ipamd.errors import StoreWriteFailed
from ipamd.policy.plan import PoolPlan
from ipamd.pool.manager import NO_PLAN, PoolManager

logger = logging.getLogger(__name__)


class Ipv6Pool(PoolManager):
    """The pool manager of IPv6 mode: the module's one /80, and the reports, backoff and pace of
    every pool manager (so the API, metrics and daemon read it as they read IPv4's)."""

    def has_prefix(self) -> bool:
        """Whether the primary ENI's active /80 is in the inventory."""
        state = self._engine.state
        for unit in state.units().values():
            eni = state.eni(unit.eni_id)
            if (
                unit.kind == IPV6_PREFIX
                and unit.state == "active"
                and eni is not None
                and eni.is_primary
            ):
                return True
        return False

    async def before_ready(self) -> None:
        """The /80 in place before the node takes pods; raises `CloudError` or `StoreWriteFailed`
        for the daemon's start-up to retry."""
        if not self.has_prefix():
            # Provisioning disabled: the /80 EC2 lists is taken, none is assigned.
            await self._ensure_prefix(self._ec2, assign=self._settings.provisioning)

    async def run_once(self) -> PoolPlan:
        """One round: nothing while the /80 is there; otherwise EC2's /80 or a new one."""
        if self.has_prefix() or not self._settings.provisioning:
            return NO_PLAN
        now, demand = self._clock.now(), self.pace.demand()
        if self.conditions.backing_off(now) or (not demand and self.conditions.held(now)):
            return NO_PLAN
        try:
            await self._ensure_prefix(self._ec2.with_policy(self.pace.policy(demand)))
        except (CloudError, StoreWriteFailed) as err:
            self._failed(err, demand)
            return NO_PLAN
        self.pace.succeeded(demand)
        return NO_PLAN

    async def adopt(self) -> int:
        """EC2's /80s on the primary ENI into the inventory; returns how many entered."""
        before = len(self._engine.state.units())
        await self._ensure_prefix(self._ec2, assign=False)
        return len(self._engine.state.units()) - before

    async def _ensure_prefix(self, ec2: Ec2Api, *, assign: bool = True) -> None:
        instance_id = self._instance.instance_id
        primary = next(
            (e for e in await ec2.describe_enis(instance_id) if e.device_index == 0), None
        )
        if primary is None:
            raise CloudError("DescribeNetworkInterfaces", "NoPrimaryEni", instance_id)
        if primary.eni_id not in self._engine.state.enis():
            await self._engine.add_eni(eni_record(primary, 0, self._clock.now()))
        listed = primary.units(IPV6_PREFIX)
        if listed:
            # Found again when held as lost (the drift's rule: EC2 lists it, so it is there).
            state, grace = self._engine.state, self._settings.release_grace_s
            diff = diff_inventory(
                state, primary.eni_id, IPV6_PREFIX, listed, self._clock.now(), grace
            )
            await self._engine.add_units(primary.eni_id, diff.to_add, IPV6_PREFIX)
            return
        if not assign:
            return
        prefix = await ec2.assign_ipv6_prefix(primary.eni_id)
        await self._engine.add_units(primary.eni_id, (prefix,), IPV6_PREFIX)
        self.pace.served()
        logger.info("pool.ipv6_prefix eni_id=%s prefix=%s", primary.eni_id, prefix)
