"""Replacing a file whole (`datastore.atomic`): the new contents or the old, never a temp file left
beside them, and what a kill cut short cleared before the next build."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import pytest

from datastore import atomic
from datastore.store import STATE_FILE_MODE, STATE_FILE_NAME, Store


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.mark.parametrize("durable", [True, False])
def test_the_new_contents_replace_the_old_and_no_temp_file_stays(
    tmp_path: Path, durable: bool
) -> None:
    target = tmp_path / "some.conf"
    atomic.replace(target, b"one", durable=durable)
    atomic.replace(target, b"two" * 100_000, 0o600, durable=durable)
    assert target.read_bytes() == b"two" * 100_000
    assert _names(tmp_path) == ["some.conf"], "no temp file is left"
    with pytest.raises(FileNotFoundError):
        atomic.replace(tmp_path / "missing" / "some.conf", b"x", durable=durable)
    assert _names(tmp_path) == ["some.conf"], "a missing directory is not made"


def test_the_mode_is_the_new_files(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        atomic.replace(tmp_path / "private", b"x", 0o600)
        atomic.replace(tmp_path / "public", b"x")
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "private").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "public").stat().st_mode) == 0o644


def test_a_failed_replacement_leaves_the_target_and_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "taken"
    (target / "inside").mkdir(parents=True)
    with pytest.raises(OSError):
        atomic.replace(target, b"x")  # a rename cannot put a file over a full directory
    assert target.is_dir()
    assert _names(tmp_path) == ["taken"]


def test_a_built_file_is_renamed_into_place_with_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "built.db"
    seen: list[tuple[str, int, int]] = []

    def build(temp: Path) -> None:
        info = temp.stat()
        seen.append((temp.name, info.st_size, stat.S_IMODE(info.st_mode)))
        with sqlite3.connect(temp) as conn:
            conn.execute("CREATE TABLE t (x)")
        conn.close()

    atomic.replace_built(target, build, 0o600)
    assert seen == [(f".built.db.{os.getpid()}.tmp", 0, 0o600)], "built in an empty hidden file"
    assert _names(tmp_path) == ["built.db"]
    with sqlite3.connect(target) as conn:
        assert conn.execute("SELECT name FROM sqlite_master").fetchall() == [("t",)]
    conn.close()


def test_a_build_that_fails_leaves_the_target_untouched(tmp_path: Path) -> None:
    target = tmp_path / "kept"
    target.write_bytes(b"old")

    def build(temp: Path) -> None:
        temp.write_bytes(b"half")
        raise RuntimeError("cut short")

    with pytest.raises(RuntimeError, match="cut short"):
        atomic.replace_built(target, build)
    assert target.read_bytes() == b"old"
    assert _names(tmp_path) == ["kept"]


def test_leftovers_of_cut_short_replacements_go_and_nothing_else(tmp_path: Path) -> None:
    for name in (
        ".ipamd.db.41.tmp",
        ".ipamd.db.41.tmp-wal",
        ".ipamd.db.41.tmp-journal",
        "ipamd.db",
        ".other.db.41.tmp",
        "ipamd.db-wal",
    ):
        (tmp_path / name).write_bytes(b"x")
    atomic.remove_leftovers(tmp_path / "ipamd.db")
    assert _names(tmp_path) == [".other.db.41.tmp", "ipamd.db", "ipamd.db-wal"]
    atomic.remove_leftovers(tmp_path / "missing" / "ipamd.db")  # no directory: nothing to do


def test_a_state_file_whose_creation_was_killed_is_created_anew(tmp_path: Path) -> None:
    """A kill mid-creation leaves a half-built database and its log under this very pid (a
    container's daemon is pid 1 at every start); the next start builds a fresh one, not from them."""
    temp = tmp_path / f".{STATE_FILE_NAME}.{os.getpid()}.tmp"
    temp.write_bytes(b"SQLite format 3\x00 torn")
    temp.with_name(temp.name + "-wal").write_bytes(b"a stale log")
    store = Store.open(tmp_path / STATE_FILE_NAME)
    store.close()
    assert _names(tmp_path) == [STATE_FILE_NAME]
    assert stat.S_IMODE((tmp_path / STATE_FILE_NAME).stat().st_mode) == STATE_FILE_MODE
