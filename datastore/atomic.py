"""Replacing a file whole: a crash leaves the old contents or the new, never half.

The new contents go to a hidden temp file beside the target (`.<name>.<pid>.tmp`), which is fsynced,
renamed over the target, and then the directory is fsynced, since a rename is durable only once the
directory entry is. Readers that skip dot files (libcni reading a conf dir) never see the temp file,
and two processes replacing the same file (an old and a new daemon) never share one.

Every file ipamd replaces whole goes through here: the state file as SQLite builds it, the embedded
cloud's file, the CNI conflist, and aws-node's checkpoint, the one write that skips both fsyncs
(`durable=False`, for the reason `ipamd.awsnode.checkpoint` gives). It lives in `datastore`, whose
concern is durability, because every other package may import it and it imports nothing of them.
"""

from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Callable
from pathlib import Path

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC


def replace(target: Path, data: bytes, mode: int = 0o644, *, durable: bool = True) -> None:
    """Make `data` the contents of `target`. `mode` is the new file's, as `open(2)` gives it (the
    umask applies). `durable=False` skips the fsyncs: the file is still never seen half written,
    but a crash of the machine may leave the old contents. Raises OSError (FileNotFoundError when
    the directory is missing: a caller that may make it does so then, so that a write that finds
    it pays no syscall for it), and leaves no temp file behind when it does."""
    temp = _temp(target)
    fd = os.open(temp, _CREATE, mode)

    def write() -> None:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)

    _put_in_place(temp, target, write, durable=durable)


def replace_built(target: Path, build: Callable[[Path], None], mode: int = 0o600) -> None:
    """Make what `build` writes the contents of `target`, durably: `build` fills the temp path it
    is given (SQLite building a database there, say), which exists, empty and with `mode`, before
    `build` opens it, so whatever `build` runs keeps that mode. Raises what `build` raises, or
    OSError; either way `target` is untouched and the temp file is gone. Files `build` leaves beside
    the temp one (a database's journal) are the caller's to clear, with `remove_leftovers`."""
    temp = _temp(target)
    temp.unlink(missing_ok=True)  # a leftover of this pid's (a container's daemon is often pid 1)
    os.close(os.open(temp, _CREATE, mode))

    def fill() -> None:
        build(temp)
        fd = os.open(temp, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    _put_in_place(temp, target, fill, durable=True)


def _put_in_place(temp: Path, target: Path, fill: Callable[[], None], *, durable: bool) -> None:
    """`fill` the temp file, rename it over `target`, then (`durable`) fsync the directory; on any
    failure the temp file is removed and `target` is untouched."""
    try:
        fill()
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    if durable:
        _fsync_directory(target.parent)


def remove_leftovers(target: Path) -> None:
    """Remove the temp files of replacements of `target` a kill cut short, with anything a builder
    left beside them (`<temp>-wal`, `<temp>-journal`). Such a kill never touched `target` itself.
    Only for a file that one process at a time replaces: another's replacement would lose its temp."""
    for leftover in target.parent.glob(f".{glob.escape(target.name)}.*.tmp*"):
        leftover.unlink(missing_ok=True)


def _temp(target: Path) -> Path:
    return target.with_name(f".{target.name}.{os.getpid()}.tmp")


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
