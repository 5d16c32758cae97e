"""A reference model of the allocation engine for the stateful property test.

The model keeps what docs/architecture.md §3.4 promises in plain dictionaries: live allocations by
key, the first DEL time of each container's delete intent, when each address was released, and the
units with their states. Every engine operation is a `Step`: it knows how to call the engine,
whether the model expects that call to write (so an injected commit failure must surface), and how
to check an engine outcome against the model and then apply it (`settle`). `settle` raises
`AssertionError` on any mismatch, which is how the test tells a serial outcome from an impossible
one.

It must not look inside the engine's decisions: it predicts outcomes from the contract, and accepts
any choice the contract leaves open (which free address an ADD takes).

An IPv6 /80 (a CIDR with a colon) is never enumerated here either: the model looks only at the
addresses of it that it knows of (owned, or released by a DEL), and counts the rest of its 2^48 as
free while it is active.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Literal, Protocol

from datastore.records import AllocationKey, AllocationRecord, EniRecord, UnitKind, UnitState
from ipamd.engine.engine import Engine
from ipamd.engine.state import NodeState
from ipamd.engine.units import unit_addresses as _unit_addresses
from ipamd.engine.units import unit_holds
from ipamd.engine.units_v6 import V6_HOSTS
from ipamd.errors import DeleteIntentActive, InventoryError, NoAddressAvailable
from ipamd.model import AddressState

AddOutcome = Literal["intent", "existing", "new", "none"]

unit_addresses = cache(_unit_addresses)


def is_v6(cidr: str) -> bool:
    return ":" in cidr


@cache
def in_v6(cidr: str, address: str) -> bool:
    return unit_holds(cidr, "ipv6_prefix", address)


@dataclass(frozen=True, slots=True)
class ModelUnit:
    eni_id: str
    kind: UnitKind
    state: UnitState


@dataclass(slots=True)
class Model:
    cooldown_s: float
    intent_ttl_s: float
    enis: set[str] = field(default_factory=set)
    units: dict[str, ModelUnit] = field(default_factory=dict)
    released_units: set[str] = field(default_factory=set)
    """Units returned to EC2 (finish_release) and not listed again since."""
    allocs: dict[AllocationKey, tuple[str, ...]] = field(default_factory=dict)
    intents: dict[str, float] = field(default_factory=dict)
    """Container ID -> time of the first DEL of its current intent (expired ones may linger)."""
    released_at: dict[str, float] = field(default_factory=dict)
    """Address -> when a DEL last released it."""

    # -- derived views ---------------------------------------------------------------------------

    def owners(self) -> dict[str, AllocationKey]:
        return {a: k for k, addresses in self.allocs.items() for a in addresses}

    def keys_of(self, container_id: str) -> set[AllocationKey]:
        return {k for k in self.allocs if k.container_id == container_id}

    def intent_active(self, container_id: str, now: float) -> bool:
        first_del = self.intents.get(container_id)
        return first_del is not None and now < first_del + self.intent_ttl_s

    def is_cooling(self, address: str, now: float) -> bool:
        at = self.released_at.get(address)
        return at is not None and now < at + self.cooldown_s

    def known_addresses(self, cidr: str) -> Iterable[str]:
        """Every address of an IPv4 unit; those of an IPv6 /80 that are owned or were released."""
        if not is_v6(cidr):
            return unit_addresses(cidr)
        return [a for a in {*self.owners(), *self.released_at} if in_v6(cidr, a)]

    def serves_v6(self) -> bool:
        """Whether an active /80 is in the inventory: then an ADD always finds an address."""
        return any(is_v6(c) and u.state == "active" for c, u in self.units.items())

    def free_by_eni(self, now: float) -> dict[str, set[str]]:
        """Assignable addresses: in an active IPv4 unit, unowned, not cooling (see `serves_v6`)."""
        owners = self.owners()
        free: dict[str, set[str]] = {}
        for cidr, unit in self.units.items():
            if unit.state != "active" or is_v6(cidr):
                continue
            for a in unit_addresses(cidr):
                if a not in owners and not self.is_cooling(a, now):
                    free.setdefault(unit.eni_id, set()).add(a)
        return free

    def address_counts(self, now: float) -> dict[AddressState, int]:
        """The partition of docs/architecture.md §3.4, computed from the model alone."""
        owners = self.owners()
        counts: Counter[AddressState] = Counter()
        for cidr, unit in self.units.items():
            if is_v6(cidr):
                self._count_v6(cidr, unit, owners, counts, now)
                continue
            for a in unit_addresses(cidr):
                if unit.state == "lost":
                    if a in owners:
                        counts[AddressState.LOST] += 1
                elif a in owners:
                    counts[AddressState.ASSIGNED] += 1
                elif unit.state == "releasing":
                    counts[AddressState.RELEASING] += 1
                elif self.is_cooling(a, now):
                    counts[AddressState.COOLING] += 1
                else:
                    counts[AddressState.FREE] += 1
        return {s: counts.get(s, 0) for s in AddressState}

    def _count_v6(
        self,
        cidr: str,
        unit: ModelUnit,
        owners: Mapping[str, AllocationKey],
        counts: Counter[AddressState],
        now: float,
    ) -> None:
        """A /80's share: its owned addresses, its cooling ones, and the rest of its 2^48 free (or
        releasing) as the engine's snapshot counts them with no max pods set."""
        owned = sum(1 for a in owners if in_v6(cidr, a))
        if unit.state == "lost":
            counts[AddressState.LOST] += owned
            return
        counts[AddressState.ASSIGNED] += owned
        if unit.state == "releasing":
            counts[AddressState.RELEASING] += V6_HOSTS - owned
            return
        cooling = sum(
            1
            for a in self.released_at
            if a not in owners and self.is_cooling(a, now) and in_v6(cidr, a)
        )
        counts[AddressState.COOLING] += cooling
        counts[AddressState.FREE] += V6_HOSTS - owned - cooling

    def owned_units(self) -> set[str]:
        owned = set(self.owners())
        return {c for c in self.units if owned.intersection(self.known_addresses(c))}

    # -- changes ---------------------------------------------------------------------------------

    def take(self, key: AllocationKey, record: AllocationRecord, count: int, now: float) -> None:
        """A new allocation the engine made: check it took assignable addresses, then record it."""
        assert record.key == key, record
        assert len(record.addresses) == count == len(set(record.addresses)), record
        free = self.free_by_eni(now).get(record.eni_id, set())
        owners = self.owners()
        v6 = {
            a
            for a, c in zip(record.addresses, record.unit_cidrs, strict=True)
            if is_v6(c) and a not in owners and not self.is_cooling(a, now)
        }
        taken = set(record.addresses) - free - v6
        assert not taken, f"{sorted(taken)} were not assignable on {record.eni_id}"
        for address, cidr in zip(record.addresses, record.unit_cidrs, strict=True):
            unit = self.units.get(cidr)
            assert unit is not None and unit.eni_id == record.eni_id, (cidr, unit)
            if is_v6(cidr):
                assert unit.state == "active" and in_v6(cidr, address), (address, cidr, unit)
            else:
                assert address in unit_addresses(cidr), (address, cidr)
        self.allocs[key] = record.addresses
        for a in record.addresses:
            self.released_at.pop(a, None)

    # -- comparing with the engine -------------------------------------------------------------

    def check(self, engine: Engine, now: float) -> None:
        state: NodeState = engine.state
        assert {k: a.addresses for k, a in state.allocations().items()} == self.allocs
        assert _active(state.intents(), now, self.intent_ttl_s) == _active(
            self.intents, now, self.intent_ttl_s
        ), "delete intents (first DEL times) differ"
        assert _active(state.cooldowns(), now, self.cooldown_s) == _active(
            self.released_at, now, self.cooldown_s
        ), "cooling addresses differ"
        assert {c: ModelUnit(u.eni_id, u.kind, u.state) for c, u in state.units().items()} == (
            self.units
        )
        assert set(state.released()) == self.released_units
        assert set(state.enis()) == self.enis
        assert state.quarantine() == {}
        assert engine.snapshot().counts == self.address_counts(now)


