"""End to end (a): Debian's `ptp` plugin with `ipamd-cni` as its IPAM, in network namespaces made here,
against a real `ipamd run --embedded`.

ptp is executed the way a runtime executes it (CNI_* environment, config on stdin, CNI_PATH holding
ptp's dir and a dir with `ipamd-cni`), and it executes `ipamd-cni` itself. It runs in a network
namespace made for the module, standing for the node's, where it puts the host ends of its veths.
What ptp put into the pod's namespace is read with iproute2; what ipamd holds is read from its API.

Debian bookworm's plugins (1.1.1) speak CNI up to 1.0.0, which has no GC or STATUS: those verbs are
sent to `ipamd-cni` directly with a 1.1.0 config of the same network, as a CNI 1.1 interface plugin
would delegate them to its IPAM plugin.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.vpc.processes import (
    SYSTEM_CNI_DIR,
    Ipamd,
    add_netns,
    bare,
    delete_netns,
    make_workdir,
    plugin_dir,
)
from tests.e2e.conflist import ptp_conflist
from tests.e2e.support import (
    CniOutcome,
    netns_addresses,
    netns_links,
    require,
    require_root,
    run_plugin,
)

NETWORK = "e2e-ptp"
PTP = SYSTEM_CNI_DIR / "ptp"
CNI_ARGS = "IgnoreUnknown=1;K8S_POD_NAMESPACE=e2e;K8S_POD_NAME={name};K8S_POD_UID=uid-{name}"

NetnsFactory = Callable[[], tuple[str, str]]


@dataclass
class Node:
    """ipamd and the CNI setup a runtime on its node would use."""

    ipamd: Ipamd
    cni_path: str
    plugin_bin: Path
    host_netns: str
    """The node's own network namespace, made for the module: ptp puts the host end of each veth and
    its routes there, never in the machine's namespace."""

    def conf(self, version: str = "1.0.0") -> dict[str, object]:
        """The ptp network configuration (the single plugin of the conflist, as the runtime hands
        it to the plugin)."""
        whole = ptp_conflist(str(self.ipamd.socket_path), network=NETWORK)
        plugins = whole["plugins"]
        assert isinstance(plugins, list)
        return {"cniVersion": version, "name": NETWORK, **plugins[0]}

    def ptp(self, command: str, conf: dict[str, object] | None = None, **env: str) -> CniOutcome:
        return run_plugin(
            PTP,
            command,
            conf or self.conf(),
            cni_path=self.cni_path,
            in_netns=self.host_netns,
            **env,
        )

    def ipam(self, command: str, conf: dict[str, object]) -> CniOutcome:
        return run_plugin(self.plugin_bin / "ipamd-cni", command, conf, cni_path=self.cni_path)

    def add(self, container_id: str, netns_path: str) -> CniOutcome:
        return self.ptp(
            "ADD",
            container_id=container_id,
            netns=netns_path,
            ifname="eth0",
            cni_args=CNI_ARGS.format(name=container_id),
        )

    def delete(self, container_id: str, netns_path: str) -> CniOutcome:
        return self.ptp("DEL", container_id=container_id, netns=netns_path, ifname="eth0")


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    require_root()
    require(plugins=("ptp",), skip=True)
    require("ip", "nsenter")
    workdir = make_workdir("ptp")
    plugin_bin = plugin_dir(workdir / "bin")
    host_ns = f"ipamd-e2e-ptp-node-{os.getpid()}"
    host_path = add_netns(host_ns)
    subprocess.run(["ip", "-n", host_ns, "link", "set", "lo", "up"], check=True, timeout=30)
    # GC's grace is the leak grace: 0 lets the test GC what it just added.
    ipamd = Ipamd.start(workdir, {"IPAMD_LEAK_GRACE": "0"})
    try:
        ipamd.wait_ready()
        yield Node(ipamd, f"{SYSTEM_CNI_DIR}{os.pathsep}{plugin_bin}", plugin_bin, host_path)
    finally:
        code, log = ipamd.stop(), ipamd.log_tail()
        delete_netns(host_ns)
        shutil.rmtree(workdir, ignore_errors=True)
    assert code == 0, f"ipamd exited {code}:\n{log}"


def _add_ok(node: Node, container_id: str, netns_path: str) -> tuple[str, dict[str, object]]:
    """ADD through ptp; returns the one address of its result (CIDR) and the whole result."""
    added = node.add(container_id, netns_path)
    assert added.returncode == 0, (added.output, added.stderr, node.ipamd.log_tail())
    ips = added.output["ips"]
    assert isinstance(ips, list) and len(ips) == 1, added.output
    return str(ips[0]["address"]), added.output


