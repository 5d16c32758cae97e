"""The in-memory view of the node: inventory, owners, delete intents and cooldowns.

It changes only through `apply(mutation)`, called with a mutation that has already committed, so memory
never runs ahead of disk. Reads are plain method calls on the event loop thread: with no `await` inside
`apply`, every read sees either all of a change or none of it.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict, deque
from collections.abc import Iterator

from datastore.records import (
    AllocationKey,
    AllocationRecord,
    CooldownRecord,
    EniRecord,
    Mutation,
    QuarantineRecord,
    ReleasedUnitRecord,
    StateImage,
    UnitRecord,
)
from ipamd.model import AddressState


def unit_addresses(cidr: str) -> tuple[str, ...]:
    """Every address of a unit: one for a /32, sixteen for a /28 (EC2 lets pods use all of a prefix)."""
    net = ipaddress.ip_network(cidr)
    return tuple(str(a) for a in net)


class NodeState:
    def __init__(self) -> None:
        self.instance_id: str | None = None
        self.enis: dict[str, EniRecord] = {}
        self.units: dict[str, UnitRecord] = {}
        self.addresses_of: dict[str, tuple[str, ...]] = {}
        self.units_by_eni: dict[str, dict[str, None]] = {}
        self.released: dict[str, ReleasedUnitRecord] = {}
        self.allocations: dict[AllocationKey, AllocationRecord] = {}
        self.by_container: dict[str, set[AllocationKey]] = {}
        self.owner: dict[str, AllocationKey] = {}
        self.owned_in_unit: dict[str, int] = {}
        # Pruning looks at the oldest entries only, so its cost is O(batch) however many there are:
        # intents keep their first-DEL order in a deque beside the map (entries whose intent was
        # since replaced are skipped and dropped as they reach the front); cooldowns are an
        # insertion-ordered map in which a re-put moves to the back.
        self.intents: dict[str, float] = {}
        self.intent_order: deque[tuple[str, float]] = deque()
        self.cooldowns: OrderedDict[str, float] = OrderedDict()
        self.quarantine: dict[AllocationKey, QuarantineRecord] = {}

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
        state.intents = dict(image.intents)
        state.intent_order = deque(image.intents.items())
        return state

    # -- applying committed changes ------------------------------------------------------------

    def apply(self, m: Mutation) -> None:
        """Mirror of the datastore's write: deletions first, then insertions, same semantics."""
        for eni_id in m.delete_enis:
            self.enis.pop(eni_id, None)
            self.units_by_eni.pop(eni_id, None)
        for cidr in m.delete_units:
            self._drop_unit(cidr)
        for cidr in m.delete_released:
            self.released.pop(cidr, None)
        for key in m.delete_allocations:
            self._drop_allocation(key)
        for cid in m.delete_intents:
            self.intents.pop(cid, None)
        order = self.intent_order
        while order and self.intents.get(order[0][0]) != order[0][1]:
            order.popleft()
        for address in m.delete_cooldowns:
            self.cooldowns.pop(address, None)
        for key in m.delete_quarantine:
            self.quarantine.pop(key, None)
        self._put(m)

    def _put(self, m: Mutation) -> None:
        if m.instance_id is not None:
            self.instance_id = m.instance_id
        for eni in m.put_enis:
            self.enis[eni.eni_id] = eni
            self.units_by_eni.setdefault(eni.eni_id, {})
        for unit in m.put_units:
            self._put_unit(unit)
        for rel in m.put_released:
            self.released[rel.cidr] = rel
        for alloc in m.put_allocations:
            self._put_allocation(alloc)
        for intent in m.put_intents:
            if intent.container_id not in self.intents:
                self.intents[intent.container_id] = intent.first_del_at
                self.intent_order.append((intent.container_id, intent.first_del_at))
        for cool in m.put_cooldowns:
            self.cooldowns[cool.address] = cool.released_at
            self.cooldowns.move_to_end(cool.address)
        for q in m.put_quarantine:
            self.quarantine[q.key] = q

    def _put_unit(self, unit: UnitRecord) -> None:
        previous = self.units.get(unit.cidr)
        if previous is not None and previous.eni_id != unit.eni_id:
            self.units_by_eni.get(previous.eni_id, {}).pop(unit.cidr, None)
        self.units[unit.cidr] = unit
        if unit.cidr not in self.addresses_of:
            self.addresses_of[unit.cidr] = unit_addresses(unit.cidr)
        self.units_by_eni.setdefault(unit.eni_id, {})[unit.cidr] = None
        self.owned_in_unit.setdefault(unit.cidr, 0)

    def _drop_unit(self, cidr: str) -> None:
        unit = self.units.pop(cidr, None)
        if unit is not None:
            self.units_by_eni.get(unit.eni_id, {}).pop(cidr, None)
            self.addresses_of.pop(cidr, None)

    def _put_allocation(self, alloc: AllocationRecord) -> None:
        self.allocations[alloc.key] = alloc
        self.by_container.setdefault(alloc.key.container_id, set()).add(alloc.key)
        for address, cidr in zip(alloc.addresses, alloc.unit_cidrs, strict=True):
            self.owner[address] = alloc.key
            self.owned_in_unit[cidr] = self.owned_in_unit.get(cidr, 0) + 1

    def _drop_allocation(self, key: AllocationKey) -> None:
        alloc = self.allocations.pop(key, None)
        if alloc is None:
            return
        keys = self.by_container.get(key.container_id)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self.by_container[key.container_id]
        for address, cidr in zip(alloc.addresses, alloc.unit_cidrs, strict=True):
            if self.owner.get(address) == key:
                del self.owner[address]
            self.owned_in_unit[cidr] = self.owned_in_unit.get(cidr, 1) - 1

    # -- reading ---------------------------------------------------------------------------------

    def is_cooling(self, address: str, now: float, cooldown_s: float) -> bool:
        released_at = self.cooldowns.get(address)
        return released_at is not None and now < released_at + cooldown_s

    def address_state(
        self, address: str, unit: UnitRecord, now: float, cooldown_s: float
    ) -> AddressState | None:
        """The state of one address of `unit`, or None if it is no longer part of the inventory."""
        owned = address in self.owner
        if unit.state == "lost":
            return AddressState.LOST if owned else None
        if owned:
            return AddressState.ASSIGNED
        if unit.state == "releasing":
            return AddressState.RELEASING
        if self.is_cooling(address, now, cooldown_s):
            return AddressState.COOLING
        return AddressState.FREE

    def iter_address_states(
        self, now: float, cooldown_s: float
    ) -> Iterator[tuple[UnitRecord, str, AddressState]]:
        for cidr, unit in self.units.items():
            for address in self.addresses_of[cidr]:
                state = self.address_state(address, unit, now, cooldown_s)
                if state is not None:
                    yield unit, address, state

    def to_image(self) -> StateImage:
        """The records memory holds, in the datastore's own shape, for comparing the two."""
        return StateImage(
            instance_id=self.instance_id,
            enis=tuple(self.enis.values()),
            units=tuple(self.units.values()),
            released=tuple(self.released.values()),
            allocations=tuple(self.allocations.values()),
            intents=dict(self.intents),
            cooldowns=tuple(CooldownRecord(a, t) for a, t in self.cooldowns.items()),
            quarantine=tuple(self.quarantine.values()),
        )
