"""The node's address family, decided once from the settings (ENABLE_IPv6; the configuration's
rules leave exactly one family on), and what the composition gives each part for it
(docs/architecture.md §1.1): the engine's pick and address capacity, the kinds of unit the node
holds, its pool, the datapath's IPv4 egress range, the conflist's egress data directory, and what
the daemon's reports say. The composition asks its family; it does not test which one it is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from datastore.records import UnitKind
from ipamd.api.views import IPV6_POD_ROUTES, PodRoutes
from ipamd.config.settings import Config
from ipamd.engine.allocator import Pick
from ipamd.engine.pick_v6 import pick_v6_addresses
from ipamd.engine.state import IPV6_PREFIX
from ipamd.hostnet.snat_modes import EGRESS_SNAT, VPC_SNAT, SnatMode
from ipamd.pool.ipv6 import Ipv6Pool
from ipamd.pool.manager import PoolManager
from ipamd.sizing.max_pods import AddressFamily, address_family
from ipamd.wire.pod import V4_EGRESS_DIR

PoolKind = type[PoolManager] | type[Ipv6Pool]
"""A family's pool, built with the same arguments (`ipamd.node.engine_parts.open_parts`)."""

InForce = dict[str, object]
"""The report's `in_force`: the pool's goal, the targets it follows, those it ignores and why."""


@dataclass(frozen=True)
class Ipv4:
    """Pods take addresses of the VPC's IPv4 units (secondary IPs or /28s) on any ENI."""

    name: AddressFamily = "ipv4"
    pick: Pick | None = None
    """The engine's own pick over listed units."""
    pool: PoolKind = PoolManager
    snat: SnatMode = VPC_SNAT
    """Pods' IPv4 traffic is their own: marked and SNATed out of the VPC per the settings."""
    hostnet_off_lacks: str = "sending from secondary ENIs"
    makes_enis: bool = True
    """The pool makes secondary ENIs, so ENI GC has leaked ones to look for."""
    imds_ipv6_prefixes: bool = False
    """Whether the IMDS hint reads each interface's IPv6 prefixes too."""

    def in_force(self, targets: Callable[[], InForce]) -> InForce:
        """Which warm targets the pool follows: `targets()`, as the mode and settings say."""
        return targets()

    def unit_kinds(self, mode_kinds: tuple[UnitKind, ...]) -> tuple[UnitKind, ...]:
        """The mode's (its strategy's kind, then its fallback's)."""
        return mode_kinds

    def address_capacity(self, max_pods: int | None, enis_hold: int | None) -> int | None:
        """What the node's ENIs can hold, full."""
        return enis_hold

    def egress_dir(self, socket_dir: Path) -> str | None:
        """No egress interface, so no data directory for it."""
        return None

    def pool_mode(self, strategy_kind: str) -> str:
        return strategy_kind

    def target_bounds(self, bounds: list[int]) -> list[int]:
        """The limits a warm target is checked against: max pods and the ENIs' capacity."""
        return bounds

    def pod_routes(self, gateway: str) -> PodRoutes:
        """Each pod a /32 behind `gateway`, the node's own address."""
        return PodRoutes(gateway)


@dataclass(frozen=True)
class Ipv6:
    """Pods take /128s of one /80 on the primary ENI, and an IPv4 egress of their own."""

    name: AddressFamily = "ipv6"
    pick: Pick | None = pick_v6_addresses
    pool: PoolKind = Ipv6Pool
    snat: SnatMode = EGRESS_SNAT
    """The pods' IPv4 egress range alone, SNATed to the node's IPv4 address."""
    hostnet_off_lacks: str = "IPv4 egress"
    makes_enis: bool = False
    """The /80 is on the primary ENI: no ENI is made, so none can leak (VPC CNI runs no ENI GC)."""
    imds_ipv6_prefixes: bool = True
    """The IMDS hint compares the primary interface's /80 (`ipv6-prefix`) with the state's."""

    def in_force(self, targets: Callable[[], InForce]) -> InForce:
        """None of the warm targets: the /80 follows none."""
        return {"goal": "ipv6", "targets": [], "ignored": {}}

    def unit_kinds(self, mode_kinds: tuple[UnitKind, ...]) -> tuple[UnitKind, ...]:
        """The /80 alone, whatever the mode."""
        return (IPV6_PREFIX,)

    def address_capacity(self, max_pods: int | None, enis_hold: int | None) -> int | None:
        """One /80 holds far more than max pods, which is then the one limit."""
        return max_pods

    def egress_dir(self, socket_dir: Path) -> str | None:
        """host-local's data directory for the pods' egress addresses, beside the socket."""
        return str(socket_dir / V4_EGRESS_DIR)

    def pool_mode(self, strategy_kind: str) -> str:
        """The /80 follows none of the mode's targets."""
        return "ipv6"

    def target_bounds(self, bounds: list[int]) -> list[int]:
        """None: the warm targets do nothing here, so none is out of reach."""
        return []

    def pod_routes(self, gateway: str) -> PodRoutes:
        """Each pod a /128 behind the host veth's link-local gateway, whatever the node's address."""
        return IPV6_POD_ROUTES


Family = Ipv4 | Ipv6

FAMILIES: Mapping[AddressFamily, Family] = {"ipv4": Ipv4(), "ipv6": Ipv6()}


def family_of(config: Config) -> Family:
    """The family the settings choose."""
    return FAMILIES[address_family(config.family.enable_ipv6)]