def test_version_of_ptp_and_ipamd_cni(tmp_path: Path) -> None:
    require(plugins=("ptp",), skip=True)
    ptp = run_plugin(PTP, "VERSION", {"cniVersion": "1.0.0"}, cni_path=str(SYSTEM_CNI_DIR))
    ours = run_plugin(plugin_dir(tmp_path / "bin") / "ipamd-cni", "VERSION", {}, cni_path="")
    assert ptp.returncode == 0 and ours.returncode == 0, (ptp, ours)
    assert ours.output["cniVersion"] == "1.1.0"
    supported = ours.output["supportedVersions"]
    assert isinstance(supported, list) and {"0.4.0", "1.0.0", "1.1.0"} <= set(supported)
    assert ptp.output["cniVersion"] in supported, "ipamd-cni speaks the version ptp delegates in"


def test_add_check_del_through_ptp(node: Node, netns: NetnsFactory) -> None:
    _, path = netns()
    container_id = "e2e-ptp-add"
    address, result = _add_ok(node, container_id, path)

    assert netns_addresses(path, "eth0") == {address}, "ptp put the result on the pod's eth0"
    ip = bare(address)
    held = node.ipamd.allocations(NETWORK)
    assert held == {f"{container_id}/eth0": [ip]}, "the address is ipamd's allocation"
    assert node.ipamd.address_states()[ip] == "assigned"

    prev = {**node.conf(), "prevResult": result}
    checked = node.ptp("CHECK", prev, container_id=container_id, netns=path, ifname="eth0")
    assert checked.returncode == 0, (checked.output, checked.stderr)
    wrong = {**node.conf(), "prevResult": {**result, "ips": [{"address": "10.255.255.1/32"}]}}
    mismatch = node.ptp("CHECK", wrong, container_id=container_id, netns=path, ifname="eth0")
    assert mismatch.returncode != 0 and mismatch.error_code == 104, mismatch

    deleted = node.delete(container_id, path)
    assert deleted.returncode == 0, (deleted.output, deleted.stderr)
    assert "eth0" not in netns_links(path) and netns_addresses(path) == set()
    assert node.ipamd.allocations(NETWORK) == {}
    assert node.ipamd.address_states()[ip] == "cooling", "a freed address cools before reuse"

    again = node.delete(container_id, path)
    assert again.returncode == 0, "DEL is idempotent"
    gone = node.ptp("CHECK", prev, container_id=container_id, netns=path, ifname="eth0")
    assert gone.returncode != 0 and gone.error_code == 103, gone


def test_gc_releases_attachments_not_listed_as_valid(node: Node, netns: NetnsFactory) -> None:
    (_, kept_path), (_, stale_path) = netns(), netns()
    kept, _ = _add_ok(node, "e2e-gc-kept", kept_path)
    stale, _ = _add_ok(node, "e2e-gc-stale", stale_path)

    conf = {
        **node.conf("1.1.0"),
        "cni.dev/valid-attachments": [{"containerID": "e2e-gc-kept", "ifname": "eth0"}],
    }
    collected = node.ipam("GC", conf)
    assert collected.returncode == 0 and collected.output == {}, collected

    assert node.ipamd.allocations(NETWORK) == {"e2e-gc-kept/eth0": [bare(kept)]}
    assert node.ipamd.address_states()[bare(stale)] == "cooling"
    assert netns_addresses(kept_path, "eth0") == {kept}

    # The runtime's own DEL of the collected attachment still cleans its namespace and succeeds.
    for container_id, path in (("e2e-gc-stale", stale_path), ("e2e-gc-kept", kept_path)):
        deleted = node.delete(container_id, path)
        assert deleted.returncode == 0, deleted
        assert netns_addresses(path) == set()
    assert node.ipamd.allocations(NETWORK) == {}


def test_status(node: Node, tmp_path: Path) -> None:
    ready = node.ipam("STATUS", node.conf("1.1.0"))
    assert ready.returncode == 0 and ready.output == {}, ready

    nobody = {**node.conf("1.1.0"), "ipam": {"type": "ipamd-cni", "socket": str(tmp_path / "x")}}
    down = node.ipam("STATUS", nobody)
    assert down.returncode != 0 and down.error_code == 50, down


def test_pods_in_many_namespaces_get_distinct_addresses(node: Node, netns: NetnsFactory) -> None:
    pods = [(f"e2e-many-{i}", netns()[1]) for i in range(6)]
    addresses = [_add_ok(node, cid, path)[0] for cid, path in pods]
    assert len(set(addresses)) == len(addresses)
    held = node.ipamd.allocations(NETWORK)
    for (cid, path), address in zip(pods, addresses, strict=True):
        assert held[f"{cid}/eth0"] == [bare(address)]
        assert netns_addresses(path, "eth0") == {address}
    for cid, path in pods:
        assert node.delete(cid, path).returncode == 0
    assert node.ipamd.allocations(NETWORK) == {}
