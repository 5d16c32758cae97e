"""Helpers of the end-to-end tests: CNI plugins executed the way a runtime executes them, network
namespaces read with iproute2, and the skips when the machine lacks root or a tool. What a node of
real processes is driven by (`ipamd run` as a process, waiting, namespaces, work dirs) is shared
with the benches in `bench.vpc.processes`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.vpc.processes import SYSTEM_CNI_DIR


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
