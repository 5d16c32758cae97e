"""Whether a unix socket path may be served on: the one probe the API, the config server and the
embedded runtime make before they bind.

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


class SocketInUse(Exception):
    """The path cannot be served on; says why, naming it."""


def is_stale(path: Path) -> bool:
    """True for a socket nobody listens on, False when there is nothing at `path`; raises
    `SocketInUse` otherwise."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(mode):
        raise SocketInUse(f"{path} exists and is not a socket; not removing it")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(os.fspath(path))
        except ConnectionRefusedError:
            return True
        except OSError as err:
            raise SocketInUse(f"cannot probe {path}: {err}") from err
    raise SocketInUse(f"another process is serving on {path}")
