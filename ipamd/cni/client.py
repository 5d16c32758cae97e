"""The plugin's side of the local socket: one HTTP/1.1 exchange per call over a unix socket.

It owns the framing of that exchange and nothing more: a request line, `Host`, `Content-Type` and
`Content-Length` for a body, and `Connection: close`; the answer's status line, headers, and body by
`Content-Length` or, without one, to the end of the stream. The daemon (aiohttp's `json_response`)
always sends `Content-Length` and never chunks, so a chunked answer is refused, not decoded.

It must stay cheap to import, as the plugin loads it for every pod's ADD and DEL: `http.client`
imports `email`, `ssl` and `re`, and `socket` imports `enum` and `selectors`, which together cost
several times a bare interpreter's start. So it speaks through `_socket`, the C module under
`socket`, and imports nothing else but `time` and `ipamd.wire` (no asyncio, aiohttp or engine).

Failures keep the types the plugin maps to CNI codes: `Unreachable` for no socket, nobody
listening, a timeout, or a connection closed or garbled before the whole answer arrived;
`BadAnswer` for an answer that is not the JSON expected (or one this client does not read);
`DaemonError` for an error status with an `ErrorBody`.
"""

from __future__ import annotations

import time

from ipamd.wire import ErrorBody, WireError, dumps, parse_answer
from ipamd.wire.fast import socket_core as _socket

TIMEOUT_S = 10.0
"""Per call, from connect to the answer's last byte. ADD is served from the warm pool and never
waits on EC2, so ten seconds means stuck."""
MAX_HEAD_BYTES = 64 * 1024
"""The answer's status line and headers; aiohttp's are a few hundred bytes."""
MAX_ANSWER_BYTES = 64 * 1024 * 1024
"""An answer's body; the largest, ipamctl's lists of a full node, are well under a megabyte."""
_CHUNK = 64 * 1024
_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")
"""What `urllib.parse.quote(value, safe="")` leaves as it is: RFC 3986's unreserved characters."""


class Unreachable(Exception):
    """No answer from the daemon: no socket, nobody listening, a dropped connection, a timeout.

    `cause` is the failure itself (`OSError`, `TimeoutError`, or a broken answer); `connected` says
    whether the connection was made, so that `ipamctl` can tell an absent or refused socket from
    something that listens there and does not answer as ipamd."""

    def __init__(
        self, message: str, cause: Exception | None = None, connected: bool = False
    ) -> None:
        super().__init__(message)
        self.cause = cause
        self.connected = connected


class BadAnswer(Exception):
    """The daemon answered with something that is not the JSON this plugin expects."""


class DaemonError(Exception):
    """The daemon answered with an error status and an `ErrorBody`."""

    def __init__(self, status: int, body: ErrorBody) -> None:
        super().__init__(f"{status} {body.code}: {body.message}")
        self.status = status
        self.body = body


class _Garbled(Exception):
    """The answer broke HTTP/1.1's framing; reported as `Unreachable`, as `http.client`'s were."""


def segment(value: str) -> str:
    """One path segment, percent-encoded (an ifname may hold characters a URL path may not)."""
    return "".join(chr(b) if b in _SAFE else f"%{b:02X}" for b in value.encode("utf-8"))


def _request(method: str, path: str, body: bytes | None) -> bytes:
    """The whole request: head and body, sent in one write."""
    head = f"{method} {path} HTTP/1.1\r\nHost: localhost\r\n"
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    head += "Connection: close\r\n\r\n"
    return head.encode("ascii") + (body or b"")


