"""The in-memory view of the node: inventory, owners, delete intents and cooldowns.

It changes only through `apply(mutation)`, called with a mutation that has already committed, so memory
never runs ahead of disk. Reads are plain method calls on the event loop thread: with no `await` inside
`apply`, every read sees either all of a change or none of it. The indexes are private; the query
methods hand out live read-only views (`Mapping`, `KeysView`) or single answers, at the cost of the
dictionary access they wrap.
"""

from __future__ import annotations

import ipaddress
import socket
from collections import OrderedDict, deque
from collections.abc import KeysView, Mapping
from itertools import chain
from types import MappingProxyType

from datastore.records import (
    AllocationKey,
    AllocationRecord,
    CooldownRecord,
    EniRecord,
    Mutation,
    QuarantineRecord,
    ReleasedUnitRecord,
    StateImage,
    UnitKind,
    UnitRecord,
)
from ipamd.model import AddressState

_NO_UNITS: dict[str, None] = {}

IPV6_PREFIX: UnitKind = "ipv6_prefix"
V6_HOSTS = 2**48 - 1
"""Addresses of an IPv6 /80 that ipamd hands out: every one but the prefix's own (::0), from ::1 up."""


def unit_addresses(cidr: str) -> tuple[str, ...]:
    """Every address of a unit: one for a /32, sixteen for a /28 (EC2 lets pods use all of a prefix).

    An IPv6 /80 holds 2^48 addresses and is never enumerated: ValueError."""
    net = ipaddress.ip_network(cidr)
    if net.version == 6:
        raise ValueError(f"{cidr}: an IPv6 prefix's addresses are never enumerated")
    return tuple(str(a) for a in net)


def unit_holds(cidr: str, kind: UnitKind, address: str) -> bool:
    """Whether `address` is one a unit of `kind` at `cidr` hands out (for a /80: any but its ::0),
    written as ipamd writes it (an address has one text, which keys its owner and its cooldown)."""
    if kind != IPV6_PREFIX:
        return address in unit_addresses(cidr)
    return _canonical_in(int(ipaddress.IPv6Network(cidr).network_address), address)


def _canonical_in(base: int, address: str) -> bool:
    at = _offset_from(base, address)
    return at is not None and _v6_text(base + at) == address


def _offset_from(base: int, address: str) -> int | None:
    # inet_pton: a tenth of what ipaddress takes to parse, on ADD's path.
    try:
        at = int.from_bytes(socket.inet_pton(socket.AF_INET6, address), "big") - base
    except OSError:  # not an IPv6 address at all
        return None
    return at if 0 < at <= V6_HOSTS else None


def _v6_text(value: int) -> str:
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

    def __init__(self, cidr: str) -> None:
        self.net = ipaddress.IPv6Network(cidr)
        self.base = int(self.net.network_address)
        self.owned: set[int] = set()

    def address(self, offset: int) -> str:
        return _v6_text(self.base + offset)

    def offset(self, address: str) -> int | None:
        return _offset_from(self.base, address)


