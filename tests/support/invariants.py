"""The invariants of docs/architecture.md §3.4, checked after every scenario by this one helper.

It reads the state file through its own read-only connection, so "memory equals disk" compares two
independent readings, not one object with itself.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from pathlib import Path

from datastore import codec
from datastore.records import StateImage
from ipamd.engine.engine import Engine
from ipamd.engine.state import NodeState
from ipamd.model import AddressState


def read_disk(path: Path) -> StateImage:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return codec.load_image(conn)
    finally:
        conn.close()


def normalized(image: StateImage) -> dict[str, object]:
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
    state = engine.state
    check_state(state, now, engine.settings.cooldown_s, engine.settings.intent_ttl_s)
    disk = read_disk(path)
    # 1 on disk: no address has two owners, and the constraint that guarantees it is present.
    owners_on_disk = Counter(a for alloc in disk.allocations for a in alloc.addresses)
    assert [a for a, n in owners_on_disk.items() if n > 1] == []
    assert has_unique_owner_index(path)
    # 4, 7: memory reflects exactly what committed.
    assert normalized(state.to_image()) == normalized(disk)


def check_state(state: NodeState, now: float, cooldown_s: float, intent_ttl_s: float) -> None:
    # 1: no address has two owners in memory, and the owner index matches the records.
    claims = Counter(a for alloc in state.allocations().values() for a in alloc.addresses)
    assert [a for a, n in claims.items() if n > 1] == []
    assert {a: k for k, alloc in state.allocations().items() for a in alloc.addresses} == {
        a: state.owner_of(a) for a in state.owned_addresses()
    }
    # 2: one state per inventory address; assigned and lost addresses are exactly the owned ones.
    states = {
        address: s
        for cidr, unit in state.units().items()
        for address in state.addresses_of(cidr)
        if (s := state.address_state(address, unit, now, cooldown_s)) is not None
    }
    owned_states = {
        a: s for a, s in states.items() if s in (AddressState.ASSIGNED, AddressState.LOST)
    }
    assert set(owned_states) == set(state.owned_addresses()), (
        "every owned address is assigned or lost"
    )
    for alloc in state.allocations().values():
        for address, cidr in zip(alloc.addresses, alloc.unit_cidrs, strict=True):
            assert cidr in state.units() and address in state.addresses_of(cidr), (
                f"{address} not in its unit {cidr}"
            )
    # 3: no allocation for a container with an unexpired delete intent.
    for cid in {k.container_id for k in state.allocations()}:
        first_del = state.intents().get(cid)
        assert first_del is None or now >= first_del + intent_ttl_s, f"{cid} has an active intent"
    # 5: a releasing unit holds no assigned or cooling address.
    for cidr, unit in state.units().items():
        if unit.state == "releasing":
            assert state.owned_in(cidr) == 0
            assert not any(state.is_cooling(a, now, cooldown_s) for a in state.addresses_of(cidr))
    # Derived counters agree with the records.
    owned_per_unit = Counter(c for alloc in state.allocations().values() for c in alloc.unit_cidrs)
    for cidr in state.units():
        assert state.owned_in(cidr) == owned_per_unit.get(cidr, 0)


def has_unique_owner_index(path: Path) -> bool:
    """Whether the state file still carries the UNIQUE index that makes two owners impossible."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        row = conn.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'index' AND name = 'one_owner_per_address'"
        ).fetchone()
        return row is not None and "UNIQUE" in row[0].upper()
    finally:
        conn.close()
