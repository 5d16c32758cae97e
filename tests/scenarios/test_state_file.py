"""S9, S10: a state file that cannot be trusted is refused, not replaced; one that holds untrusted
claims is served with those claims set aside in quarantine.

What each scenario replays, and which tests prove it: docs/failure-scenarios.md."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from datastore.readonly import read_disk
from ipamd.engine.invariants import check_state
from ipamd.errors import StateUnavailable
from tests.support.node import NodeFixture, key


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _garbage(path: Path) -> None:
    path.write_bytes(bytes((i * 7919) % 251 for i in range(8192)))


def _future_version(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version = 99")


def _unknown_version(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version = 0")


def _foreign(path: Path) -> None:
    path.unlink()
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE photos (id INTEGER PRIMARY KEY, data BLOB)")


def _deleted_under_its_log(path: Path) -> None:
    # The main file removed while a write-ahead log with committed changes remains beside it.
    keep = path.with_name("ipamd.db-wal")
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute("INSERT INTO delete_intents VALUES ('late', 1.0)")
    conn.commit()
    copy = keep.read_bytes()
    conn.close()
    path.unlink()
    keep.write_bytes(copy)


def _corrupt_page(path: Path) -> None:
    # Overwrite the middle of a b-tree page: the header stays valid, the integrity check does not.
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    start = page * 3 + 8
    data[start : start + 200] = bytes(range(200))
    path.write_bytes(bytes(data))


BAD_FILES: dict[str, Callable[[Path], None]] = {
    "truncated": _truncate,
    "empty": _empty,
    "garbage": _garbage,
    "future_version": _future_version,
    "unknown_version": _unknown_version,
    "foreign_sqlite": _foreign,
    "corrupt_page": _corrupt_page,
    "deleted_under_its_log": _deleted_under_its_log,
}


@pytest.mark.parametrize("damage", sorted(BAD_FILES))
async def test_s09_bad_state_file_refuses_add_and_names_the_file_and_repair(
    node: NodeFixture, damage: str
) -> None:
    engine = await node.open()
    await node.seed(enis=2, per_eni=10)
    for i in range(12):
        await engine.assign(key(f"pod-{i}"))
    await node.close()  # checkpoints the WAL into the main file
    BAD_FILES[damage](node.path)
    damaged = node.path.read_bytes() if node.path.exists() else None

    engine = await node.open()
    assert engine.unavailable is not None
    with pytest.raises(StateUnavailable) as refused:
        await engine.assign(key("new-pod"))
    message = str(refused.value)
    assert str(node.path) in message and "ipamctl repair" in message
    assert refused.value.code == "state_unavailable"
    with pytest.raises(StateUnavailable):
        await engine.release(key("pod-1"))
    assert not engine.state.owned_addresses(), (
        "nothing is served from a file that cannot be trusted"
    )
    check_state(engine.state, node.clock.now(), 30.0, 600.0)
    await node.close()
    found = node.path.read_bytes() if node.path.exists() else None
    assert found == damaged, "the file is left as found, for repair"


async def _file_with_duplicate_owner(node: NodeFixture) -> tuple[str, str]:
    """A file whose one-owner index was dropped (hand edit, foreign tool) and that then got a second
    claim on an address: X's DEL went missing, Y was later given the same address."""
    engine = await node.open()
    await node.seed(enis=1, per_eni=3)
    x = await engine.assign(key("X"))
    await engine.assign(key("Z"))
    await node.close()
    with sqlite3.connect(node.path) as conn:
        conn.execute("DROP INDEX one_owner_per_address")
        conn.execute(
            "INSERT INTO allocations (network, container_id, ifname, eni_id, created_at,"
            " pod_namespace, pod_name, pod_uid) SELECT network, 'Y', ifname, eni_id,"
            " created_at + 60, '', '', '' FROM allocations WHERE container_id = 'X'"
        )
        conn.execute(
            "INSERT INTO allocation_addresses SELECT (SELECT id FROM allocations WHERE"
            " container_id = 'Y'), position, address, unit_cidr FROM allocation_addresses"
            " WHERE allocation_id = (SELECT id FROM allocations WHERE container_id = 'X')"
        )
    return x.addresses[0], "X"


