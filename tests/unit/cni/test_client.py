"""The plugin's HTTP/1.1 exchange over a unix socket, against a scripted daemon: what it sends, how
it reads an answer by Content-Length or to the end, and which failures become which error."""

from __future__ import annotations

import shutil
import socket
import tempfile
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ipamd.cni.client import BadAnswer, DaemonError, Unreachable, call, segment
from ipamd.wire import dumps


def http_answer(status: str, body: bytes, *headers: str, length: bool = True) -> bytes:
    lines = [f"HTTP/1.1 {status}", "Content-Type: application/json; charset=utf-8", *headers]
    if length:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join([*lines, "Connection: close"]) + "\r\n\r\n").encode() + body


def read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            while len(body) < int(value):
                body += conn.recv(4096)
    return head + b"\r\n\r\n" + body


class ScriptedDaemon:
    """A unix-socket server that answers every connection with `answer` (sent in `pieces` writes),
    then closes, or with `hold_open` keeps the connection until the client closes it."""

    def __init__(
        self,
        path: Path,
        answer: bytes,
        *,
        pieces: int = 1,
        hold_open: bool = False,
        read: bool = True,
    ) -> None:
        self.path = path
        self.answer = answer
        self.pieces = pieces
        self.hold_open = hold_open
        self.read = read
        self.requests: list[bytes] = []
        self._stop = threading.Event()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        self._listener.listen()
        self._listener.settimeout(0.05)  # so that the serving thread sees `stop` soon
        self._thread = threading.Thread(target=self._serve, name="scripted-ipamd", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(10)
                self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        if self.read:
            self.requests.append(read_request(conn))
        size = max(1, -(-len(self.answer) // self.pieces))
        for start in range(0, len(self.answer), size):
            conn.sendall(self.answer[start : start + size])
        if self.hold_open:
            while conn.recv(4096):
                pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._listener.close()
        assert not self._thread.is_alive()


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    # A unix socket's path is limited to 107 bytes: pytest's tmp_path can be longer.
    directory = Path(tempfile.mkdtemp(prefix="ipamd-cni-client-", dir="/tmp"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def daemon(socket_dir: Path) -> Iterator[Callable[..., ScriptedDaemon]]:
    started: list[ScriptedDaemon] = []

    def start(
        answer: bytes, *, pieces: int = 1, hold_open: bool = False, read: bool = True
    ) -> ScriptedDaemon:
        path = socket_dir / f"d{len(started)}.sock"
        scripted = ScriptedDaemon(path, answer, pieces=pieces, hold_open=hold_open, read=read)
        started.append(scripted)
        return scripted

    yield start
    for scripted in started:
        scripted.stop()


OK = http_answer("200 OK", b'{"status":"ok"}')


def test_a_post_is_one_http11_request_with_its_json_body(
    daemon: Callable[..., ScriptedDaemon],
) -> None:
    scripted = daemon(OK)
    body: dict[str, object] = {"container_id": "c1", "ifname": "eth0", "pod": {"name": "é"}}
    assert call(str(scripted.path), "POST", "/v1/allocations", body) == {"status": "ok"}
    (request,) = scripted.requests
    head, _, sent = request.partition(b"\r\n\r\n")
    request_line, *headers = head.decode().split("\r\n")
    assert request_line == "POST /v1/allocations HTTP/1.1"
    assert headers == [
        "Host: localhost",
        "Content-Type: application/json",
        f"Content-Length: {len(sent)}",
        "Connection: close",
    ]
    assert sent == dumps(body).encode()


def test_a_get_carries_no_body_headers(daemon: Callable[..., ScriptedDaemon]) -> None:
    scripted = daemon(OK)
    call(str(scripted.path), "GET", "/readyz")
    assert scripted.requests == [
        b"GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    ]


def test_an_answer_with_a_length_is_read_without_waiting_for_the_close(
    daemon: Callable[..., ScriptedDaemon],
) -> None:
    """The daemon may keep the connection open after the body: the client stops at the length
    (else it would wait until its own timeout)."""
    scripted = daemon(http_answer("200 OK", b'{"a":1}'), hold_open=True)
    assert call(str(scripted.path), "GET", "/v1/pool", timeout=10) == {"a": 1}


def test_an_answer_without_a_length_is_read_to_the_end(
    daemon: Callable[..., ScriptedDaemon],
) -> None:
    scripted = daemon(http_answer("200 OK", b'{"a": [1, 2]}', length=False), pieces=5)
    assert call(str(scripted.path), "GET", "/v1/pool") == {"a": [1, 2]}


def test_an_answer_in_many_writes_is_whole(daemon: Callable[..., ScriptedDaemon]) -> None:
    body = dumps({"allocations": [{"container_id": f"c{n}"} for n in range(2000)]}).encode()
    scripted = daemon(http_answer("200 OK", body), pieces=37)
    answer = call(str(scripted.path), "GET", "/v1/allocations")
    assert isinstance(answer, dict) and len(answer["allocations"]) == 2000


def test_an_error_status_with_an_error_body_is_a_daemon_error(
    daemon: Callable[..., ScriptedDaemon],
) -> None:
    error = b'{"code":"no_address","message":"the pool is empty","retryable":true}'
    scripted = daemon(http_answer("503 Service Unavailable", error))
    with pytest.raises(DaemonError) as raised:
        call(str(scripted.path), "POST", "/v1/allocations", {})
    assert raised.value.status == 503
    assert raised.value.body.code == "no_address" and raised.value.body.retryable


BAD_ANSWERS = {
    "not JSON": http_answer("200 OK", b"<html>"),
    "an error without a code": http_answer("500 Internal Server Error", b'{"message":"x"}'),
    "aiohttp's plain-text 404": http_answer("404 Not Found", b"404: Not Found"),
    "chunked": http_answer(
        "200 OK", b'7\r\n{"a":1}\r\n0\r\n\r\n', "Transfer-Encoding: chunked", length=False
    ),
}


@pytest.mark.parametrize("answer", BAD_ANSWERS.values(), ids=BAD_ANSWERS.keys())
def test_answers_that_are_not_the_expected_json_are_bad_answers(
    daemon: Callable[..., ScriptedDaemon], answer: bytes
) -> None:
    scripted = daemon(answer)
    with pytest.raises(BadAnswer):
        call(str(scripted.path), "GET", "/readyz")


BROKEN_ANSWERS = {
    "closed at once": b"",
    "closed in the headers": b"HTTP/1.1 200 OK\r\nContent-Len",
    "closed in the body": http_answer("200 OK", b'{"a":1}')[:-3],
    "not HTTP": b"SSH-2.0-OpenSSH_9.2\r\n\r\n",
    "no status code": b"HTTP/1.1 OK\r\n\r\n{}",
    "two lengths": http_answer("200 OK", b"{}", "Content-Length: 3"),
    "a length that is no number": http_answer("200 OK", b"{}", "Content-Length: -2", length=False),
    "a header line without a colon": b"HTTP/1.1 200 OK\r\nContent-Length 2\r\n\r\n{}",
}


@pytest.mark.parametrize("answer", BROKEN_ANSWERS.values(), ids=BROKEN_ANSWERS.keys())
def test_a_daemon_that_breaks_off_or_garbles_the_answer_is_unreachable(
    daemon: Callable[..., ScriptedDaemon], answer: bytes
) -> None:
    scripted = daemon(answer)
    with pytest.raises(Unreachable, match=str(scripted.path)):
        call(str(scripted.path), "GET", "/readyz")


def test_a_daemon_that_closes_without_reading_the_request_is_unreachable(
    daemon: Callable[..., ScriptedDaemon],
) -> None:
    scripted = daemon(b"", read=False)
    with pytest.raises(Unreachable):
        body: dict[str, object] = {"valid_attachments": ["x" * 100] * 2000}
        call(str(scripted.path), "POST", "/v1/gc", body)


def test_no_socket_is_unreachable(socket_dir: Path) -> None:
    with pytest.raises(Unreachable, match="No such file"):
        call(str(socket_dir / "absent.sock"), "GET", "/readyz")


def test_a_socket_nobody_listens_on_is_unreachable(socket_dir: Path) -> None:
    path = socket_dir / "bound.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as bound:
        bound.bind(str(path))
        with pytest.raises(Unreachable, match="refused"):
            call(str(path), "GET", "/readyz")


def test_a_daemon_that_never_answers_is_unreachable_at_the_timeout(
    daemon: Callable[..., ScriptedDaemon],
) -> None:
    scripted = daemon(b"", hold_open=True)
    with pytest.raises(Unreachable, match="timed out"):
        call(str(scripted.path), "GET", "/readyz", timeout=0.05)


def test_a_spent_timeout_fails_before_connecting(daemon: Callable[..., ScriptedDaemon]) -> None:
    scripted = daemon(OK)
    with pytest.raises(Unreachable, match="timed out"):
        call(str(scripted.path), "GET", "/readyz", timeout=0)
    assert scripted.requests == []


@pytest.mark.parametrize(
    "value", ["eth0", "c1.a_b-c~d", "a/b", "50%", "a b", "vlan@eth0", "ü", "😀", "?x=1&y#z", ""]
)
def test_a_segment_is_percent_encoded_as_urllib_does(value: str) -> None:
    assert segment(value) == urllib.parse.quote(value, safe="")
