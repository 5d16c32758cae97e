"""Helpers of the end-to-end tests: `ipamd run --embedded` as a real process, CNI plugins executed the
way a runtime executes them, network namespaces read with iproute2, and the skips when the machine
lacks root or a tool."""

from __future__ import annotations

import http.client
import json
import os
import shutil
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

import pytest

from tests.support.embedded_daemon import unix_call

BIN = Path(sys.executable).parent
"""Where this interpreter's console scripts are: `ipamd`, `ipamd-cni`."""
SYSTEM_CNI_DIR = Path("/usr/lib/cni")
"""Debian's CNI plugin dir (package containernetworking-plugins)."""
PAUSE_IMAGE = "localhost/ipamd-e2e/pause:1"
"""The sandbox image: built by the tests, imported into containerd, never pulled."""

T = TypeVar("T")


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


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Ipamd:
    """`ipamd run --embedded` running as its own process, socket and state in `workdir`, its log
    (stderr) in `workdir/ipamd.log`."""

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
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def plugin_dir(path: Path, *plugins: Path) -> Path:
    """Makes `path` a CNI bin dir holding `plugins` (symlinks, named as the plugins) and `ipamd-cni`
    (this interpreter's console script)."""
    path.mkdir(parents=True, exist_ok=True)
    for plugin in (*plugins, BIN / "ipamd-cni"):
        (path / plugin.name).symlink_to(plugin)
    return path


@dataclass(frozen=True)
class CniOutcome:
    returncode: int
    output: dict[str, object]
    """Stdout as JSON (the result, or the CNI error); `{}` when the plugin printed nothing."""
    stderr: str

    @property
    def error_code(self) -> object:
        return self.output.get("code")


def run_plugin(
    plugin: Path,
    command: str,
    conf: Mapping[str, object],
    *,
    cni_path: str,
    container_id: str = "",
    netns: str = "",
    ifname: str = "",
    cni_args: str = "",
    in_netns: str | None = None,
) -> CniOutcome:
    """Executes a CNI plugin per the spec: CNI_* in the environment, the network config on stdin,
    the result or error JSON on stdout. `in_netns` (a namespace's path) is the namespace the plugin
    runs in, as the runtime's would: where a main plugin puts the host end of its veth."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IPAMD_", "CNI_"))}
    env.update(CNI_COMMAND=command, CNI_PATH=cni_path)
    optional = {
        "CNI_CONTAINERID": container_id,
        "CNI_NETNS": netns,
        "CNI_IFNAME": ifname,
        "CNI_ARGS": cni_args,
    }
    env.update({k: v for k, v in optional.items() if v})
    argv = [str(plugin)]
    if in_netns is not None:
        argv = ["nsenter", f"--net={in_netns}", *argv]
    done = subprocess.run(
        argv,
        input=json.dumps(conf).encode(),
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    text = done.stdout.decode().strip()
    return CniOutcome(done.returncode, json.loads(text) if text else {}, done.stderr.decode())


def _ip(*args: str, netns_path: str | None = None) -> str:
    command = ["ip", *args]
    if netns_path is not None:
        command = ["nsenter", f"--net={netns_path}", *command]
    return subprocess.run(command, capture_output=True, text=True, check=True, timeout=30).stdout


def netns_addresses(netns_path: str, ifname: str | None = None) -> set[str]:
    """The global-scope addresses (CIDR) in a network namespace, of one interface or all."""
    links = json.loads(_ip("-j", "addr", "show", netns_path=netns_path) or "[]")
    return {
        f"{a['local']}/{a['prefixlen']}"
        for link in links
        if ifname is None or link["ifname"] == ifname
        for a in link.get("addr_info", [])
        if a.get("scope") == "global"
    }


def netns_links(netns_path: str) -> set[str]:
    return {link["ifname"] for link in json.loads(_ip("-j", "link", "show", netns_path=netns_path))}


def add_netns(name: str) -> str:
    """Creates a named network namespace (`ip netns add`); returns its path."""
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True, timeout=30)
    return f"/run/netns/{name}"


def delete_netns(name: str) -> None:
    subprocess.run(["ip", "netns", "delete", name], check=False, capture_output=True, timeout=30)


def require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("end-to-end tests need root (network namespaces, veths, containerd)")


def require(*tools: str, plugins: tuple[str, ...] = (), skip: bool = False) -> None:
    """Fails (or with `skip`, skips) when a tool on PATH or a plugin in /usr/lib/cni is missing:
    `.ci/run` installs them all when run as root."""
    missing = [tool for tool in tools if shutil.which(tool) is None]
    missing += [f"{SYSTEM_CNI_DIR}/{p}" for p in plugins if not (SYSTEM_CNI_DIR / p).is_file()]
    if missing:
        message = (
            f"missing {', '.join(missing)}: apt-get install containerd runc "
            "containernetworking-plugins iproute2 gcc libc6-dev (.ci/run does, as root)"
        )
        if skip:
            pytest.skip(message)
        pytest.fail(message)


def make_workdir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"ipamd-e2e-{prefix}-"))


def ip_json(netns_path: str, *args: str) -> Any:
    """`ip -j <args>` in the namespace at `netns_path`, parsed."""
    done = subprocess.run(
        ["nsenter", f"--net={netns_path}", "ip", "-j", *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return json.loads(done.stdout or "[]")


def link(netns_path: str, name: str) -> dict[str, Any]:
    """One link of the namespace, with its details and addresses."""
    (found,) = ip_json(netns_path, "-d", "addr", "show", "dev", name)
    assert isinstance(found, dict)
    return found


def ping(netns_path: str, address: str) -> int:
    """One ping from the namespace (IPv4 or IPv6, by the address); ping's exit code."""
    family = "-6" if ":" in address else "-4"
    command = ["nsenter", f"--net={netns_path}", "ping", family, "-c", "1", "-W", "2", address]
    return subprocess.run(command, capture_output=True, timeout=30, check=False).returncode
