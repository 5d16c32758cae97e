"""What a node made of real processes is driven by from outside: `ipamd run` as a child process
(`Ipamd`) and its API over the unix socket, waiting for a condition the processes reach on their
own, network namespaces, work dirs, a free port, and a CNI bin dir.

Shared by the emulated VPC's node (`bench.vpc.node`), the benches that run one and the end-to-end
tests. It configures nothing inside a namespace and runs nothing in the caller's own.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

BIN = Path(sys.executable).parent
"""Where this interpreter's console scripts are: `ipamd`, `ipamd-cni`."""
SYSTEM_CNI_DIR = Path("/usr/lib/cni")
"""Debian's CNI plugin dir (package containernetworking-plugins)."""

T = TypeVar("T")


def terminate(process: subprocess.Popen[Any], timeout_s: float = 30.0) -> int:
    """SIGTERM a child still running, SIGKILL it past `timeout_s`, reap it; its exit status."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


def wait_until(
    probe: Callable[[], T | None], what: str, deadline_s: float = 30.0, every_s: float = 0.1
) -> T:
    """Polls `probe` until it returns something other than None (the processes under test are
    separate: there is no event to await) and returns it; fails after `deadline_s`."""
    end = time.monotonic() + deadline_s
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not within {deadline_s} s")
        time.sleep(every_s)


def bare(address: str) -> str:
    """`10.0.1.23/32` → `10.0.1.23`."""
    return address.partition("/")[0]


_HANDED_OUT: set[int] = set()


def _ephemeral_low() -> int:
    """The lowest port the kernel hands a socket bound to port 0 (`ip_local_port_range`)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` now, for a child process to listen on.

    Drawn below the kernel's ephemeral range, so no listener that binds port 0 (the embedded
    cloud's loopback servers, a client's source port) can be given it between this probe and the
    child's own bind; and never handed out twice by this process."""
    low = _ephemeral_low()
    for _ in range(500):
        port = random.randrange(max(1024, low // 2), low)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError(f"no free port on {host} below {low} after 500 draws")


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=10)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(self._path)


def unix_call(
    socket_path: str | os.PathLike[str], method: str, path: str, body: object = None
) -> tuple[int, dict[str, Any]]:
    """One request to a daemon's API on its unix socket, as the tests' clients make it: the status
    and the JSON answer (`{}` for an empty one)."""
    conn = UnixHTTPConnection(os.fspath(socket_path))
    try:
        payload = None if body is None else json.dumps(body)
        headers = {"Content-Type": "application/json"} if payload else {}
        conn.request(method, path, body=payload, headers=headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        conn.close()


@dataclass
class Ipamd:
    """`ipamd run` (`--embedded` from `start`) running as its own process, socket and state in
    `workdir`, its log (stderr) in `workdir/ipamd.log`."""

    process: subprocess.Popen[bytes]
    workdir: Path
    socket_path: Path
    metrics_port: int

    @classmethod
    def start(cls, workdir: Path, env: Mapping[str, str] | None = None) -> Ipamd:
        socket_path = workdir / "ipamd.sock"
        metrics_port = free_port()
        clean = {
            k: v for k, v in os.environ.items() if not k.startswith(("IPAMD_", "WARM_", "AWS_"))
        }
        clean.update(
            IPAMD_STATE_DIR=str(workdir / "state"),
            IPAMD_SOCKET=str(socket_path),
            IPAMD_CRI_SOCKET=str(workdir / "no-runtime.sock"),
            IPAMD_LOG_FORMAT="json",
            IPAMD_METRICS_ADDR=f"127.0.0.1:{metrics_port}",
            # Not VPC CNI's fixed 61679: two daemons on one machine would collide there.
            INTROSPECTION_BIND_ADDRESS=f"127.0.0.1:{free_port()}",
        )
        clean.update(env or {})
        with (workdir / "ipamd.log").open("ab") as log:
            process = subprocess.Popen(
                [str(BIN / "ipamd"), "run", "--embedded"],
                env=clean,
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        return cls(process, workdir, socket_path, metrics_port)

    def log_tail(self, chars: int = 4000) -> str:
        return (self.workdir / "ipamd.log").read_text(errors="replace")[-chars:]

    def call(self, method: str, path: str, body: object = None) -> tuple[int, dict[str, object]]:
        return unix_call(self.socket_path, method, path, body)

    def get(self, path: str) -> dict[str, object]:
        status, body = self.call("GET", path)
        assert status == 200, (path, status, body)
        return body

    def metric(self, name: str) -> float:
        """The value of an unlabelled metric on ipamd's Prometheus endpoint."""
        conn = http.client.HTTPConnection("127.0.0.1", self.metrics_port, timeout=10)
        try:
            conn.request("GET", "/metrics")
            text = conn.getresponse().read().decode()
        finally:
            conn.close()
        for line in text.splitlines():
            metric, _, value = line.partition(" ")
            if metric == name:
                return float(value)
        raise AssertionError(f"ipamd exports no {name}")

    def wait_ready(self, deadline_s: float = 60.0) -> None:
        def ready() -> bool | None:
            assert self.process.poll() is None, f"ipamd exited:\n{self.log_tail()}"
            try:
                return True if self.call("GET", "/readyz")[0] == 200 else None
            except OSError:
                return None

        wait_until(ready, "ipamd ready", deadline_s)

    def allocations(self, network: str | None = None) -> dict[str, list[str]]:
        """`container_id/ifname` → the addresses ipamd holds for it (without prefix length: that is
        the CNI result's business), from `/v1/allocations`."""
        held: dict[str, list[str]] = {}
        items = self.get("/v1/allocations")["allocations"]
        assert isinstance(items, list)
        for item in items:
            if network is None or item["network"] == network:
                key = f"{item['container_id']}/{item['ifname']}"
                held[key] = [bare(ip["address"]) for ip in item["ips"]]
        return held

    def address_states(self) -> dict[str, str]:
        """Every address of the node's ENIs → its state (free, assigned, cooling, ...), `/v1/enis`."""
        states: dict[str, str] = {}
        enis = self.get("/v1/enis")["enis"]
        assert isinstance(enis, list)
        for eni in enis:
            for unit in eni["units"]:
                for address in unit["addresses"]:
                    states[address["address"]] = address["state"]
        return states

    def stop(self) -> int:
        """SIGTERM, as the kubelet stops the DaemonSet's pod; returns the exit code."""
        return terminate(self.process)


def plugin_dir(path: Path, *plugins: Path) -> Path:
    """Makes `path` a CNI bin dir holding `plugins` (symlinks, named as the plugins) and `ipamd-cni`
    (this interpreter's console script)."""
    path.mkdir(parents=True, exist_ok=True)
    for plugin in (*plugins, BIN / "ipamd-cni"):
        (path / plugin.name).symlink_to(plugin)
    return path


def add_netns(name: str) -> str:
    """Creates a named network namespace (`ip netns add`); returns its path."""
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True, timeout=30)
    return f"/run/netns/{name}"


def delete_netns(name: str) -> None:
    subprocess.run(["ip", "netns", "delete", name], check=False, capture_output=True, timeout=30)


def make_workdir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"ipamd-e2e-{prefix}-"))
