"""The engine's unit arithmetic: what a unit of each kind hands out, chosen by the unit's kind
when it enters the state and asked without ever testing the kind again.

- `Listed`: an IPv4 unit, a /32 (one address) or a /28 (sixteen: EC2 lets pods use all of a
  prefix), whose addresses are listed once and scanned by the IPv4 pick.
- `V6Unit` (`ipamd/engine/units_v6.py`): an IPv6 /80, whose addresses are host offsets.

Both answer membership (`holds`), size, ownership (`own`, `disown`, `owned_any`) and the
addresses in use (`in_use`); `NodeState` keeps one per unit (docs/architecture.md §3.7).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Protocol

from datastore.records import UnitKind
from ipamd.engine.units_v6 import V6Unit


def unit_addresses(cidr: str) -> tuple[str, ...]:
    """Every address of an IPv4 unit: one for a /32, sixteen for a /28.

    An IPv6 /80 holds 2^48 addresses and is never enumerated: ValueError."""
    net = ipaddress.ip_network(cidr)
    if net.version != 4:
        raise ValueError(f"{cidr}: an IPv6 prefix's addresses are never enumerated")
    return tuple(str(a) for a in net)


class UnitSpace(Protocol):
    """What the state asks of a unit's addresses, whatever its kind."""

    @property
    def addresses(self) -> tuple[str, ...]:
        """The addresses the unit lists (none for a /80)."""
        ...

    @property
    def listed(self) -> bool:
        """Whether `addresses` is every address the unit hands out."""
        ...

    @property
    def size(self) -> int: ...

    @property
    def releasable(self) -> bool:
        """Whether the pool may give the unit back to EC2 once it is wholly free."""
        ...

    def holds(self, address: str) -> bool: ...

    def own(self, address: str) -> None: ...

    def disown(self, address: str) -> None: ...

    def owned_any(self) -> bool: ...

    def in_use(self, others: Iterable[str]) -> tuple[str, ...]: ...

    def next_takers(self, adopted: Collection[str], max_pods: int) -> Iterable[str]:
        """The addresses the next ADDs could take once `adopted` are owned (a takeover cools
        them): at most `max_pods` pods run on the node."""
        ...


class Listed:
    """An IPv4 unit whose every address is listed."""

    __slots__ = ("addresses",)

    listed = True
    releasable = True

    def __init__(self, cidr: str) -> None:
        self.addresses = unit_addresses(cidr)

    @property
    def size(self) -> int:
        return len(self.addresses)

    def holds(self, address: str) -> bool:
        return address in self.addresses

    def own(self, address: str) -> None:
        """Nothing to keep: the state counts a listed unit's owners itself."""

    def disown(self, address: str) -> None:
        """Nothing to keep: the state counts a listed unit's owners itself."""

    def owned_any(self) -> bool:
        """Never kept past its unit: the state drops it with the unit."""
        return False

    def in_use(self, others: Iterable[str]) -> tuple[str, ...]:
        """Every address, listed: which are in use is the state's to say."""
        return self.addresses

    def next_takers(self, adopted: Collection[str], max_pods: int) -> Iterable[str]:
        """Every address: a pick may take any listed one."""
        return self.addresses


SPACES: Mapping[UnitKind, Callable[[str], UnitSpace]] = {
    "ip": Listed,
    "prefix": Listed,
    "ipv6_prefix": V6Unit,
}
"""Each kind of unit's arithmetic, by the kind the unit's record carries."""


def unit_space(kind: UnitKind, cidr: str) -> UnitSpace:
    return SPACES[kind](cidr)


def unit_holds(cidr: str, kind: UnitKind, address: str) -> bool:
    """Whether `address` is one a unit of `kind` at `cidr` hands out (for a /80: any but its ::0),
    written as ipamd writes it (an address has one text, which keys its owner and its cooldown)."""
    return unit_space(kind, cidr).holds(address)
