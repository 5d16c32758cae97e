"""Real TCP through the emulated VPC, with the bytes counted both ways: what a ping cannot show on a
path that NATs (a Service's DNAT, kube-proxy's masquerade, ipamd's SNAT).

`TcpServer` runs this module's `serve` in a network namespace (`nsenter --net=<path>`; nsenter execs
Python, so the process the server object holds is the server): it listens on a port of 0.0.0.0 and,
per connection, reads the request up to the client's end of sending (half-close), answers the same
bytes, then one JSON line `{"peer": "<ip>:<port>", "server": "<name>"}` naming the client address it
saw and the name it was started with, and closes. `probe` runs this module's `connect` in another
namespace, one fresh connection per call: it sends a deterministic payload, half-closes, reads the
whole answer and returns a `TcpResult`. A client that sees its source preserved finds its own address
in `peer_seen`; one masqueraded finds the masquerading address there.

`probe` costs a Python start per connection (a tenth of a second or more), too slow for a connection
every 200 ms. `TcpWatch` runs this module's `watch` once in a namespace: every interval it opens a
fresh connection to each of its named targets, each attempt in a thread of its own (so one that
hangs delays no other), and prints one JSON line per attempt (`WatchAttempt`: the target's name,
the attempt's start as Unix time, its `TcpResult`), which the test process reads as they come.

The server and the watch are context managers that kill their process on the way out, whatever
happened; nothing else is ever started in the background. Standard library only; nothing runs in
the test process's own network namespace.
"""

from __future__ import annotations

import argparse
import json
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Final

from bench.vpc.processes import terminate

CONNECT_TIMEOUT_S: Final = 2.0
IO_TIMEOUT_S: Final = 5.0
"""The longest silence while sending or receiving, after the connection is up."""
START_TIMEOUT_S: Final = 10.0
MAX_REQUEST: Final = 16 << 20
"""The server reads at most this much of one request (and answers it whole)."""
WATCH_INTERVAL_S: Final = 0.2
WATCH_CONNECT_TIMEOUT_S: Final = 1.0
"""A watch's connect timeout: shorter than TCP's first SYN retransmission (1 s), so a lost SYN or
SYN-ACK fails the attempt instead of hiding in a retry."""
WATCH_IO_TIMEOUT_S: Final = 2.0
_CHUNK: Final = 1 << 16
_REPO: Final = Path(__file__).resolve().parents[3]


def payload(size: int) -> bytes:
    """The bytes a probe of `size` sends: the same for every probe of that size."""
    return (bytes(range(256)) * (size // 256 + 1))[:size]


@dataclass(frozen=True, slots=True)
class TcpResult:
    ok: bool
    """Connected, sent everything, got every byte back unchanged, then the server's line."""
    bytes_sent: int
    bytes_received: int
    """Bytes of the echoed payload received (the server's line not counted)."""
    peer_seen: str | None
    """"ip:port" of the client as the server saw it."""
    error: str | None
    server: str | None = None
    """The name the answering server was started with."""

    @property
    def peer_ip(self) -> str | None:
        return None if self.peer_seen is None else self.peer_seen.rpartition(":")[0]


@dataclass(frozen=True, slots=True)
class WatchAttempt:
    """One connection of a watch."""

    target: str
    """The name the target was given."""
    at: float
    """When the attempt started (Unix time)."""
    elapsed_s: float
    result: TcpResult

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "result": asdict(self.result)})

    @classmethod
    def from_json(cls, line: str) -> WatchAttempt:
        data = json.loads(line)
        return cls(
            str(data["target"]),
            float(data["at"]),
            float(data["elapsed_s"]),
            TcpResult(**data["result"]),
        )


# -- the test process's side ----------------------------------------------------------------------


def _module(netns: str, *args: str) -> list[str]:
    return ["nsenter", f"--net={netns}", sys.executable, "-m", __name__, *args]


