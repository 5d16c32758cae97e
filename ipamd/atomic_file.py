"""Replacing a file so that a crash leaves the old contents or the new, never half: a hidden temp
file beside it, fsync, rename over the target, fsync of the directory. Readers that skip dot files
(libcni reading a conf dir) never see the temp file."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def replace_file(target: Path, data: bytes, mode: int = 0o644) -> None:
    """Write `data` as `target` atomically (its directory made if missing); raises OSError."""
    directory = target.parent
    directory.mkdir(parents=True, exist_ok=True)
    temp = directory / f".{target.name}.{os.getpid()}.tmp"
    try:
        with temp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        temp.chmod(mode)
        os.replace(temp, target)
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
