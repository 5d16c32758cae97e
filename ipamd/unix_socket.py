"""Whether a unix socket path may be served on: the one probe the API, the config server and the
CRI server make before they bind (`clear_stale`), and the one error they raise when it may not
(`SocketPathError`).

A socket file nobody listens on (its process was killed) is stale and may be replaced; one a live
process answers on, a path that is not a socket, or one that cannot be probed is refused, never
removed. Only ECONNREFUSED proves a socket stale: any other failure (no permission, say) proves
nothing about who owns it.
"""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

MAX_SOCKET_PATH = 107
"""Bytes in a unix socket's path, at most (sun_path holds 108 with its terminating NUL)."""


class SocketPathError(Exception):
    """The path cannot be served on: another process answers on it, it is not a socket, it cannot be
    probed, or it is too long; says why, naming it."""


def clear_stale(path: Path) -> bool:
    """Make `path` free to bind: True when a stale socket was there and is removed, False when
    nothing was there; raises `SocketPathError` otherwise, leaving the path as it was."""
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise SocketPathError(f"{path} is longer than {MAX_SOCKET_PATH} bytes")
    if not is_stale(path):
        return False
    path.unlink(missing_ok=True)
    return True


def is_stale(path: Path) -> bool:
    """True for a socket nobody listens on, False when there is nothing at `path`; raises
    `SocketPathError` otherwise."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(mode):
        raise SocketPathError(f"{path} exists and is not a socket; not removing it")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(os.fspath(path))
        except ConnectionRefusedError:
            return True
        except OSError as err:
            raise SocketPathError(f"cannot probe {path}: {err}") from err
    raise SocketPathError(f"another process is serving on {path}")
