"""The state file's schema and its migrations.

The schema version lives in `PRAGMA user_version`; `PRAGMA application_id` marks the file as ipamd's so a
foreign SQLite file is refused rather than written into. Migration N turns version N-1 into version N;
a file whose version is newer than `SCHEMA_VERSION` was written by a newer ipamd and is refused.
"""

from __future__ import annotations

APPLICATION_ID = 0x69706D64  # "ipmd"
SCHEMA_VERSION = 4

_V1 = (
    """CREATE TABLE meta (
        key   TEXT PRIMARY KEY,
        value TEXT NOT NULL
    ) STRICT""",
    """CREATE TABLE enis (
        eni_id       TEXT PRIMARY KEY,
        device_index INTEGER NOT NULL,
        subnet_id    TEXT NOT NULL,
        is_primary   INTEGER NOT NULL CHECK (is_primary IN (0, 1)),
        added_at     REAL NOT NULL
    ) STRICT""",
    """CREATE TABLE units (
        cidr       TEXT PRIMARY KEY,
        eni_id     TEXT NOT NULL,
        kind       TEXT NOT NULL CHECK (kind IN ('ip', 'prefix')),
        state      TEXT NOT NULL CHECK (state IN ('active', 'releasing', 'lost')),
        changed_at REAL NOT NULL
    ) STRICT""",
    """CREATE TABLE released_units (
        cidr        TEXT PRIMARY KEY,
        eni_id      TEXT NOT NULL,
        released_at REAL NOT NULL
    ) STRICT""",
    """CREATE TABLE allocations (
        id            INTEGER PRIMARY KEY,
        network       TEXT NOT NULL,
        container_id  TEXT NOT NULL,
        ifname        TEXT NOT NULL,
        eni_id        TEXT NOT NULL,
        created_at    REAL NOT NULL,
        pod_namespace TEXT NOT NULL,
        pod_name      TEXT NOT NULL,
        pod_uid       TEXT NOT NULL,
        UNIQUE (network, container_id, ifname)
    ) STRICT""",
    "CREATE INDEX allocations_by_container ON allocations (container_id)",
    # One row per owned address. The UNIQUE index on `address` is what makes two owners of one
    # address impossible on disk: a second claim fails the transaction instead of being written.
    """CREATE TABLE allocation_addresses (
        allocation_id INTEGER NOT NULL REFERENCES allocations (id) ON DELETE CASCADE,
        position      INTEGER NOT NULL,
        address       TEXT NOT NULL,
        unit_cidr     TEXT NOT NULL,
        PRIMARY KEY (allocation_id, position)
    ) STRICT""",
    "CREATE UNIQUE INDEX one_owner_per_address ON allocation_addresses (address)",
    # WITHOUT ROWID: the table is its own key index, and the by-age index then carries the key too,
    # so pruning and the ordered load at start read one b-tree, not two.
    """CREATE TABLE delete_intents (
        container_id TEXT PRIMARY KEY,
        first_del_at REAL NOT NULL
    ) STRICT, WITHOUT ROWID""",
    "CREATE INDEX delete_intents_by_age ON delete_intents (first_del_at)",
    """CREATE TABLE cooldowns (
        address     TEXT PRIMARY KEY,
        released_at REAL NOT NULL
    ) STRICT, WITHOUT ROWID""",
    "CREATE INDEX cooldowns_by_age ON cooldowns (released_at)",
    """CREATE TABLE quarantine (
        network        TEXT NOT NULL,
        container_id   TEXT NOT NULL,
        ifname         TEXT NOT NULL,
        addresses      TEXT NOT NULL,
        reason         TEXT NOT NULL,
        quarantined_at REAL NOT NULL,
        PRIMARY KEY (network, container_id, ifname)
    ) STRICT""",
)

# Version 2: what the host side of an ENI is made of (its link is found by MAC; its primary address
# goes on that link and selects its route table). Rows of version 1 get "" and are filled in by the
# next EC2 reconcile, before host networking needs them.
_V2 = (
    "ALTER TABLE enis ADD COLUMN mac TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE enis ADD COLUMN primary_ip TEXT NOT NULL DEFAULT ''",
)

# Version 3: a unit may be an IPv6 /80 prefix. SQLite cannot change a CHECK constraint in place, so
# the units table is built anew with the wider one and its rows copied across, unchanged.
_V3 = (
    """CREATE TABLE units_v3 (
        cidr       TEXT PRIMARY KEY,
        eni_id     TEXT NOT NULL,
        kind       TEXT NOT NULL CHECK (kind IN ('ip', 'prefix', 'ipv6_prefix')),
        state      TEXT NOT NULL CHECK (state IN ('active', 'releasing', 'lost')),
        changed_at REAL NOT NULL
    ) STRICT""",
    "INSERT INTO units_v3 (cidr, eni_id, kind, state, changed_at) "
    "SELECT cidr, eni_id, kind, state, changed_at FROM units",
    "DROP TABLE units",
    "ALTER TABLE units_v3 RENAME TO units",
)

# Version 4: the time an allocation adopted from aws-node's checkpoint had there, in its own
# integer nanoseconds, so the checkpoint ipamd writes back gives aws-node that very number (a float
# of seconds cannot hold int64's 19 digits). NULL for ipamd's own allocations.
_V4 = ("ALTER TABLE allocations ADD COLUMN stamp_ns INTEGER",)

MIGRATIONS: dict[int, tuple[str, ...]] = {1: _V1, 2: _V2, 3: _V3, 4: _V4}
"""Statements that bring a file from version N-1 to version N."""

CROSS_CHECKED_TABLES = (
    "meta",
    "enis",
    "units",
    "released_units",
    "allocations",
    "allocation_addresses",
    "quarantine",
)
"""Tables whose indexes are checked against their rows at every open (`PRAGMA integrity_check(T)`).

The whole file gets the structural `quick_check`; the cross-check of index against table, which costs
time in proportion to the rows, is spent on the tables that decide ownership. `delete_intents` and
`cooldowns` can hold a hundred thousand rows, are read from their own table b-tree (never through a
secondary index), and a damaged index there can at worst slow a prune, never give an address two
owners."""

REQUIRED_INDEXES = frozenset({"one_owner_per_address"})
"""Indexes whose absence means the file's guarantees cannot be trusted (checked at open)."""
