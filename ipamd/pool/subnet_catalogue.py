"""The subnet catalogue: where the pool manager creates its next ENI, with which security groups, and
which subnets are closed to new pods. The rules live in `ipamd.sizing.subnets`; the catalogue keeps
the view of the subnets they are applied to.

- **The view** is one DescribeSubnets of the node's VPC and zone. It is read on first use, then
  every IPAMD_SUBNET_REFRESH_INTERVAL (30 min: two calls a node-hour), and soon after a call finds
  a subnet full; never once per ENI. A failed read keeps the last view and is tried again after
  `RETRY_S`, twice that after a second failure in a row, and so on up to the refresh interval: on
  an account whose read budget thousands of nodes exhaust, a fixed retry multiplied the reads it
  refused. With no view at all, new ENIs go to the node's subnet, as VPC CNI does when
  DescribeSubnets fails.
- **A full subnet** is one a create, or an assign on one of its ENIs, found without room. It stays
  full until a view shows the room that call asked for. Meanwhile it goes last among the
  candidates, and its ENIs grow no more while new ENIs may go to another subnet (`growth_closed`).
- **Without discovery.** With an ENIConfig (custom networking) discovery is off, as in VPC CNI:
  new ENIs go to the ENIConfig's subnet, with its security groups (or the primary ENI's when it
  names none), and nothing is read. Without discovery and without an ENIConfig, new ENIs go to the
  node's subnet, and nothing is read either.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping
from typing import Protocol, runtime_checkable

from cloud.errors import CloudError, SubnetExhausted, SubnetFragmented
from cloud.models import Ipv4UnitKind, NetworkInterface, Subnet
from cloud.ports import Ec2Api, Instance
from ipamd.clock import Clock
from ipamd.config.eniconfig import EniConfig
from ipamd.config.groups import SubnetSettings
from ipamd.engine.state import NodeState
from ipamd.sizing.inputs import NodeStats
from ipamd.sizing.subnets import (
    SubnetFacts,
    excluded_subnets,
    growth_closed,
    rank_subnets,
    still_full,
    stop_growth,
)

logger = logging.getLogger(__name__)


@runtime_checkable
class SubnetSource(Protocol):
    """The one catalog call discovery makes (`cloud.ports.Ec2Catalog.subnets_in`)."""

    async def subnets_in(self, vpc_id: str, availability_zone: str) -> tuple[Subnet, ...]: ...


RETRY_S = 60.0
"""After a failed read (doubled for each failure in a row, up to the refresh interval), or after a
create found a subnet full: the least time to the next read."""


class SubnetCatalogue:
    """The view of the node zone's subnets, and what calls found of them since: the candidates for
    a new ENI (best first), the subnets closed to new pods, the subnets prefix growth avoids, and
    the free addresses scarcity reads (`free_addresses`). It calls EC2 only to read the view
    (`refresh`) and to create an ENI (`create_eni`)."""

    def __init__(
        self,
        source: SubnetSource | None,
        instance: Instance,
        settings: SubnetSettings,
        clock: Clock,
        *,
        cluster_name: str = "",
        eni_config: EniConfig | None = None,
        retry_s: float = RETRY_S,
    ) -> None:
        self._source = source
        self._instance = instance
        self._settings = settings
        self._cluster_name = cluster_name
        """CLUSTER_NAME, which scopes cluster-tagged subnets."""
        self._eni_config = eni_config
        """The node zone's ENIConfig under custom networking: its subnet and security groups, and
        discovery off."""
        self._retry_s = retry_s
        known = bool(instance.vpc_id and instance.availability_zone) and source is not None
        self._discovering = settings.discovery and eni_config is None and known
        self._clock = clock
        self._view: tuple[SubnetFacts, ...] | None = None
        self._due = float("-inf")
        self._last_read = float("-inf")
        self.closed: frozenset[str] = frozenset()
        """Excluded subnets: their ENIs take no new pods and go back once empty."""
        self._no_prefixes: dict[str, float] = {}
        """Subnets that refused a /28 (`SubnetFragmented`), until when new prefix growth
        avoids them."""
        self._full: dict[str, int] = {}
        """Subnets a call found without room -> the addresses it asked for; each is full until a
        view shows that many free (`ipamd.sizing.subnets.still_full`)."""
        self._ranked: tuple[str, ...] | None = None
        """`rank_subnets` of the view and the full subnets, until either changes."""
        self._free: tuple[tuple[SubnetFacts, ...], tuple[str, ...], int] | None = None
        """`free_addresses` of the view and the candidates it was summed for."""
        self.cidrs: dict[str, str] = {}
        """The CIDR of every subnet a view showed: it never changes, so the datapath needs no
        DescribeSubnets of its own for an ENI in one of them."""
        self.reads = 0
        self.failures = 0
        self._failed_in_row = 0
        self.eni_config_problem = ""
        """Why the ENIConfig the node chose cannot be used ("" when it can): `follow_eni_config`."""

    @property
    def discovering(self) -> bool:
        """Discovery on, no ENIConfig, and the node's VPC and zone known (an adapter that does not
        say them leaves new ENIs in the node's subnet). Fixed for the catalogue's life."""
        return self._discovering

    @property
    def eni_config(self) -> EniConfig | None:
        """The ENIConfig new ENIs follow under custom networking; None without it."""
        return self._eni_config

    def follow_eni_config(self, config: EniConfig, problem: str = "") -> None:
        """Custom networking: the next ENI follows `config` (the node's ENIConfig changed);
        `problem`: why the one the node chose cannot be used ("" once it can), a degraded reason.
        ENIs already made keep theirs; without custom networking it changes nothing."""
        if self._eni_config is None:
            return
        self._eni_config = config
        self.eni_config_problem = problem

    @property
    def security_groups(self) -> tuple[str, ...]:
        """The groups of a new ENI: the ENIConfig's if it names any, else the primary ENI's."""
        config = self._eni_config
        if config is not None and config.security_groups:
            return config.security_groups
        return self._instance.security_groups

    def candidates(self, *, prefixes: bool = False) -> tuple[str, ...]:
        """The subnets a new ENI may go to, best first (empty: none may take one now); those found
        full come last. For prefix growth, the subnets that lately had no /28 to give come last."""
        config = self._eni_config
        if config is not None:
            return (config.subnet_id,)
        if not self.discovering or self._view is None:
            return (self._instance.subnet_id,)
        node, cluster = self._instance.subnet_id, self._cluster_name
        ranked = self._ranked
        if ranked is None:
            ranked = self._ranked = rank_subnets(self._view, node, cluster, self._full)
        if not prefixes:
            return ranked
        avoided = self._avoided()
        return tuple(sorted(ranked, key=lambda subnet_id: subnet_id in avoided))

    def no_prefixes(self, subnet_id: str, for_s: float) -> str | None:
        """`subnet_id` refused a /28: prefix growth avoids it for `for_s`. Returns the subnet a new
        ENI could get prefixes from instead, if there is one."""
        self._no_prefixes[subnet_id] = self._clock.now() + for_s
        avoided = self._avoided()
        return next((c for c in self.candidates() if c not in avoided), None)

    def eni_with_room(
        self,
        state: NodeState,
        skip: Collection[str],
        units_per_eni: int,
        count: int,
        *,
        primary_ok: bool,
    ) -> str | None:
        """An ENI of the inventory with room for `count` more units, in a subnet prefix growth does
        not avoid; none of `skip`, nor the primary unless `primary_ok`."""
        avoided = self._avoided()
        for eni in state.enis().values():
            if eni.eni_id in skip or eni.subnet_id in avoided:
                continue
            if eni.device_index == 0 and not primary_ok:
                continue
            if units_per_eni - len(state.units_on(eni.eni_id)) >= count:
                return eni.eni_id
        return None

    def avoids(self, subnet_id: str) -> bool:
        """Whether prefix growth avoids `subnet_id` now (it lately had no /28 to give)."""
        return subnet_id in self._avoided()

    def _avoided(self) -> frozenset[str]:
        now = self._clock.now()
        return frozenset(s for s, until in self._no_prefixes.items() if now < until)

    def growth_closed(self) -> frozenset[str]:
        """Subnets whose ENIs get no new units: found full while another candidate is not, so new
        ENIs there take over (`ipamd.sizing.subnets.growth_closed`). Empty without discovery."""
        if not self.discovering:
            return frozenset()
        return growth_closed(self._full, self.candidates())

    def refused(self, subnet_id: str, err: SubnetExhausted, asked: int) -> None:
        """An assign of `asked` addresses on an ENI of `subnet_id` failed: out of addresses, the
        subnet is `full`; merely without a free /28 (fragmented, which is no reason to stop growing
        its ENIs by secondary addresses), it is prefix growth's to avoid instead."""
        if not isinstance(err, SubnetFragmented):
            self.full(subnet_id, asked)

    def takes_over(self, err: Exception) -> bool:
        """Whether `err` found a subnet out of addresses while a new ENI may go to another: then
        growth needs no exhaustion cooldown."""
        exhausted = isinstance(err, SubnetExhausted) and not isinstance(err, SubnetFragmented)
        return exhausted and bool(self.growth_closed())

    def without_growth(self, stats: NodeStats, state: NodeState) -> NodeStats:
        """`stats` with the ENIs of the `growth_closed` subnets taking no new units."""
        full = self.growth_closed()
        if not full:
            return stats
        return stop_growth(stats, {e: r.subnet_id for e, r in state.enis().items()}, full)

    def free_addresses(self) -> int | None:
        """Free addresses in the subnets the node draws from (new ENIs' candidates and the node's
        own), as last read; None without a view. Subnet-scarcity mode follows it."""
        view = self._view
        if not self.discovering or view is None:
            return None
        ranked = self.candidates()
        kept = self._free
        if kept is None or kept[0] is not view or kept[1] is not ranked:
            wanted = {*ranked, self._instance.subnet_id}
            kept = self._free = (
                view,
                ranked,
                sum(f.available_ips for f in view if f.subnet_id in wanted),
            )
        return kept[2]

    async def refresh_if_due(self) -> bool:
        """Read the view if it is due; True if it changed what is closed."""
        if not self.discovering or self._clock.now() < self._due:
            return False
        return await self.refresh()

    async def refresh(self) -> bool:
        """Read the node zone's subnets now; True if it changed what is closed. A failure keeps the
        last view (logged, retried after `retry_s` doubled for each earlier failure in a row)."""
        if self._source is None or not self.discovering:
            return False
        now = self._clock.now()
        self._last_read = now
        self.reads += 1
        instance, refresh_s, retry_s = (
            self._instance,
            self._settings.refresh_interval_s,
            self._retry_s,
        )
        try:
            subnets = await self._source.subnets_in(instance.vpc_id, instance.availability_zone)
        except CloudError as err:
            self.failures += 1
            self._failed_in_row += 1
            wait_s = min(retry_s * 2 ** (self._failed_in_row - 1), max(refresh_s, retry_s))
            self._due = now + wait_s
            logger.warning("subnets.read_failed error=%s retry_in_s=%s", err, wait_s)
            return False
        self._failed_in_row = 0
        self._due = now + refresh_s
        self._view = _facts(subnets)
        self.cidrs.update((subnet.subnet_id, subnet.cidr) for subnet in subnets)
        self._full = still_full(self._full, self._view)
        self._ranked = None
        closed = excluded_subnets(self._view, self._cluster_name)
        changed, self.closed = closed != self.closed, closed
        logger.info(
            "subnets.read candidates=%s closed=%s",
            ",".join(self.candidates()) or "none",
            ",".join(sorted(closed)) or "none",
        )
        return changed

    async def create_eni(
        self,
        ec2: Ec2Api,
        description: str,
        tags: Mapping[str, str],
        *,
        kind: Ipv4UnitKind = "ip",
        count: int = 0,
    ) -> NetworkInterface:
        """Create an ENI holding `count` units of `kind` in the best candidate subnet (for
        prefixes, one that lately gave /28s first); one without room is noted full and the next
        one tried, as VPC CNI does. A subnet with addresses but no free /28 gets the bare ENI, whose
        assign then meets the refusal where the pool handles fragmentation (another ENI, the
        fallback). Raises `SubnetExhausted` when none has room (or none may be used)."""
        last = SubnetExhausted("CreateNetworkInterface", "NoSubnetForPods", "no subnet may be used")
        for subnet_id in self.candidates(prefixes=kind == "prefix"):
            asked = count
            while True:
                try:
                    return await ec2.create_eni(
                        subnet_id, self.security_groups, description, tags, kind=kind, count=asked
                    )
                except SubnetExhausted as err:
                    last = err
                    if not (asked and isinstance(err, SubnetFragmented)):
                        break
                    asked = 0
            self.full(subnet_id, count if kind == "ip" and asked else 1)
        raise last

    def full(self, subnet_id: str, asked: int = 1) -> None:
        """A create, or an assign of `asked` addresses on one of its ENIs, found `subnet_id`
        without room: it is full until a view shows `asked` free, and is read again soon (its
        count was stale)."""
        if self.discovering:
            self._full[subnet_id] = max(asked, self._full.get(subnet_id, 0))
            self._ranked = None
            self._due = min(self._due, self._last_read + self._retry_s)
            logger.info("subnets.full subnet_id=%s asked=%d", subnet_id, asked)


def _facts(subnets: Iterable[Subnet]) -> tuple[SubnetFacts, ...]:
    return tuple(SubnetFacts(s.subnet_id, s.available_ips, dict(s.tags)) for s in subnets)
