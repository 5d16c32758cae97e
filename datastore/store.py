"""The SQLite state file: open with integrity checks, load everything, commit one mutation per transaction.

WAL mode with `synchronous=FULL`: a commit is on disk when `commit()` returns. Each `Mutation` is one
transaction covering every table it touches, so there is never an order between two stores to get wrong.
A `Store` is used by one thread at a time (the engine serializes its calls); it must not be shared.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from datastore import atomic, codec
from datastore.errors import CommitError, OwnershipConflict, StateFileError
from datastore.records import Mutation, StateImage
from datastore.schema import (
    APPLICATION_ID,
    CROSS_CHECKED_TABLES,
    MIGRATIONS,
    REQUIRED_INDEXES,
    SCHEMA_VERSION,
)

STATE_FILE_NAME = "ipamd.db"
"""The state file's name in IPAMD_STATE_DIR: the one definition, which ipamd, the benches, the
chaos runner and the tests all import."""
STATE_FILE_MODE = 0o600
_SQLITE_MAGIC = b"SQLite format 3\x00"


class Store:
    """An open, verified state file."""

    def __init__(
        self, path: Path, conn: sqlite3.Connection, missing_indexes: frozenset[str]
    ) -> None:
        self.path = path
        self._conn = conn
        self._inode = os.stat(path).st_ino
        self.missing_indexes = missing_indexes
        """Required indexes the file lacked at open (a hand-edited or damaged file); see `restore_indexes`."""

    @classmethod
    def open(cls, path: Path) -> Store:
        """Open `path`, creating a new state file if none exists; raise `StateFileError` if it is unusable."""
        if not path.exists():
            if _has_wal(path):
                raise StateFileError(path, "the file is missing but its write-ahead log remains")
            _create(path)
        _check_header(path)
        try:
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as err:
            raise StateFileError(path, f"cannot open: {err}") from err
        try:
            # Verify before configuring: a foreign or damaged file must be left byte for byte as found.
            _verify(path, conn)
            _configure(conn)
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version < SCHEMA_VERSION:
                _migrate(conn, version)
            missing = _missing_indexes(conn)
        except sqlite3.Error as err:
            conn.close()
            raise StateFileError(path, f"unreadable ({err})") from err
        except StateFileError:
            conn.close()
            raise
        return cls(path, conn, missing)

    def close(self) -> None:
        self._conn.close()

    def load(self) -> StateImage:
        """Read every record. Raises `StateFileError` if a row cannot be decoded."""
        try:
            return codec.load_image(self._conn)
        except (sqlite3.Error, ValueError) as err:
            raise StateFileError(self.path, f"unreadable records ({err})") from err

    def commit(self, mutation: Mutation) -> None:
        """Apply `mutation` in one durable transaction, or raise `CommitError` having written nothing."""
        self.commit_all((mutation,))

    def commit_all(self, mutations: Sequence[Mutation]) -> None:
        """Apply `mutations`, in order, in one durable transaction (one fsync for all of them), or
        raise `CommitError` having written none of them."""
        self._check_still_ours()
        with self._transaction():
            for mutation in mutations:
                codec.write_mutation(self._conn, mutation)

    def restore_indexes(self) -> None:
        """Recreate required indexes the file lacked; raises `OwnershipConflict` while duplicates remain."""
        if not self.missing_indexes:
            return
        with self._transaction():
            for statement in (s for v in sorted(MIGRATIONS) for s in MIGRATIONS[v]):
                if statement.startswith("CREATE") and any(
                    name in statement for name in self.missing_indexes
                ):
                    self._conn.execute(statement)
        self.missing_indexes = frozenset()

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        try:
            self._conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as err:
            raise CommitError(f"cannot begin a transaction on {self.path}: {err}") from err
        try:
            yield
            self._conn.execute("COMMIT")
        except sqlite3.IntegrityError as err:
            self._rollback()
            raise OwnershipConflict(f"{self.path}: {err}") from err
        except sqlite3.Error as err:
            self._rollback()
            raise CommitError(f"write to {self.path} failed: {err}") from err
        except BaseException:
            self._rollback()
            raise

    def _rollback(self) -> None:
        if self._conn.in_transaction:
            # SQLite rolls back by itself on some errors (e.g. SQLITE_FULL); then nothing is left to undo.
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("ROLLBACK")

    def _check_still_ours(self) -> None:
        # A removed or replaced state file keeps accepting writes through the open descriptor and loses
        # them all at the next start. Refuse instead, so the caller's operation is not acknowledged.
        try:
            inode = os.stat(self.path).st_ino
        except OSError as err:
            raise CommitError(f"state file {self.path} is gone: {err}") from err
        if inode != self._inode:
            raise CommitError(f"state file {self.path} was replaced while open")


def _create(path: Path) -> None:
    """Build a new state file beside `path` and rename it into place (`datastore.atomic`).

    A kill at any instant leaves either no state file (the next start creates it again) or a
    complete one, never an empty or schema-less file that every later start would refuse.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    # A kill mid-build leaves the temp file and its log, which SQLite would replay into the next.
    atomic.remove_leftovers(path)
    try:
        # Made 0600 before SQLite opens it (SQLite gives its -wal and -shm files the same mode):
        # the file names every pod and address on the node, and only ipamd has business with it.
        atomic.replace_built(path, _build, STATE_FILE_MODE)
    except (OSError, sqlite3.Error) as err:
        raise StateFileError(path, f"cannot create: {err}") from err


