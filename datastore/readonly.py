"""The state file read through a read-only connection of the reader's own, apart from any `Store`.

What a checker uses to compare a running engine with the file it committed to (two independent
readings, not one object with itself), and what a process outside the daemon uses to look at a
daemon's file while it runs. Nothing here writes.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from datastore import codec
from datastore.records import StateImage


def read_disk(path: Path) -> StateImage:
    """Everything the state file at `path` holds, as committed."""
    conn = _connect(path)
    try:
        return codec.load_image(conn)
    finally:
        conn.close()


def has_unique_owner_index(path: Path) -> bool:
    """Whether the state file still carries the UNIQUE index that makes two owners impossible."""
    conn = _connect(path)
    try:
        row = conn.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'index' AND name = 'one_owner_per_address'"
        ).fetchone()
        return row is not None and "UNIQUE" in row[0].upper()
    finally:
        conn.close()


def _connect(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)