class _Connection:
    """One unix-socket connection with a deadline for everything done on it."""

    def __init__(self, path: str, timeout: float) -> None:
        self._deadline = time.monotonic() + timeout
        self._sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            self._arm()
            self._sock.connect(path)
        except BaseException:
            self._sock.close()
            raise

    def _arm(self) -> None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        self._sock.settimeout(left)

    def send(self, data: bytes) -> None:
        self._arm()
        self._sock.sendall(data)

    def recv(self) -> bytes:
        self._arm()
        return self._sock.recv(_CHUNK)

    def close(self) -> None:
        self._sock.close()


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    """The status and the headers (names lower-cased) of an answer's head (no blank line)."""
    status_line, *lines = head.split(b"\r\n")
    version, _, rest = status_line.partition(b" ")
    code = rest[:3]
    if not version.startswith(b"HTTP/1.") or len(code) != 3 or not code.isdigit():
        raise _Garbled(f"not an HTTP/1.x status line: {status_line[:80]!r}")
    headers: dict[str, str] = {}
    for line in lines:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise _Garbled(f"not a header line: {line[:80]!r}")
        key = name.decode("latin-1").lower()
        text = value.strip().decode("latin-1")
        # A repeated header is one list (RFC 9110 5.3): two Content-Lengths no longer parse.
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    return int(code), headers


def _content_length(headers: dict[str, str]) -> int | None:
    if headers.get("transfer-encoding", "identity").lower() != "identity":
        raise BadAnswer(f"Transfer-Encoding {headers['transfer-encoding']} is not read here")
    text = headers.get("content-length")
    if text is None:
        return None
    if not text.isdigit():
        raise _Garbled(f"Content-Length {text!r}")
    length = int(text)
    if length > MAX_ANSWER_BYTES:
        raise BadAnswer(f"an answer of {length} bytes is over {MAX_ANSWER_BYTES}")
    return length


def _exchange(conn: _Connection, request: bytes) -> tuple[int, bytes]:
    """Sends `request`; returns the answer's status and body."""
    conn.send(request)
    data = b""
    while (end := data.find(b"\r\n\r\n")) < 0:
        if not b"HTTP/".startswith(data[:5]):  # another service's socket: say what it sent
            raise _Garbled(f"not an HTTP answer: {data[:80]!r}")
        if len(data) > MAX_HEAD_BYTES:
            raise _Garbled(f"no end of the headers in {MAX_HEAD_BYTES} bytes")
        chunk = conn.recv()
        if not chunk:
            raise _Garbled("the connection closed before the answer's headers")
        data += chunk
    status, headers = _parse_head(data[:end])
    length = _content_length(headers)
    body = bytearray(data[end + 4 :])
    while length is None or len(body) < length:
        chunk = conn.recv()
        if not chunk:
            if length is None:
                break
            raise _Garbled(f"the connection closed after {len(body)} of {length} bytes")
        body += chunk
        if len(body) > MAX_ANSWER_BYTES:
            raise BadAnswer(f"an answer over {MAX_ANSWER_BYTES} bytes")
    return status, bytes(body if length is None else body[:length])


def call(
    socket_path: str,
    method: str,
    path: str,
    body: dict[str, object] | None = None,
    timeout: float = TIMEOUT_S,
) -> object:
    """The decoded JSON answer of a 2xx. Raises `Unreachable`, `DaemonError` or `BadAnswer`."""
    request = _request(method, path, None if body is None else dumps(body).encode())
    try:
        conn = _Connection(socket_path, timeout)
    except OSError as err:
        raise Unreachable(f"ipamd at {socket_path}: {err or type(err).__name__}", err) from None
    try:
        status, raw = _exchange(conn, request)
    except (OSError, _Garbled) as err:
        message = f"ipamd at {socket_path}: {err or type(err).__name__}"
        raise Unreachable(message, err, connected=True) from None
    finally:
        conn.close()
    try:
        answer = parse_answer(raw)
    except WireError:
        raise BadAnswer(f"{method} {path}: {status} with a body that is not JSON") from None
    if 200 <= status < 300:
        return answer
    try:
        error = ErrorBody.from_json(answer)
    except WireError as err:
        raise BadAnswer(f"{method} {path}: {status} without an error code: {err}") from None
    raise DaemonError(status, error)
