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
loop (`ipamd.pool.rounds.Rounds`, which it composes as every pool does) does it again each round
while the inventory holds no active /80 (a /80 EC2 stopped listing is
`lost` to the drift, and pods wait on the loop's demand round for a new one). A failed round backs
off as any pool round does. The drift reconciles the /80 by content like any unit; the releaser
refuses one (`ipamd.pool.release.NeverReleased`).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

from cloud.errors import CloudError
from cloud.ports import Ec2Api, Instance
from ipamd.clock import Clock
from ipamd.engine.engine import Engine
from ipamd.engine.inventory import diff_inventory, eni_record
from ipamd.engine.state import IPV6_PREFIX
from ipamd.errors import StoreWriteFailed
from ipamd.pool.conditions import never_read
from ipamd.pool.health import PoolReport
from ipamd.pool.params import PoolParams
from ipamd.pool.rounds import NO_PLAN, FailureListener, ListingWatch, Rounds
from ipamd.pool.subnet_catalogue import SubnetCatalogue
from ipamd.sizing.inputs import NodeLimits, PoolTargets
from ipamd.sizing.modes import UnitStrategy
from ipamd.sizing.plan import PoolPlan

logger = logging.getLogger(__name__)


class Ipv6Pool:
    """An IPv6 node's `Pool`: the primary ENI's one /80. It makes no ENI and releases nothing, so it
    has no ENIs in the making or units in release to show, and follows no warm target."""

    def __init__(
        self,
        engine: Engine,
        ec2: Ec2Api,
        instance: Instance,
        limits: NodeLimits,
        settings: PoolParams,
        subnets: SubnetCatalogue,
        clock: Clock,
        rng: random.Random | None = None,
        *,
        subnet_free: Callable[[], int | None] = never_read,
    ) -> None:
        """The arguments of every pool (`ipamd.node.family` builds either with them); `limits`
        are not read: max pods, not the ENIs, bounds what a /80 holds."""
        self._engine = engine
        self._ec2 = ec2
        self._instance = instance
        self._settings = settings
        self._clock = clock
        self.rounds = Rounds(engine, settings, clock, rng or random.Random(), subnet_free)
        self.health, self.conditions, self.pace = (
            self.rounds.health,
            self.rounds.conditions,
            self.rounds.pace,
        )
        self.subnets = subnets
        """The node's subnets, for the status and the ENIConfig follower; no ENI goes to them."""
        self.foreign_enis: set[str] = set()
        """Attached ENIs of others (the drift's listing): never touched."""

    @property
    def strategy(self) -> UnitStrategy:
        return self.conditions.strategy

    @property
    def new_enis(self) -> ListingWatch | None:
        """None: no ENI is made here, so none waits for the drift's listing."""
        return None

    @property
    def pending_enis(self) -> set[str]:
        """None ever: no ENI is made here."""
        return set()

    @property
    def unbound_enis(self) -> set[str]:
        """None ever: no ENI is made here."""
        return set()

    @property
    def releases_in_flight(self) -> set[str]:
        """None ever: a /80 is never released (`ipamd.pool.release.NeverReleased`)."""
        return set()

    def hold_while(self, reason: Callable[[], str]) -> None:
        """Kept, and not read: the /80 is the node's one unit, assigned once whatever the node's
        schedulability, as VPC CNI assigns it at start."""
        self.rounds.hold_while(reason)

    def expect_pods(self, pods_to_come: Callable[[], int]) -> None:
        """Nothing to keep ahead: the /80 already holds every pod max pods allows."""

    def on_failure(self, listener: FailureListener) -> None:
        self.rounds.on_failure(listener)

    def blocked_by(self) -> str:
        return self.rounds.blocked_by()

    def targets(self) -> PoolTargets:
        """As configured; none is followed (`ipamd.node.family.Ipv6.in_force`)."""
        return self._settings.targets

    def plan(self) -> PoolPlan:
        """Nothing to plan: the /80 is there or a round asks for it."""
        return NO_PLAN

    def report(self) -> PoolReport:
        """No ENI in the making, nothing in release (`Rounds.report`)."""
        return self.rounds.report(creating_enis=False, releasing=False)

    async def run(self, interval_s: float) -> None:
        await self.rounds.run(interval_s, self.run_once)

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
            await self._ensure_prefix(self._ec2.with_urgency(self.pace.urgency(demand)))
        except (CloudError, StoreWriteFailed) as err:
            self.rounds.failed(err, demand)
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
