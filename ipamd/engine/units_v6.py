"""IPv6's unit arithmetic: a /80 whose 2^48 addresses are never listed (docs/architecture.md §3.7).

The engine keeps each /80 as a `V6Unit`: the prefix as a number and the host offsets (address
minus prefix) that allocations own. It answers what `ipamd.engine.units.Listed` answers for an
IPv4 unit (membership, size, ownership, the addresses in use) from those offsets, so the state
never asks which family a unit is.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Collection, Iterable

V6_HOSTS = 2**48 - 1
"""Addresses of an IPv6 /80 that ipamd hands out: every one but the prefix's own (::0), from ::1 up."""


def canonical_in(base: int, address: str) -> bool:
    """Whether `address` is one a /80 at `base` hands out, written as ipamd writes it (an address
    has one text, which keys its owner and its cooldown)."""
    at = offset_from(base, address)
    return at is not None and v6_text(base + at) == address


def offset_from(base: int, address: str) -> int | None:
    """`address`'s host offset in the /80 at `base`, or None when it is not one of its own."""
    # inet_pton: a tenth of what ipaddress takes to parse, on ADD's path.
    try:
        at = int.from_bytes(socket.inet_pton(socket.AF_INET6, address), "big") - base
    except OSError:  # not an IPv6 address at all
        return None
    return at if 0 < at <= V6_HOSTS else None


def v6_text(value: int) -> str:
    """An IPv6 address as ipaddress writes it (RFC 5952). inet_ntop writes the same, ten times
    faster, except in the IPv4-compatible and -mapped ranges (::/96, ::ffff:0:0/96), which it
    writes with a dotted quad: those go through ipaddress."""
    if value >> 32 in (0, 0xFFFF):
        return str(ipaddress.IPv6Address(value))
    return socket.inet_ntop(socket.AF_INET6, value.to_bytes(16, "big"))


class V6Unit:
    """An IPv6 /80 of the inventory: its 2^48 addresses are never listed, only the host offsets
    (address minus the prefix) that allocations own are kept."""

    __slots__ = ("base", "net", "owned")

    addresses: tuple[str, ...] = ()
    """None listed: a pick over listed addresses finds none here."""
    listed = False
    size = V6_HOSTS
    releasable = False
    """Never given back: it holds every pod the node can run."""

    def __init__(self, cidr: str) -> None:
        self.net = ipaddress.IPv6Network(cidr)
        self.base = int(self.net.network_address)
        self.owned: set[int] = set()

    def address(self, offset: int) -> str:
        return v6_text(self.base + offset)

    def offset(self, address: str) -> int | None:
        return offset_from(self.base, address)

    def holds(self, address: str) -> bool:
        return canonical_in(self.base, address)

    def own(self, address: str) -> None:
        if at := self.offset(address):
            self.owned.add(at)

    def disown(self, address: str) -> None:
        if at := self.offset(address):
            self.owned.discard(at)

    def owned_any(self) -> bool:
        """Whether an allocation still owns one of its addresses: the state keeps the unit's
        offsets until its owners go, even once EC2's inventory has dropped it."""
        return bool(self.owned)

    def next_takers(self, adopted: Collection[str], max_pods: int) -> Iterable[str]:
        """Its 2^48 cannot all cool, and need not: the /80 is handed out from ::1 up, the lowest
        free first, and the node holds at most `max_pods`, so no ADD can take an address above the
        highest adopted one plus `max_pods`: every one from ::1 to there (a few hundred)."""
        mine = [at for a in adopted if (at := self.offset(a)) is not None]
        top = min(max(mine, default=0) + max_pods, V6_HOSTS)
        return [self.address(at) for at in range(1, top + 1)]

    def in_use(self, others: Iterable[str]) -> tuple[str, ...]:
        """The addresses in use, lowest first: the owned ones and those of `others` (cooling or
        held addresses of any unit) that are its own."""
        offsets = set(self.owned)
        for address in others:
            if ":" in address and (at := self.offset(address)) is not None:
                offsets.add(at)
        return tuple(self.address(at) for at in sorted(offsets))