class TcpServer:
    """The echo server in the network namespace at `netns` (a path: /run/netns/<name>, or a pod's
    /var/run/netns/cni-...), on `port` (0: one the kernel picks; `port` says which once started)."""

    def __init__(self, netns: str, port: int = 0, name: str = "") -> None:
        self.netns = netns
        self.port = port
        self.name = name
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> TcpServer:
        assert self.process is None, "already started"
        argv = _module(self.netns, "serve", "--port", str(self.port), "--name", self.name)
        self.process = subprocess.Popen(
            argv,
            cwd=_REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            self.port = self._listening_port(self.process)
        except BaseException:
            self.stop()
            raise
        return self

    @staticmethod
    def _listening_port(process: subprocess.Popen[str]) -> int:
        """The port of the server's one line, "listening <port>"."""
        return int(_expect_line(process, "listening", "the TCP server").split()[1])

    def stop(self) -> None:
        """Terminates the server (kills it if it lingers) and reaps it; safe to call twice."""
        process, self.process = self.process, None
        if process is None:
            return
        terminate(process, timeout_s=5)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()

    def __enter__(self) -> TcpServer:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()


class TcpWatch:
    """A fresh connection every `interval_s` to each target (name → (address, port)), from the
    network namespace at `netns`, until stopped; `attempts` holds what came back so far."""

    def __init__(
        self,
        netns: str,
        targets: Mapping[str, tuple[str, int]],
        interval_s: float = WATCH_INTERVAL_S,
        size: int = 1024,
        *,
        connect_timeout_s: float = WATCH_CONNECT_TIMEOUT_S,
        io_timeout_s: float = WATCH_IO_TIMEOUT_S,
    ) -> None:
        self.netns = netns
        self.targets = dict(targets)
        self.interval_s = interval_s
        self.size = size
        self.connect_timeout_s = connect_timeout_s
        self.io_timeout_s = io_timeout_s
        self.process: subprocess.Popen[str] | None = None
        self._attempts: list[WatchAttempt] = []
        self._lock = threading.Lock()
        self._reader: threading.Thread | None = None
        self.unreadable: list[str] = []
        """Lines of the watch that were no attempt (none, unless it broke)."""

    def start(self) -> TcpWatch:
        assert self.process is None, "already started"
        argv = _module(
            self.netns,
            "watch",
            "--interval",
            str(self.interval_s),
            "--size",
            str(self.size),
            "--connect-timeout",
            str(self.connect_timeout_s),
            "--io-timeout",
            str(self.io_timeout_s),
            *(f"{name}={address}:{port}" for name, (address, port) in self.targets.items()),
        )
        self.process = subprocess.Popen(
            argv,
            cwd=_REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            _expect_line(self.process, "watching", "the TCP watch")
        except BaseException:
            self.stop()
            raise
        self._reader = threading.Thread(target=self._read, name="tcp-watch", daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            try:
                attempt = WatchAttempt.from_json(line)
            except (ValueError, KeyError, TypeError):
                self.unreadable.append(line)
                continue
            with self._lock:
                self._attempts.append(attempt)

    def attempts(self, target: str | None = None) -> list[WatchAttempt]:
        """What came back so far (of one target, or of all), in the order it came."""
        with self._lock:
            return [a for a in self._attempts if target is None or a.target == target]

    def stop(self) -> list[WatchAttempt]:
        """Stops the watch once the attempts in flight have ended and returns every attempt; safe
        to call twice."""
        process, self.process = self.process, None
        if process is not None:
            terminate(process, timeout_s=self.connect_timeout_s + self.io_timeout_s + 5)
            if self._reader is not None:
                self._reader.join(timeout=10)
            for stream in (process.stdout, process.stderr):
                if stream is not None:
                    stream.close()
        return self.attempts()

    def __enter__(self) -> TcpWatch:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()


def _expect_line(process: subprocess.Popen[str], word: str, what: str) -> str:
    """The process's first line, which must start with `word`."""
    assert process.stdout is not None and process.stderr is not None
    ready, _, _ = select.select([process.stdout], [], [], START_TIMEOUT_S)
    line = process.stdout.readline() if ready else ""
    if not line.startswith(f"{word} ") and line.strip() != word:
        process.kill()
        raise RuntimeError(
            f"{what} did not start within {START_TIMEOUT_S} s: "
            f"{line!r} {process.stderr.read().strip()}"
        )
    return line


def probe(
    netns: str,
    address: str,
    port: int,
    size: int = 4096,
    *,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
    io_timeout_s: float = IO_TIMEOUT_S,
) -> TcpResult:
    """One fresh connection from the network namespace at `netns` to `address`:`port`."""
    argv = _module(netns, "connect", address, str(port), "--size", str(size))
    argv += ["--connect-timeout", str(connect_timeout_s), "--io-timeout", str(io_timeout_s)]
    done = subprocess.run(
        argv,
        cwd=_REPO,
        capture_output=True,
        text=True,
        timeout=connect_timeout_s + 2 * io_timeout_s + 30,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the TCP client failed ({done.returncode}): {done.stderr.strip()}")
    return TcpResult(**json.loads(done.stdout))


# -- inside the namespaces ------------------------------------------------------------------------


def _serve(port: int, name: str) -> None:
    """Accepts forever; SIGTERM ends it (the default action: nothing to flush)."""
    with socket.create_server(("0.0.0.0", port), backlog=128) as listener:
        print(f"listening {listener.getsockname()[1]}", flush=True)
        while True:
            conn, peer = listener.accept()
            threading.Thread(target=_answer, args=(conn, peer, name), daemon=True).start()


def _answer(conn: socket.socket, peer: tuple[str, int], name: str) -> None:
    with conn:
        try:
            conn.settimeout(IO_TIMEOUT_S)
            request = bytearray()
            while len(request) < MAX_REQUEST and (chunk := conn.recv(_CHUNK)):
                request += chunk
            line = json.dumps({"peer": f"{peer[0]}:{peer[1]}", "server": name}) + "\n"
            conn.sendall(bytes(request) + line.encode())
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the client went away or stalled: its own result says so


def _connect(address: str, port: int, size: int, connect_s: float, io_s: float) -> TcpResult:
    data, sent, answer = payload(size), 0, bytearray()
    try:
        with socket.create_connection((address, port), timeout=connect_s) as conn:
            conn.settimeout(io_s)
            while sent < size:
                sent += conn.send(data[sent : sent + _CHUNK])
            conn.shutdown(socket.SHUT_WR)
            while chunk := conn.recv(_CHUNK):
                answer += chunk
    except OSError as err:
        echoed = min(len(answer), size)
        return TcpResult(False, sent, echoed, None, f"{type(err).__name__}: {err}")
    return _judge(data, bytes(answer))


def _judge(data: bytes, answer: bytes) -> TcpResult:
    echoed, line = answer[: len(data)], answer[len(data) :]
    try:
        seen = json.loads(line)
        peer, server = str(seen["peer"]), str(seen["server"])
    except (ValueError, KeyError, TypeError):
        return TcpResult(False, len(data), len(echoed), None, f"no server line: {line[:200]!r}")
    if echoed != data:
        return TcpResult(False, len(data), len(echoed), peer, "the echo differs", server)
    return TcpResult(True, len(data), len(echoed), peer, None, server)


def _watch(
    targets: Mapping[str, tuple[str, int]],
    interval_s: float,
    size: int,
    connect_s: float,
    io_s: float,
) -> None:
    """Starts one attempt per target every `interval_s`, each in its own thread, and prints each
    attempt's line when it ends. SIGTERM stops the starting; the attempts in flight still end (each
    within its timeouts) and print their lines before the process exits, so none goes unreported."""
    lock = threading.Lock()
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.set())

    def attempt(name: str, address: str, port: int) -> None:
        at, started = time.time(), time.monotonic()
        result = _connect(address, port, size, connect_s, io_s)
        line = WatchAttempt(name, at, time.monotonic() - started, result).to_json()
        with lock:  # one whole line at a time
            print(line, flush=True)

    print("watching", flush=True)
    running: list[threading.Thread] = []
    tick = time.monotonic()
    while not stopping.is_set():
        running = [thread for thread in running if thread.is_alive()]
        for name, (address, port) in targets.items():
            thread = threading.Thread(target=attempt, args=(name, address, port), daemon=True)
            thread.start()
            running.append(thread)
        tick += interval_s
        stopping.wait(max(0.0, tick - time.monotonic()))
    for thread in running:
        thread.join()


def _target(text: str) -> tuple[str, tuple[str, int]]:
    """ "name=address:port" """
    name, _, where = text.partition("=")
    address, _, port = where.rpartition(":")
    if not (name and address and port.isdigit()):
        raise argparse.ArgumentTypeError(f"not name=address:port: {text!r}")
    return name, (address, int(port))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="tcp", description="the emulated VPC's TCP probe")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve")
    serve.add_argument("--port", type=int, default=0)
    serve.add_argument("--name", default="")
    connect = commands.add_parser("connect")
    connect.add_argument("address")
    connect.add_argument("port", type=int)
    connect.add_argument("--size", type=int, default=4096)
    connect.add_argument("--connect-timeout", type=float, default=CONNECT_TIMEOUT_S)
    connect.add_argument("--io-timeout", type=float, default=IO_TIMEOUT_S)
    watch = commands.add_parser("watch")
    watch.add_argument("targets", nargs="+", type=_target, metavar="name=address:port")
    watch.add_argument("--interval", type=float, default=WATCH_INTERVAL_S)
    watch.add_argument("--size", type=int, default=1024)
    watch.add_argument("--connect-timeout", type=float, default=WATCH_CONNECT_TIMEOUT_S)
    watch.add_argument("--io-timeout", type=float, default=WATCH_IO_TIMEOUT_S)
    args = parser.parse_args(argv)
    if args.command == "serve":
        _serve(args.port, args.name)
    elif args.command == "watch":
        targets = dict(args.targets)
        _watch(targets, args.interval, args.size, args.connect_timeout, args.io_timeout)
    else:
        result = _connect(args.address, args.port, args.size, args.connect_timeout, args.io_timeout)
        print(json.dumps(asdict(result)))


if __name__ == "__main__":
    main()
