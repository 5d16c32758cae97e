"""The state file itself: schema, version, constraints, durability of one transaction."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from datastore.errors import CommitError, OwnershipConflict
from datastore.records import (
    AllocationKey,
    AllocationRecord,
    EniRecord,
    IntentRecord,
    Mutation,
    UnitRecord,
)
from datastore.schema import APPLICATION_ID, MIGRATIONS, SCHEMA_VERSION
from datastore.store import Store

V6 = "2600:1f14:abc:d00:1234::/80"


def _alloc(cid: str, address: str) -> AllocationRecord:
    return AllocationRecord(
        AllocationKey("net", cid, "eth0"), (address,), (f"{address}/32",), "eni-1", 1.0
    )


def test_new_file_is_marked_versioned_and_in_wal_mode(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "s.db")
    store.close()
    with sqlite3.connect(tmp_path / "s.db") as conn:
        assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_second_owner_of_an_address_is_refused_by_the_constraint(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "s.db")
    store.commit(Mutation(put_allocations=(_alloc("a", "10.0.0.1"),)))
    with pytest.raises(OwnershipConflict):
        store.commit(
            Mutation(
                put_intents=(IntentRecord("z", 1.0),),
                put_allocations=(_alloc("b", "10.0.0.1"),),
            )
        )
    image = store.load()
    assert [a.key.container_id for a in image.allocations] == ["a"]
    assert image.intents == {}, "the whole transaction was rolled back"
    store.close()


def test_first_delete_time_is_never_refreshed(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "s.db")
    store.commit(Mutation(put_intents=(IntentRecord("x", 1.0),)))
    store.commit(Mutation(put_intents=(IntentRecord("x", 99.0),)))
    assert store.load().intents == {"x": 1.0}
    store.close()


def test_a_replaced_state_file_refuses_writes(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = Store.open(path)
    path.rename(tmp_path / "elsewhere.db")
    path.write_bytes(b"")
    with pytest.raises(CommitError):
        store.commit(Mutation(put_intents=(IntentRecord("x", 1.0),)))
    store.close()


def test_reopen_reads_back_exactly_what_was_committed(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "s.db")
    m = Mutation(put_allocations=(_alloc("a", "10.0.0.1"),), put_intents=(IntentRecord("x", 2.0),))
    store.commit(m)
    store.commit(Mutation(instance_id="i-0123456789abcdef0"))
    store.close()
    again = Store.open(tmp_path / "s.db")
    image = again.load()
    assert image.allocations == m.put_allocations and image.intents == {"x": 2.0}
    assert image.instance_id == "i-0123456789abcdef0"
    again.close()


def test_a_version_1_file_is_migrated_and_its_enis_wait_for_their_link_facts(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    with sqlite3.connect(path) as conn:
        for statement in MIGRATIONS[1]:
            conn.execute(statement)
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute("PRAGMA user_version = 1")
        conn.execute("INSERT INTO enis VALUES ('eni-1', 1, 'subnet-1', 0, 5.0)")
    store = Store.open(path)
    try:
        (eni,) = store.load().enis
        assert eni == EniRecord("eni-1", 1, "subnet-1", False, 5.0, mac="", primary_ip="")
        store.commit(
            Mutation(put_enis=(replace(eni, mac="02:00:00:00:00:01", primary_ip="10.0.0.9"),))
        )
        (eni,) = store.load().enis
        assert (eni.mac, eni.primary_ip) == ("02:00:00:00:00:01", "10.0.0.9")
    finally:
        store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4


def test_a_version_2_file_opens_with_its_units_unchanged_and_takes_ipv6_prefixes(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    with sqlite3.connect(path) as conn:
        for statement in (*MIGRATIONS[1], *MIGRATIONS[2]):
            conn.execute(statement)
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute("PRAGMA user_version = 2")
        conn.execute("INSERT INTO enis VALUES ('eni-1', 0, 'subnet-1', 1, 5.0, '', '')")
        conn.execute("INSERT INTO units VALUES ('10.0.0.16/28', 'eni-1', 'prefix', 'active', 6.0)")
        conn.execute("INSERT INTO units VALUES ('10.0.0.9/32', 'eni-1', 'ip', 'lost', 7.0)")
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute(
                f"INSERT INTO units VALUES ('{V6}', 'eni-1', 'ipv6_prefix', 'active', 8.0)"
            )
    store = Store.open(path)
    try:
        assert set(store.load().units) == {
            UnitRecord("10.0.0.16/28", "eni-1", "prefix", "active", 6.0),
            UnitRecord("10.0.0.9/32", "eni-1", "ip", "lost", 7.0),
        }
        unit = UnitRecord(V6, "eni-1", "ipv6_prefix", "active", 8.0)
        pod = AllocationRecord(
            AllocationKey("net", "a", "eth0"), ("2600:1f14:abc:d00:1234::1",), (V6,), "eni-1", 9.0
        )
        store.commit(Mutation(put_units=(unit,), put_allocations=(pod,)))
        image = store.load()
        assert unit in image.units and image.allocations == (pod,)
    finally:
        store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute("INSERT INTO units VALUES ('x', 'eni-1', 'ipv7', 'active', 1.0)")
