"""Serving the API on a unix socket, and only there: ipamd opens no TCP listener for it.

The socket is bound under a temporary name, given mode 0660, then renamed over the final path, so no
client ever sees it with the process umask's mode. A stale socket file left by a killed daemon is
removed first, and a socket a live process still answers on or a path that is not a socket refused,
as every socket ipamd serves on (`ipamd.unix_socket.clear_stale`). On a clean stop the runner's
cleanup unlinks the socket if it is still ours.

A refused upload (too large, wrong type) is not drained: with no lingering time the connection closes
right after the answer, so no client holds a handler by sending a body the API has already refused.
Every client of this socket makes one request per connection anyway.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from pathlib import Path

from aiohttp import web

from ipamd.unix_socket import MAX_SOCKET_PATH, SocketPathError, clear_stale

logger = logging.getLogger(__name__)

SOCKET_MODE = 0o660
LISTEN_BACKLOG = 4096
"""Connections the kernel queues before ipamd accepts them (capped by net.core.somaxconn). A node
starting a few hundred pods at once runs as many plugins at once; the default of 128 reset the rest."""

App = web.Application
"""What `serve_unix` serves (`ipamd.api.create_app` builds the API's), named here so that the
composition root need not import aiohttp."""
Runner = web.AppRunner
"""A served app: `await runner.cleanup()` stops serving it."""


def bind_unix(path: Path) -> socket.socket:
    """A listening-ready socket at `path` with mode 0660 from the first instant it is reachable."""
    temp = path.with_name(f".{path.name}.{os.getpid()}")
    for candidate in (path, temp):
        if len(os.fsencode(candidate)) > MAX_SOCKET_PATH:
            raise SocketPathError(f"{candidate} is longer than {MAX_SOCKET_PATH} bytes")
    path.parent.mkdir(parents=True, exist_ok=True)
    if clear_stale(path):
        logger.info("api.stale_socket path=%s", path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        temp.unlink(missing_ok=True)
        sock.bind(os.fspath(temp))
        os.chmod(temp, SOCKET_MODE)
        os.replace(temp, path)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        temp.unlink(missing_ok=True)
        raise
    return sock


async def serve_unix(app: App, path: str | os.PathLike[str]) -> Runner:
    """Serve `app` on the unix socket `path` (parent directories created). Stop with
    `await runner.cleanup()`. Raises `SocketPathError`."""
    path = Path(path)
    sock = bind_unix(path)
    inode = os.stat(path).st_ino

    async def unlink_socket(_: web.Application) -> None:
        with contextlib.suppress(FileNotFoundError):
            if path.stat().st_ino == inode:
                path.unlink()

    app.on_cleanup.append(unlink_socket)
    runner = web.AppRunner(app, access_log=None, lingering_time=0)
    try:
        await runner.setup()
        await web.SockSite(runner, sock, backlog=LISTEN_BACKLOG).start()
    except BaseException:
        await runner.cleanup()
        sock.close()
        raise
    logger.info("api.serving path=%s mode=%o", path, SOCKET_MODE)
    return runner