def _active(times: Mapping[str, float], now: float, window_s: float) -> dict[str, float]:
    return {k: t for k, t in times.items() if now < t + window_s}


# -- steps ---------------------------------------------------------------------------------------


class Step(Protocol):
    def call(self, engine: Engine) -> Awaitable[object]: ...

    def writes(self, model: Model, now: float) -> bool:
        """Whether the engine must commit for this step (so an injected fault must surface)."""
        ...

    def settle(self, model: Model, now: float, outcome: object) -> None:
        """Check `outcome` (a value or an `IpamdError`) against the model, then apply it."""
        ...


@dataclass(frozen=True, slots=True)
class Add:
    key: AllocationKey
    count: int = 1

    def call(self, engine: Engine) -> Awaitable[object]:
        return engine.assign(self.key, count=self.count)

    def expect(self, model: Model, now: float) -> AddOutcome:
        if model.intent_active(self.key.container_id, now):
            return "intent"
        if self.key in model.allocs:
            return "existing"
        if any(len(f) >= self.count for f in model.free_by_eni(now).values()):
            return "new"
        if model.serves_v6():
            return "new"
        return "none"

    def writes(self, model: Model, now: float) -> bool:
        return self.expect(model, now) == "new"

    def settle(self, model: Model, now: float, outcome: object) -> None:
        expected = self.expect(model, now)
        if expected == "intent":
            assert isinstance(outcome, DeleteIntentActive), f"expected delete_intent: {outcome!r}"
            first_del = model.intents[self.key.container_id]
            assert outcome.first_del_at == first_del, "the intent's first DEL time moved"
            assert outcome.expires_at == first_del + model.intent_ttl_s
        elif expected == "existing":
            assert isinstance(outcome, AllocationRecord), f"expected the same record: {outcome!r}"
            assert outcome.addresses == model.allocs[self.key], "same key, different address"
        elif expected == "none":
            assert isinstance(outcome, NoAddressAvailable), f"expected no_address: {outcome!r}"
        else:
            assert isinstance(outcome, AllocationRecord), f"expected an allocation: {outcome!r}"
            model.take(self.key, outcome, self.count, now)


