"""The plugin's side of the local socket: one HTTP/1.1 request per invocation over a unix socket.

Standard library only (`http.client` with a unix-socket connection): nothing of the daemon's stack
(asyncio, aiohttp, the engine) is imported, so the plugin starts in a few tens of milliseconds.
"""

from __future__ import annotations

import http.client
import json
import socket
from urllib.parse import quote

from ipamd.wire import ErrorBody, WireError, dumps

TIMEOUT_S = 10.0
"""Per request. ADD is served from the warm pool and never waits on EC2, so ten seconds means stuck."""


class Unreachable(Exception):
    """No answer from the daemon: no socket, nobody listening, the connection dropped or timed out."""


class BadAnswer(Exception):
    """The daemon answered with something that is not the JSON this plugin expects."""


class DaemonError(Exception):
    """The daemon answered with an error status and an `ErrorBody`."""

    def __init__(self, status: int, body: ErrorBody) -> None:
        super().__init__(f"{status} {body.code}: {body.message}")
        self.status = status
        self.body = body


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def segment(value: str) -> str:
    """One path segment, percent-encoded (an ifname may hold characters a URL path may not)."""
    return quote(value, safe="")


def call(
    socket_path: str,
    method: str,
    path: str,
    body: dict[str, object] | None = None,
    timeout: float = TIMEOUT_S,
) -> object:
    """The decoded JSON answer of a 2xx. Raises `Unreachable`, `DaemonError` or `BadAnswer`."""
    conn = UnixHTTPConnection(socket_path, timeout)
    try:
        if body is None:
            conn.request(method, path)
        else:
            headers = {"Content-Type": "application/json"}
            conn.request(method, path, body=dumps(body).encode(), headers=headers)
        response = conn.getresponse()
        status, raw = response.status, response.read()
    except (OSError, http.client.HTTPException) as err:
        raise Unreachable(f"ipamd at {socket_path}: {err or type(err).__name__}") from None
    finally:
        conn.close()
    try:
        answer: object = json.loads(raw)
    except ValueError:
        raise BadAnswer(f"{method} {path}: {status} with a body that is not JSON") from None
    if 200 <= status < 300:
        return answer
    try:
        error = ErrorBody.from_json(answer)
    except WireError as err:
        raise BadAnswer(f"{method} {path}: {status} without an error code: {err}") from None
    raise DaemonError(status, error)
