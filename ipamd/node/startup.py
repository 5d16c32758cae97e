"""Start-up steps the machine can refuse, each turned into one line an operator can act on.

It owns the state directory's lock (`lock_state_dir`) and raises `ipamd.errors.StartupError`s, which
`ipamd.main` prints as one line and maps to its exit code instead of a traceback. It must not decide
anything about addresses, and nothing here retries: a refused step ends the start, and the supervisor
(kubelet, or the person at the terminal) starts ipamd again once the cause is gone.

Why a lock: two daemons on one state directory are two engines, each sure it alone owns every address
in the file, and each handing them out. `flock` on `ipamd.lock` in the directory is taken before the
state file (or the embedded cloud's file) is opened and held for the life of the process; the kernel
drops it when the process dies, `kill -9` included, so a stale lock never blocks a restart. The lock
file holds the owner's PID, for the one line the second daemon prints.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Final

from ipamd.errors import SettingUnusable, StateUnusable, os_reason

LOCK_FILE: Final = "ipamd.lock"
LOCK_MODE: Final = 0o600


class StateDirLock:
    """The exclusive lock on a state directory, held until `release()` or the process's end."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor drops the flock


def lock_state_dir(state_dir: Path) -> StateDirLock:
    """Create the state directory if needed and lock it. Raises `SettingUnusable` if the directory
    cannot be made or used, `StateUnusable` if another process holds the lock (its PID named)."""
    state_dir = state_dir.absolute()
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise SettingUnusable(
            f"cannot create the state directory {state_dir} (IPAMD_STATE_DIR): {os_reason(err)}"
        ) from err
    path = state_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, LOCK_MODE)
    except OSError as err:
        raise SettingUnusable(
            f"cannot use the state directory {state_dir} (IPAMD_STATE_DIR): {os_reason(err)}"
        ) from err
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise StateUnusable(
            f"the state directory {state_dir} is in use by another ipamd ({holder}); "
            "stop it first, or give this one its own IPAMD_STATE_DIR"
        ) from None
    except OSError as err:
        os.close(fd)
        raise SettingUnusable(f"cannot lock {path}: {os_reason(err)}") from err
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError as err:
        os.close(fd)
        raise SettingUnusable(f"cannot write {path}: {os_reason(err)}") from err
    return StateDirLock(path, fd)


def _holder(fd: int) -> str:
    with contextlib.suppress(OSError, ValueError):
        pid = int(os.pread(fd, 32, 0).decode().strip())
        return f"pid {pid}"
    return "pid unknown"  # it has locked the file and not yet written its PID