@dataclass(frozen=True, slots=True)
class Del:
    key: AllocationKey

    def call(self, engine: Engine) -> Awaitable[object]:
        return engine.release(self.key)

    def writes(self, model: Model, now: float) -> bool:
        cid = self.key.container_id
        return bool(model.keys_of(cid)) or not model.intent_active(cid, now)

    def settle(self, model: Model, now: float, outcome: object) -> None:
        cid = self.key.container_id
        assert isinstance(outcome, tuple), f"DEL must succeed: {outcome!r}"
        released = {r.key: r.addresses for r in outcome if isinstance(r, AllocationRecord)}
        assert len(released) == len(outcome)
        assert released == {k: model.allocs[k] for k in model.keys_of(cid)}, "DEL released"
        for k in released:
            for a in model.allocs.pop(k):
                if model.cooldown_s > 0:
                    model.released_at[a] = now
        if not model.intent_active(cid, now):
            model.intents[cid] = now
        owned = model.owned_units()
        for cidr in [c for c, u in model.units.items() if u.state == "lost" and c not in owned]:
            del model.units[cidr]


@dataclass(frozen=True, slots=True)
class AttachEni:
    eni_id: str
    device_index: int
    at: float

    def call(self, engine: Engine) -> Awaitable[object]:
        record = EniRecord(
            self.eni_id, self.device_index, "subnet-1", self.device_index == 0, self.at
        )
        return engine.add_eni(record)

    def writes(self, model: Model, now: float) -> bool:
        return self.eni_id not in model.enis

    def settle(self, model: Model, now: float, outcome: object) -> None:
        assert outcome is None, outcome
        model.enis.add(self.eni_id)