def _build(building: Path) -> None:
    conn = sqlite3.connect(building, isolation_level=None)
    try:
        _configure(conn)
        _migrate(conn, 0)
    finally:
        conn.close()  # checkpoints the log into the file and removes it


def _check_header(path: Path) -> None:
    try:
        with path.open("rb") as f:
            header = f.read(100)
    except OSError as err:
        raise StateFileError(path, f"cannot read: {err}") from err
    if not header:
        raise StateFileError(path, "the file is empty (0 bytes) but a state file was expected")
    if len(header) < 100 or not header.startswith(_SQLITE_MAGIC):
        raise StateFileError(path, "not a SQLite database (bad header; truncated or overwritten?)")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    size = path.stat().st_size
    if page_size and pages and size < page_size * pages and not _has_wal(path):
        raise StateFileError(path, f"truncated: {size} bytes, header promises {page_size * pages}")


def _has_wal(path: Path) -> bool:
    wal = path.with_name(path.name + "-wal")
    return wal.exists() and wal.stat().st_size > 0


def _configure(conn: sqlite3.Connection) -> None:
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("PRAGMA busy_timeout = 5000")


def _verify(path: Path, conn: sqlite3.Connection) -> None:
    app_id = conn.execute("PRAGMA application_id").fetchone()[0]
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if app_id != APPLICATION_ID:
        raise StateFileError(path, "not an ipamd state file (application_id mismatch)")
    if version > SCHEMA_VERSION:
        raise StateFileError(
            path, f"schema version {version} is newer than this ipamd supports ({SCHEMA_VERSION})"
        )
    if version < 1:
        raise StateFileError(path, f"unknown schema version {version}")
    problems = [row[0] for row in conn.execute("PRAGMA quick_check")]
    for table in CROSS_CHECKED_TABLES:
        problems += [row[0] for row in conn.execute(f"PRAGMA integrity_check({table})")]
    problems = [p for p in problems if p != "ok"]
    if problems:
        raise StateFileError(path, "integrity check failed: " + _summary(problems))


def _summary(problems: list[str], shown: int = 2, width: int = 160) -> str:
    """A few problems, each cut short: the message travels in /readyz and every CNI error, and a
    damaged file can report kilobytes of them. The full list is one `PRAGMA integrity_check` away."""
    head = "; ".join(p if len(p) <= width else p[: width - 3] + "..." for p in problems[:shown])
    if len(problems) <= shown:
        return head
    return f"{head}; and {len(problems) - shown} more (PRAGMA integrity_check lists them)"


def _migrate(conn: sqlite3.Connection, from_version: int) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        for version in range(from_version + 1, SCHEMA_VERSION + 1):
            for statement in MIGRATIONS[version]:
                conn.execute(statement)
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _missing_indexes(conn: sqlite3.Connection) -> frozenset[str]:
    present = {
        row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")
    }
    return frozenset(REQUIRED_INDEXES - present)
