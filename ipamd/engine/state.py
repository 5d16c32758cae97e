"""The in-memory view of the node: inventory, owners, delete intents and cooldowns.

It changes only through `apply(mutation)`, called with a mutation that has already committed, so memory
never runs ahead of disk. Reads are plain method calls on the event loop thread: with no `await` inside
`apply`, every read sees either all of a change or none of it. The indexes are private; the query
methods hand out live read-only views (`Mapping`, `KeysView`) or single answers, at the cost of the
dictionary access they wrap.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Collection, Iterable, KeysView, Mapping
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
from ipamd.engine.units import UnitSpace, unit_space
from ipamd.model import AddressState

_NO_UNITS: dict[str, None] = {}

IPV6_PREFIX: UnitKind = "ipv6_prefix"


class NodeState:
    def __init__(self) -> None:
        self.instance_id: str | None = None
        self.revision = 0
        """Mutations applied to this state: two reads of one state at one revision read the same
        contents (a reader may keep what it derived from them)."""
        self._enis: dict[str, EniRecord] = {}
        self._units: dict[str, UnitRecord] = {}
        self._spaces: dict[str, UnitSpace] = {}
        """CIDR → the unit's arithmetic (`ipamd.engine.units`), chosen by its kind as it enters:
        an IPv4 unit's listed addresses, an IPv6 /80's owned offsets. A /80 still owned stays
        after its unit leaves, until its owners go, as the counts do."""
        self._units_by_eni: dict[str, dict[str, None]] = {}
        self._released: dict[str, ReleasedUnitRecord] = {}
        self._allocations: dict[AllocationKey, AllocationRecord] = {}
        self._by_container: dict[str, set[AllocationKey]] = {}
        self._owner: dict[str, AllocationKey] = {}
        self._owned_in_unit: dict[str, int] = {}
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
        if unit.cidr not in self._spaces:
            self._spaces[unit.cidr] = unit_space(unit.kind, unit.cidr)
        self._units_by_eni.setdefault(unit.eni_id, {})[unit.cidr] = None
        self._owned_in_unit.setdefault(unit.cidr, 0)

    def _drop_unit(self, cidr: str) -> None:
        unit = self._units.pop(cidr, None)
        if unit is not None:
            self._units_by_eni.get(unit.eni_id, {}).pop(cidr, None)
            space = self._spaces.get(cidr)
            if space is not None and not space.owned_any():
                del self._spaces[
                    cidr
                ]  # one still owned stays until its owners go, as the counts do

    def _put_allocation(self, alloc: AllocationRecord) -> None:
        self._allocations[alloc.key] = alloc
        self._by_container.setdefault(alloc.key.container_id, set()).add(alloc.key)
        spaces = self._spaces
        for address, cidr in zip(alloc.addresses, alloc.unit_cidrs, strict=True):
            self._owner[address] = alloc.key
            self._owned_in_unit[cidr] = self._owned_in_unit.get(cidr, 0) + 1
            if (space := spaces.get(cidr)) is not None:
                space.own(address)

    def _drop_allocation(self, key: AllocationKey) -> None:
        alloc = self._allocations.pop(key, None)
        if alloc is None:
            return
        keys = self._by_container.get(key.container_id)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_container[key.container_id]
        spaces = self._spaces
        for address, cidr in zip(alloc.addresses, alloc.unit_cidrs, strict=True):
            if self._owner.get(address) == key:
                del self._owner[address]
            self._owned_in_unit[cidr] = self._owned_in_unit.get(cidr, 1) - 1
            if (space := spaces.get(cidr)) is not None:
                space.disown(address)
                if not space.owned_any() and cidr not in self._units:
                    del spaces[cidr]

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
        cooldown record (expired or not) or held, lowest first; every other address of it is
        free (`unlisted`)."""
        if cidr not in self._units:
            raise KeyError(cidr)
        return self._spaces[cidr].in_use(chain(self._cooldowns, self._held))

    def unlisted(self, cidr: str) -> bool:
        """Whether the inventory's unit at `cidr` hands out addresses that `addresses_of` does not
        list (an IPv6 /80: only those in use are); False for no unit."""
        space = self._spaces.get(cidr)
        return space is not None and cidr in self._units and not space.listed

    def releasable(self, cidr: str) -> bool:
        """Whether the pool may give the inventory's unit at `cidr` back to EC2 once it is wholly
        free (never an IPv6 /80); True for no unit, which there is nothing to refuse about."""
        space = self._spaces.get(cidr)
        return space is None or cidr not in self._units or space.releasable

    def unit_size(self, cidr: str) -> int:
        """How many addresses the unit hands out: 1, 16, or `V6_HOSTS` for an IPv6 /80."""
        if cidr not in self._units:
            raise KeyError(cidr)
        return self._spaces[cidr].size

    def holds(self, cidr: str, address: str) -> bool:
        """Whether `address` is one the inventory's unit at `cidr` hands out (False for no unit)."""
        space = self._spaces.get(cidr)
        return space is not None and cidr in self._units and space.holds(address)

    def active_unit_of(self, address: str) -> str | None:
        """The active unit that hands out `address` (`holds`), or None: for the rare readers that
        start from an address (repair, rebuild), at the cost of a look at every unit."""
        for cidr, unit in self._units.items():
            if unit.state == "active" and self.holds(cidr, address):
                return cidr
        return None

    def next_takers(self, cidr: str, adopted: Collection[str], max_pods: int) -> Iterable[str]:
        """The addresses of the unit at `cidr` the next ADDs could take once `adopted` are owned,
        with at most `max_pods` pods on the node (`UnitSpace.next_takers`)."""
        return self._spaces[cidr].next_takers(adopted, max_pods)

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
