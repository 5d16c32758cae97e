"""The invariants of docs/architecture.md §3.4, as one checker that tests, benchmarks and the chaos
runner share: `check_state` for the engine's memory alone, `check_invariants` for memory against the
state file.

The state file is read through a read-only connection of its own (`datastore.readonly`), so "memory
equals disk" compares two independent readings, not one object with itself. A broken invariant raises
`InvariantBroken` (an `AssertionError`, so a test fails on it as on its own asserts); the checks are
explicit, not `assert` statements, so they hold under `python -O` too. An IPv6 /80 is checked through
the addresses in use in it (`NodeState.addresses_of`), never enumerated. The daemon itself never runs
them: they read every record, which is a checker's job, not a hot path's.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from datastore.readonly import has_unique_owner_index, read_disk
from datastore.records import StateImage
from ipamd.engine.engine import Engine
from ipamd.engine.state import NodeState
from ipamd.model import AddressState


class InvariantBroken(AssertionError):
    """One of the invariants does not hold; the message says which, and where."""


def _require(holds: bool, what: str) -> None:
    if not holds:
        raise InvariantBroken(what)


def normalized(image: StateImage) -> dict[str, object]:
    """A state image as sets and maps, so two readings compare whatever order their records came in."""
    return {
        "instance_id": image.instance_id,
        "enis": set(image.enis),
        "units": set(image.units),
        "released": set(image.released),
        "allocations": set(image.allocations),
        "intents": dict(image.intents),
        "cooldowns": set(image.cooldowns),
        "quarantine": set(image.quarantine),
    }


def check_invariants(engine: Engine, path: Path, now: float) -> None:
    """The engine's memory holds every invariant, and equals what its state file at `path` holds."""
    state = engine.state
    check_state(state, now, engine.settings.cooldown_s, engine.settings.intent_ttl_s)
    disk = read_disk(path)
    # 1 on disk: no address has two owners, and the constraint that guarantees it is present.
    owners_on_disk = Counter(a for alloc in disk.allocations for a in alloc.addresses)
    twice = [a for a, n in owners_on_disk.items() if n > 1]
    _require(not twice, f"addresses with two owners on disk: {twice}")
    _require(has_unique_owner_index(path), "the state file lacks its one-owner-per-address index")
    # 4, 7: memory reflects exactly what committed.
    memory, on_disk = normalized(state.to_image()), normalized(disk)
    differ = {k: (memory[k], on_disk[k]) for k in memory if memory[k] != on_disk[k]}
    _require(not differ, f"memory differs from disk (memory, disk): {differ}")


def check_state(state: NodeState, now: float, cooldown_s: float, intent_ttl_s: float) -> None:
    """The engine's memory holds every invariant: one owner per address, one state per address,
    no allocation under a live delete intent, releasing units empty, counters true to the records."""
    # 1: no address has two owners in memory, and the owner index matches the records.
    claims = Counter(a for alloc in state.allocations().values() for a in alloc.addresses)
    twice = [a for a, n in claims.items() if n > 1]
    _require(not twice, f"addresses with two owners in memory: {twice}")
    by_record = {a: k for k, alloc in state.allocations().items() for a in alloc.addresses}
    by_index = {a: state.owner_of(a) for a in state.owned_addresses()}
    _require(by_record == by_index, "the owner index differs from the allocation records")
    # 2: one state per inventory address; assigned and lost addresses are exactly the owned ones.
    states = {
        address: s
        for cidr, unit in state.units().items()
        for address in state.addresses_of(cidr)
        if (s := state.address_state(address, unit, now, cooldown_s)) is not None
    }
    owned = {a for a, s in states.items() if s in (AddressState.ASSIGNED, AddressState.LOST)}
    _require(owned == set(state.owned_addresses()), "an owned address is not assigned or lost")
    for alloc in state.allocations().values():
        for address, cidr in zip(alloc.addresses, alloc.unit_cidrs, strict=True):
            inside = cidr in state.units() and state.holds(cidr, address)
            _require(inside, f"{address} not in its unit {cidr}")
    # An IPv6 /80's owned addresses (its index of owned host offsets) are its records' addresses.
    for cidr in state.units():
        if state.unlisted(cidr):
            indexed = {a for a in state.addresses_of(cidr) if state.owner_of(a) is not None}
            recorded = {
                a
                for alloc in state.allocations().values()
                for a, c in zip(alloc.addresses, alloc.unit_cidrs, strict=True)
                if c == cidr
            }
            _require(indexed == recorded, f"{cidr}'s owned addresses differ from its records")
    # 3: no allocation for a container with an unexpired delete intent.
    for cid in {k.container_id for k in state.allocations()}:
        first_del = state.intents().get(cid)
        expired = first_del is None or now >= first_del + intent_ttl_s
        _require(expired, f"{cid} has an active intent")
    # 5: a releasing unit holds no assigned or cooling address.
    for cidr, unit in state.units().items():
        if unit.state == "releasing":
            _require(state.owned_in(cidr) == 0, f"releasing unit {cidr} has owners")
            cooling = any(state.is_cooling(a, now, cooldown_s) for a in state.addresses_of(cidr))
            _require(not cooling, f"releasing unit {cidr} has a cooling address")
    # Derived counters agree with the records.
    owned_per_unit = Counter(c for alloc in state.allocations().values() for c in alloc.unit_cidrs)
    for cidr in state.units():
        counted = state.owned_in(cidr)
        _require(counted == owned_per_unit.get(cidr, 0), f"{cidr}'s owner count is {counted}")