class NodeState:
    def __init__(self) -> None:
        self.instance_id: str | None = None
        self.revision = 0
        """Mutations applied to this state: two reads of one state at one revision read the same
        contents (a reader may keep what it derived from them)."""
        self._enis: dict[str, EniRecord] = {}
        self._units: dict[str, UnitRecord] = {}
        self._addresses_of: dict[str, tuple[str, ...]] = {}
        self._units_by_eni: dict[str, dict[str, None]] = {}
        self._released: dict[str, ReleasedUnitRecord] = {}
        self._allocations: dict[AllocationKey, AllocationRecord] = {}
        self._by_container: dict[str, set[AllocationKey]] = {}
        self._owner: dict[str, AllocationKey] = {}
        self._owned_in_unit: dict[str, int] = {}
        self._v6: dict[str, V6Unit] = {}
        """The IPv6 /80s (CIDR → unit), kept apart from `_addresses_of`: empty on an IPv4 node,
        so IPv4's paths pay one test of an empty map at most."""
        # Pruning looks at the oldest entries only, so its cost is O(batch) however many there are:
        # intents keep their first-DEL order in a deque beside the map (entries whose intent was
        # since replaced are skipped and dropped as they reach the front); cooldowns are an
        # insertion-ordered map in which a re-put moves to the back.
        self._intents: dict[str, float] = {}
        self._intent_order: deque[tuple[str, float]] = deque()
        self._cooldowns: OrderedDict[str, float] = OrderedDict()
        self._quarantine: dict[AllocationKey, QuarantineRecord] = {}
        self._held: dict[str, int] = {}
        """Address → how many quarantined claims name it: none of them is handed out or returned
        to EC2 while a claim that may still be live names it (`held`)."""
        # Read-only views of the maps above, made once: a read costs what the dict access did.
        self._enis_view = MappingProxyType(self._enis)
        self._units_view = MappingProxyType(self._units)
        self._released_view = MappingProxyType(self._released)
        self._allocations_view = MappingProxyType(self._allocations)
        self._intents_view = MappingProxyType(self._intents)
        self._cooldowns_view = MappingProxyType(self._cooldowns)
        self._quarantine_view = MappingProxyType(self._quarantine)

    @classmethod
    def from_image(cls, image: StateImage) -> NodeState:
        state = cls()
        state.instance_id = image.instance_id
        state.apply(
            Mutation(
                put_enis=image.enis,
                put_units=image.units,
                put_released=image.released,
                put_allocations=image.allocations,
                put_cooldowns=tuple(sorted(image.cooldowns, key=lambda c: c.released_at)),
                put_quarantine=image.quarantine,
            )
        )
        state._intents.update(image.intents)
        state._intent_order.extend(image.intents.items())
        return state

    # -- applying committed changes ------------------------------------------------------------

    def apply(self, m: Mutation) -> None:
        """Mirror of the datastore's write: deletions first, then insertions, same semantics."""
        for eni_id in m.delete_enis:
            self._enis.pop(eni_id, None)
            self._units_by_eni.pop(eni_id, None)
        for cidr in m.delete_units:
            self._drop_unit(cidr)
        for cidr in m.delete_released:
            self._released.pop(cidr, None)
        for key in m.delete_allocations:
            self._drop_allocation(key)
        for cid in m.delete_intents:
            self._intents.pop(cid, None)
        order = self._intent_order
        while order and self._intents.get(order[0][0]) != order[0][1]:
            order.popleft()
        for address in m.delete_cooldowns:
            self._cooldowns.pop(address, None)
        for key in m.delete_quarantine:
            self._unhold(self._quarantine.pop(key, None))
        self._put(m)
        self.revision += 1

    def _put(self, m: Mutation) -> None:
        if m.instance_id is not None:
            self.instance_id = m.instance_id
        for eni in m.put_enis:
            self._enis[eni.eni_id] = eni
            self._units_by_eni.setdefault(eni.eni_id, {})
        for unit in m.put_units:
            self._put_unit(unit)
        for rel in m.put_released:
            self._released[rel.cidr] = rel
        for alloc in m.put_allocations:
            self._put_allocation(alloc)
        for intent in m.put_intents:
            if intent.container_id not in self._intents:
                self._intents[intent.container_id] = intent.first_del_at
                self._intent_order.append((intent.container_id, intent.first_del_at))
        for cool in m.put_cooldowns:
            self._cooldowns[cool.address] = cool.released_at
            self._cooldowns.move_to_end(cool.address)
        for q in m.put_quarantine:
            self._put_quarantine(q)

    def _put_quarantine(self, q: QuarantineRecord) -> None:
        self._unhold(self._quarantine.get(q.key))
        self._quarantine[q.key] = q
        for address in q.addresses:
            self._held[address] = self._held.get(address, 0) + 1

    def _unhold(self, q: QuarantineRecord | None) -> None:
        for address in q.addresses if q is not None else ():
            left = self._held.get(address, 1) - 1
            if left > 0:
                self._held[address] = left
            else:
                self._held.pop(address, None)

    def _put_unit(self, unit: UnitRecord) -> None:
        previous = self._units.get(unit.cidr)
        if previous is not None and previous.eni_id != unit.eni_id:
            self._units_by_eni.get(previous.eni_id, {}).pop(unit.cidr, None)
        self._units[unit.cidr] = unit
        if unit.kind == IPV6_PREFIX:
            if unit.cidr not in self._v6:
                self._v6[unit.cidr] = V6Unit(unit.cidr)
        elif unit.cidr not in self._addresses_of:
            self._addresses_of[unit.cidr] = unit_addresses(unit.cidr)
        self._units_by_eni.setdefault(unit.eni_id, {})[unit.cidr] = None
        self._owned_in_unit.setdefault(unit.cidr, 0)

    def _drop_unit(self, cidr: str) -> None:
        unit = self._units.pop(cidr, None)
        if unit is not None:
            self._units_by_eni.get(unit.eni_id, {}).pop(cidr, None)
            self._addresses_of.pop(cidr, None)
            v6 = self._v6.get(cidr)
            if v6 is not None and not v6.owned:
                del self._v6[cidr]  # one still owned stays until its owners go, as the counts do

    def _put_allocation(self, alloc: AllocationRecord) -> None:
        self._allocations[alloc.key] = alloc
        self._by_container.setdefault(alloc.key.container_id, set()).add(alloc.key)
        v6 = self._v6
        for address, cidr in zip(alloc.addresses, alloc.unit_cidrs, strict=True):
            self._owner[address] = alloc.key
            self._owned_in_unit[cidr] = self._owned_in_unit.get(cidr, 0) + 1
            if v6 and (unit := v6.get(cidr)) is not None and (at := unit.offset(address)):
                unit.owned.add(at)

    def _drop_allocation(self, key: AllocationKey) -> None:
        alloc = self._allocations.pop(key, None)
        if alloc is None:
            return
        keys = self._by_container.get(key.container_id)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_container[key.container_id]
        v6 = self._v6
        for address, cidr in zip(alloc.addresses, alloc.unit_cidrs, strict=True):
            if self._owner.get(address) == key:
                del self._owner[address]
            self._owned_in_unit[cidr] = self._owned_in_unit.get(cidr, 1) - 1
            if v6 and (unit := v6.get(cidr)) is not None and (at := unit.offset(address)):
                unit.owned.discard(at)
                if not unit.owned and cidr not in self._units:
                    del v6[cidr]

    # -- reading ---------------------------------------------------------------------------------
    # The way in for code outside `ipamd.engine`: read-only views and answers, never the maps.

    def enis(self) -> Mapping[str, EniRecord]:
        """ENI ID → record, a live read-only view."""
        return self._enis_view

    def eni(self, eni_id: str) -> EniRecord | None:
        return self._enis.get(eni_id)

    def units(self) -> Mapping[str, UnitRecord]:
        """CIDR → unit record, a live read-only view, in the order units entered the inventory."""
        return self._units_view

    def unit(self, cidr: str) -> UnitRecord | None:
        return self._units.get(cidr)

    def units_on(self, eni_id: str) -> KeysView[str]:
        """The CIDRs of the units on `eni_id` (none for an unknown ENI), in the order they entered."""
        return self._units_by_eni.get(eni_id, _NO_UNITS).keys()

    def addresses_of(self, cidr: str) -> tuple[str, ...]:
        """Every address of a unit of the inventory (KeyError for a unit it does not hold).

        An IPv6 /80's 2^48 are never listed: for one, the addresses of it in use, owned or with a
        cooldown record (expired or not), lowest first; every other address of it is free."""
        try:
            return self._addresses_of[cidr]
        except KeyError:
            if cidr not in self._units or (v6 := self._v6.get(cidr)) is None:
                raise
        return self._v6_in_use(v6)

    def _v6_in_use(self, v6: V6Unit) -> tuple[str, ...]:
        offsets = set(v6.owned)
        for address in chain(self._cooldowns, self._held):
            if ":" in address and (at := v6.offset(address)) is not None:
                offsets.add(at)
        return tuple(v6.address(at) for at in sorted(offsets))

    def is_v6(self, cidr: str) -> bool:
        """Whether the unit at `cidr` is an IPv6 /80 (whose addresses `addresses_of` does not list)."""
        return cidr in self._v6 and cidr in self._units

    def unit_size(self, cidr: str) -> int:
        """How many addresses the unit hands out: 1, 16, or `V6_HOSTS` for an IPv6 /80."""
        return V6_HOSTS if self.is_v6(cidr) else len(self._addresses_of[cidr])

    def holds(self, cidr: str, address: str) -> bool:
        """Whether `address` is one the inventory's unit at `cidr` hands out (False for no unit)."""
        if (v6 := self._v6.get(cidr)) is not None and cidr in self._units:
            return _canonical_in(v6.base, address)
        return address in self._addresses_of.get(cidr, ())

    def active_unit_of(self, address: str) -> str | None:
        """The active unit that hands out `address` (`holds`), or None: for the rare readers that
        start from an address (repair, rebuild), at the cost of a look at every unit."""
        for cidr, unit in self._units.items():
            if unit.state == "active" and self.holds(cidr, address):
                return cidr
        return None

    def v6_offset(self, cidr: str, address: str) -> int | None:
        """`address`'s host offset in the /80 at `cidr` (None when it is not one of its own)."""
        return self._v6[cidr].offset(address)

    def v6_address(self, cidr: str, offset: int) -> str:
        """The address at host `offset` of the /80 at `cidr`, in the one text ipamd writes."""
        return self._v6[cidr].address(offset)

    def owned_in(self, cidr: str) -> int:
        """How many addresses of the unit are owned by an allocation."""
        return self._owned_in_unit.get(cidr, 0)

    def released(self) -> Mapping[str, ReleasedUnitRecord]:
        """CIDR → units recently returned to EC2 (remembered for the grace window), a live view."""
        return self._released_view

    def released_unit(self, cidr: str) -> ReleasedUnitRecord | None:
        return self._released.get(cidr)

    def allocations(self) -> Mapping[AllocationKey, AllocationRecord]:
        """Key → allocation, a live read-only view."""
        return self._allocations_view

    def allocation(self, key: AllocationKey) -> AllocationRecord | None:
        return self._allocations.get(key)

    def allocations_of(self, container_id: str) -> tuple[AllocationRecord, ...]:
        """Every allocation of the container ID, whatever its network and interface, in (network,
        ifname) order."""
        keys = sorted(self._by_container.get(container_id, ()), key=lambda k: (k.network, k.ifname))
        return tuple(self._allocations[k] for k in keys)

    def owner_of(self, address: str) -> AllocationKey | None:
        return self._owner.get(address)

    def owned_addresses(self) -> KeysView[str]:
        """The addresses owned by an allocation, a live view."""
        return self._owner.keys()

    def intents(self) -> Mapping[str, float]:
        """Container ID → time of its first DEL, a live read-only view."""
        return self._intents_view

    def cooldowns(self) -> Mapping[str, float]:
        """Address → when it was released, a live read-only view, oldest first."""
        return self._cooldowns_view

    def quarantine(self) -> Mapping[AllocationKey, QuarantineRecord]:
        """Claims set aside (at restore, or aws-node's entries a takeover did not adopt), a live
        read-only view."""
        return self._quarantine_view

    def is_held(self, address: str) -> bool:
        """Whether a quarantined claim names `address`: a live pod may hold it, so it is neither
        handed out nor returned to EC2 until the claim goes (its DEL, the leak GC, repair)."""
        return address in self._held

    def is_cooling(self, address: str, now: float, cooldown_s: float) -> bool:
        released_at = self._cooldowns.get(address)
        return released_at is not None and now < released_at + cooldown_s

    def address_state(
        self, address: str, unit: UnitRecord, now: float, cooldown_s: float
    ) -> AddressState | None:
        """The state of one address of `unit`, or None if it is no longer part of the inventory."""
        owned = address in self._owner
        if unit.state == "lost":
            return AddressState.LOST if owned else None
        if owned:
            return AddressState.ASSIGNED
        if unit.state == "releasing":
            return AddressState.RELEASING
        if address in self._held:
            return AddressState.HELD
        if self.is_cooling(address, now, cooldown_s):
            return AddressState.COOLING
        return AddressState.FREE

    def to_image(self) -> StateImage:
        """The records memory holds, in the datastore's own shape, for comparing the two."""
        return StateImage(
            instance_id=self.instance_id,
            enis=tuple(self._enis.values()),
            units=tuple(self._units.values()),
            released=tuple(self._released.values()),
            allocations=tuple(self._allocations.values()),
            intents=dict(self._intents),
            cooldowns=tuple(CooldownRecord(a, t) for a, t in self._cooldowns.items()),
            quarantine=tuple(self._quarantine.values()),
        )
