"""Rows to records and records to rows: the only place that knows the tables' column layout."""

from __future__ import annotations

import sqlite3
from collections import defaultdict
from typing import cast

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
    UnitState,
)

_KEY = "network = ? AND container_id = ? AND ifname = ?"


def _key(key: AllocationKey) -> tuple[str, str, str]:
    return (key.network, key.container_id, key.ifname)


def write_mutation(conn: sqlite3.Connection, m: Mutation) -> None:
    """Execute every statement of `m` inside the caller's open transaction (deletions first)."""
    ex = conn.executemany
    ex("DELETE FROM enis WHERE eni_id = ?", [(e,) for e in m.delete_enis])
    ex("DELETE FROM units WHERE cidr = ?", [(c,) for c in m.delete_units])
    ex("DELETE FROM released_units WHERE cidr = ?", [(c,) for c in m.delete_released])
    ex(f"DELETE FROM allocations WHERE {_KEY}", [_key(k) for k in m.delete_allocations])
    ex("DELETE FROM delete_intents WHERE container_id = ?", [(c,) for c in m.delete_intents])
    ex("DELETE FROM cooldowns WHERE address = ?", [(a,) for a in m.delete_cooldowns])
    ex(f"DELETE FROM quarantine WHERE {_KEY}", [_key(k) for k in m.delete_quarantine])
    ex(
        "INSERT OR REPLACE INTO enis (eni_id, device_index, subnet_id, is_primary, added_at, mac,"
        " primary_ip) VALUES (?, ?, ?, ?, ?, ?, ?)",
        [
            (
                e.eni_id,
                e.device_index,
                e.subnet_id,
                int(e.is_primary),
                e.added_at,
                e.mac,
                e.primary_ip,
            )
            for e in m.put_enis
        ],
    )
    ex(
        "INSERT OR REPLACE INTO units VALUES (?, ?, ?, ?, ?)",
        [(u.cidr, u.eni_id, u.kind, u.state, u.changed_at) for u in m.put_units],
    )
    ex(
        "INSERT OR REPLACE INTO released_units VALUES (?, ?, ?)",
        [(r.cidr, r.eni_id, r.released_at) for r in m.put_released],
    )
    for alloc in m.put_allocations:
        _insert_allocation(conn, alloc)
    # A delete intent keeps the time of the first DEL: a repeated DEL must not extend it.
    ex(
        "INSERT OR IGNORE INTO delete_intents VALUES (?, ?)",
        [(i.container_id, i.first_del_at) for i in m.put_intents],
    )
    ex(
        "INSERT OR REPLACE INTO cooldowns VALUES (?, ?)",
        [(c.address, c.released_at) for c in m.put_cooldowns],
    )
    if m.instance_id is not None:
        conn.execute(
            "INSERT OR REPLACE INTO meta (key, value) VALUES ('instance_id', ?)", (m.instance_id,)
        )
    ex(
        "INSERT OR REPLACE INTO quarantine VALUES (?, ?, ?, ?, ?, ?)",
        [
            (*_key(q.key), ",".join(q.addresses), q.reason, q.quarantined_at)
            for q in m.put_quarantine
        ],
    )


def _insert_allocation(conn: sqlite3.Connection, a: AllocationRecord) -> None:
    # Plain INSERT: an existing key is a conflict, never silently replaced.
    cur = conn.execute(
        "INSERT INTO allocations (network, container_id, ifname, eni_id, created_at,"
        " pod_namespace, pod_name, pod_uid, stamp_ns) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            *_key(a.key),
            a.eni_id,
            a.created_at,
            a.pod_namespace,
            a.pod_name,
            a.pod_uid,
            a.stamp_ns,
        ),
    )
    conn.executemany(
        "INSERT INTO allocation_addresses VALUES (?, ?, ?, ?)",
        [
            (cur.lastrowid, pos, addr, unit)
            for pos, (addr, unit) in enumerate(zip(a.addresses, a.unit_cidrs, strict=True))
        ],
    )


def load_image(conn: sqlite3.Connection) -> StateImage:
    meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    return StateImage(
        instance_id=meta.get("instance_id"),
        enis=tuple(
            EniRecord(eni_id, index, subnet, bool(primary), added, mac, primary_ip)
            for eni_id, index, subnet, primary, added, mac, primary_ip in conn.execute(
                "SELECT eni_id, device_index, subnet_id, is_primary, added_at, mac, primary_ip"
                " FROM enis ORDER BY device_index, eni_id"
            )
        ),
        units=tuple(
            UnitRecord(cidr, eni, cast(UnitKind, kind), cast(UnitState, state), changed)
            for cidr, eni, kind, state, changed in conn.execute("SELECT * FROM units ORDER BY cidr")
        ),
        released=tuple(
            ReleasedUnitRecord(*row) for row in conn.execute("SELECT * FROM released_units")
        ),
        allocations=_load_allocations(conn),
        # NOT INDEXED: read the table itself, whose every page the full check at open covers.
        intents=dict(
            conn.execute(
                "SELECT container_id, first_del_at FROM delete_intents NOT INDEXED"
                " ORDER BY first_del_at"
            )
        ),
        cooldowns=tuple(CooldownRecord(*row) for row in conn.execute("SELECT * FROM cooldowns")),
        quarantine=tuple(
            QuarantineRecord(
                AllocationKey(net, cid, ifn), tuple(a for a in addrs.split(",") if a), reason, at
            )
            for net, cid, ifn, addrs, reason, at in conn.execute("SELECT * FROM quarantine")
        ),
    )


def _load_allocations(conn: sqlite3.Connection) -> tuple[AllocationRecord, ...]:
    owned: dict[int, list[tuple[str, str]]] = defaultdict(list)
    for alloc_id, _pos, address, unit in conn.execute(
        "SELECT * FROM allocation_addresses ORDER BY allocation_id, position"
    ):
        owned[alloc_id].append((address, unit))
    records = []
    for row in conn.execute(
        "SELECT id, network, container_id, ifname, eni_id, created_at, pod_namespace, pod_name,"
        " pod_uid, stamp_ns FROM allocations ORDER BY id"
    ):
        alloc_id, net, cid, ifname, eni, created, ns, name, uid, stamp_ns = row
        pairs = owned.get(alloc_id, [])
        records.append(
            AllocationRecord(
                key=AllocationKey(net, cid, ifname),
                addresses=tuple(p[0] for p in pairs),
                unit_cidrs=tuple(p[1] for p in pairs),
                eni_id=eni,
                created_at=created,
                pod_namespace=ns,
                pod_name=name,
                pod_uid=uid,
                stamp_ns=stamp_ns,
            )
        )
    return tuple(records)