async def test_s10_duplicate_owner_without_runtime_evidence_keeps_the_newest(
    node: NodeFixture,
) -> None:
    address, _ = await _file_with_duplicate_owner(node)
    engine = await node.open()
    assert engine.unavailable is None, "no crash loop: the node serves"
    assert engine.state.owner_of(address) == key("Y")
    assert [q.key for q in engine.state.quarantine().values()] == [key("X")]
    assert "duplicate owner" in engine.state.quarantine()[key("X")].reason
    assert engine.snapshot().quarantined == 1
    assert key("Z") in engine.state.allocations()
    node.check()  # includes: the one-owner index is back on disk
    assert (await engine.assign(key("W"))).addresses[0] != address


async def test_s10_duplicate_owner_keeps_the_claim_of_the_live_sandbox(node: NodeFixture) -> None:
    address, _ = await _file_with_duplicate_owner(node)
    engine = await node.open(live_containers=frozenset({"X", "Z"}))
    assert engine.state.owner_of(address) == key("X")
    assert set(engine.state.quarantine()) == {key("Y")}
    node.check()
    engine = await node.restart()
    assert set(engine.state.quarantine()) == {key("Y")}, "quarantine is durable"
    assert engine.state.owner_of(address) == key("X")
    node.check()


async def test_s10_unexplained_owner_is_quarantined_not_served(node: NodeFixture) -> None:
    engine = await node.open()
    await node.seed(enis=1, per_eni=2)
    await engine.assign(key("A"))
    await node.close()
    with sqlite3.connect(node.path) as conn:
        conn.execute(
            "UPDATE allocation_addresses SET address = '192.168.77.7', unit_cidr = '192.168.77.7/32'"
        )
    engine = await node.open()
    assert engine.unavailable is None
    assert set(engine.state.quarantine()) == {key("A")}
    assert "unexplained owner" in engine.state.quarantine()[key("A")].reason
    assert engine.state.allocations() == {}
    assert read_disk(node.path).allocations == ()
    node.check()


async def test_s09_a_damaged_file_is_named_in_a_message_short_enough_to_travel(
    node: NodeFixture,
) -> None:
    """The refusal is in /readyz and in every CNI error: a few problems, not kilobytes of them."""
    engine = await node.open()
    await node.seed(enis=4, per_eni=30)
    for i in range(100):
        await engine.assign(key(f"pod-{i}"))
    await node.close()
    # Damage across many pages: SQLite then reports problems kilobytes long (about 9 KB in all).
    data = bytearray(node.path.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    for start in range(page, len(data) - page, 2 * page):
        data[start + 100 : start + 300] = bytes(range(200))
    node.path.write_bytes(bytes(data))
    engine = await node.open()
    assert engine.unavailable is not None
    message = str(engine.unavailable)
    assert "integrity check failed" in message and str(node.path) in message
    assert "ipamctl repair" in message
    assert len(message) < 800, len(message)


async def test_s10_a_del_of_a_quarantined_container_ends_its_quarantine(node: NodeFixture) -> None:
    address, _ = await _file_with_duplicate_owner(node)
    engine = await node.open()
    assert set(engine.state.quarantine()) == {key("X")}
    released = await engine.release(key("X"))
    assert released == (), "a quarantined claim owns nothing"
    assert engine.state.quarantine() == {}
    assert engine.snapshot().quarantined == 0
    assert "X" in engine.state.intents(), "the DEL's intent stands as for any DEL"
    assert engine.state.owner_of(address) == key("Y"), "the served claim is untouched"
    engine = await node.restart()
    assert engine.state.quarantine() == {}, "durable"
    assert await engine.release(key("X")) == ()
    node.check()