@dataclass(frozen=True, slots=True)
class AddUnits:
    """EC2 lists these units on the ENI (Describe or the answer to our assign call)."""

    eni_id: str
    cidrs: tuple[str, ...]
    kind: UnitKind

    def call(self, engine: Engine) -> Awaitable[object]:
        return engine.add_units(self.eni_id, self.cidrs, self.kind)

    def _puts(self, model: Model) -> list[str]:
        return [
            c
            for c in dict.fromkeys(self.cidrs)
            if c not in model.units or model.units[c].state == "lost"
        ]

    def writes(self, model: Model, now: float) -> bool:
        return self.eni_id in model.enis and bool(self._puts(model))

    def settle(self, model: Model, now: float, outcome: object) -> None:
        if self.eni_id not in model.enis:
            assert isinstance(outcome, InventoryError), f"unknown ENI accepted: {outcome!r}"
            return
        assert outcome is None, outcome
        for cidr in self._puts(model):
            model.units[cidr] = ModelUnit(self.eni_id, self.kind, "active")
            model.released_units.discard(cidr)


def _units_in(model: Model, cidrs: Iterable[str], state: UnitState) -> list[str]:
    return [c for c in dict.fromkeys(cidrs) if c in model.units and model.units[c].state == state]


def _set_state(model: Model, cidr: str, state: UnitState) -> None:
    unit = model.units[cidr]
    model.units[cidr] = ModelUnit(unit.eni_id, unit.kind, state)


@dataclass(frozen=True, slots=True)
class BeginRelease:
    cidrs: tuple[str, ...]

    def call(self, engine: Engine) -> Awaitable[object]:
        return engine.begin_release(self.cidrs)

    def chosen(self, model: Model, now: float) -> tuple[str, ...]:
        owned = model.owned_units()
        return tuple(
            c
            for c in _units_in(model, self.cidrs, "active")
            if c not in owned
            and not any(model.is_cooling(a, now) for a in model.known_addresses(c))
        )

    def writes(self, model: Model, now: float) -> bool:
        return bool(self.chosen(model, now))

    def settle(self, model: Model, now: float, outcome: object) -> None:
        chosen = self.chosen(model, now)
        assert outcome == chosen, f"begin_release marked {outcome!r}, expected {chosen!r}"
        for cidr in chosen:
            _set_state(model, cidr, "releasing")


@dataclass(frozen=True, slots=True)
class FinishRelease:
    cidrs: tuple[str, ...]

    def call(self, engine: Engine) -> Awaitable[object]:
        return engine.finish_release(self.cidrs)

    def writes(self, model: Model, now: float) -> bool:
        return bool(_units_in(model, self.cidrs, "releasing"))

    def settle(self, model: Model, now: float, outcome: object) -> None:
        assert outcome is None, outcome
        for cidr in _units_in(model, self.cidrs, "releasing"):
            del model.units[cidr]
            model.released_units.add(cidr)


@dataclass(frozen=True, slots=True)
class AbortRelease:
    cidrs: tuple[str, ...]

    def call(self, engine: Engine) -> Awaitable[object]:
        return engine.abort_release(self.cidrs)

    def writes(self, model: Model, now: float) -> bool:
        return bool(_units_in(model, self.cidrs, "releasing"))

    def settle(self, model: Model, now: float, outcome: object) -> None:
        assert outcome is None, outcome
        for cidr in _units_in(model, self.cidrs, "releasing"):
            _set_state(model, cidr, "active")


@dataclass(frozen=True, slots=True)
class UnitsGone:
    """EC2 no longer lists these units: unowned ones leave, owned ones become lost (never free)."""

    cidrs: tuple[str, ...]

    def call(self, engine: Engine) -> Awaitable[object]:
        return engine.units_gone(self.cidrs)

    def _affected(self, model: Model) -> list[str]:
        return [
            c
            for c in dict.fromkeys(self.cidrs)
            if c in model.units and model.units[c].state != "lost"
        ]

    def writes(self, model: Model, now: float) -> bool:
        return bool(self._affected(model))

    def settle(self, model: Model, now: float, outcome: object) -> None:
        assert outcome is None, outcome
        owned = model.owned_units()
        for cidr in self._affected(model):
            if cidr in owned:
                _set_state(model, cidr, "lost")
            else:
                del model.units[cidr]
