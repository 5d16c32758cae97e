"""End to end: `ipamd-cni` as the interface plugin (the shipped conflist's shape) makes the pod's veth
itself, against a real `ipamd run --embedded`, in network namespaces made here.

The plugin is executed as a runtime executes it (CNI_* environment, config on stdin), inside a
namespace standing for the node's, where the host end of each veth goes. What it made is read from
the kernel with iproute2: both ends, names, MTU, MACs, addresses, routes, neighbours; then pings
cross the pair both ways, and DEL removes it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from bench.vpc.processes import BIN, Ipamd, add_netns, bare, delete_netns, make_workdir
from ipamd.wire.pod import veth_name
from tests.e2e.conflist import conflist
from tests.e2e.support import (
    CniOutcome,
    ip_json,
    link,
    netns_links,
    ping,
    require,
    require_root,
    run_plugin,
)

NETWORK = "e2e-interface"
MTU = 1500
HOST_ADDRESS = "192.0.2.1"
"""An address of the node's namespace (on its lo) for the pod to ping."""
CNI_ARGS = "IgnoreUnknown=1;K8S_POD_NAMESPACE=e2e;K8S_POD_NAME={name};K8S_POD_UID=uid-{name}"

NetnsFactory = Callable[[], tuple[str, str]]


@dataclass
class Node:
    ipamd: Ipamd
    host_netns: str

    def conf(self) -> dict[str, object]:
        whole: Any = conflist(str(self.ipamd.socket_path), network=NETWORK)
        (plugin,) = whole["plugins"]
        return {"cniVersion": "1.0.0", "name": NETWORK, **plugin, "mtu": MTU}

    def plugin(self, command: str, conf: dict[str, object] | None = None, **env: str) -> CniOutcome:
        return run_plugin(
            BIN / "ipamd-cni",
            command,
            conf or self.conf(),
            cni_path=str(BIN),
            in_netns=self.host_netns,
            **env,
        )

    def add(self, container_id: str, netns_path: str, pod: str | None = None) -> CniOutcome:
        args = "" if pod is None else CNI_ARGS.format(name=pod)
        return self.plugin(
            "ADD", container_id=container_id, netns=netns_path, ifname="eth0", cni_args=args
        )


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    require_root()
    require("ip", "nsenter", "ping")
    workdir = make_workdir("iface")
    host_ns = f"ipamd-e2e-iface-node-{os.getpid()}"
    host_path = add_netns(host_ns)
    for command in (
        ["link", "set", "lo", "up"],
        ["addr", "add", f"{HOST_ADDRESS}/32", "dev", "lo"],
    ):
        subprocess.run(["ip", "-n", host_ns, *command], check=True, timeout=30)
    ipamd = Ipamd.start(workdir)
    try:
        ipamd.wait_ready()
        yield Node(ipamd, host_path)
    finally:
        code, log = ipamd.stop(), ipamd.log_tail()
        delete_netns(host_ns)
        shutil.rmtree(workdir, ignore_errors=True)
    assert code == 0, f"ipamd exited {code}:\n{log}"


def result(outcome: CniOutcome) -> Any:
    """The CNI result JSON, untyped for indexing."""
    return outcome.output


def routes(netns_path: str) -> set[tuple[str, str | None, str, str]]:
    return {
        (r["dst"], r.get("gateway"), r["dev"], r.get("scope", "global"))
        for r in ip_json(netns_path, "route", "show", "table", "main")
    }


def neighbours(netns_path: str) -> set[tuple[str, str, str, str]]:
    return {
        (n["dst"], n.get("lladdr", ""), n["dev"], ",".join(n.get("state", [])))
        for n in ip_json(netns_path, "neigh", "show")
    }


def test_add_makes_vpc_cnis_pod_interface_and_del_removes_it(
    node: Node, netns: NetnsFactory
) -> None:
    _, pod_path = netns()
    added = node.add("e2e-iface-add", pod_path, pod="web-1")
    assert added.returncode == 0, (added.output, added.stderr, node.ipamd.log_tail())
    host_name = veth_name("eni", "e2e", "web-1")
    host_if, pod_if = result(added)["interfaces"]
    assert host_if["name"] == host_name and "sandbox" not in host_if
    assert pod_if == {"name": "eth0", "mac": pod_if["mac"], "sandbox": pod_path}
    (ip,) = result(added)["ips"]
    assert ip["gateway"] == "169.254.1.1" and ip["interface"] == 1
    address = bare(ip["address"])
    assert ip["address"] == f"{address}/32"
    assert node.ipamd.allocations(NETWORK) == {"e2e-iface-add/eth0": [address]}

    host = link(node.host_netns, host_name)
    assert host["mtu"] == MTU and host["address"] == host_if["mac"]
    assert host["linkinfo"]["info_kind"] == "veth" and "UP" in host["flags"]
    pod = link(pod_path, "eth0")
    assert pod["mtu"] == MTU and pod["address"] == pod_if["mac"] and "UP" in pod["flags"]
    assert [(a["local"], a["prefixlen"]) for a in pod["addr_info"] if a["family"] == "inet"] == [
        (address, 32)
    ]
    assert (address, None, host_name, "link") in routes(node.host_netns)
    assert routes(pod_path) == {
        ("169.254.1.1", None, "eth0", "link"),
        ("default", "169.254.1.1", "eth0", "global"),
    }
    assert (address, pod_if["mac"], host_name, "PERMANENT") in neighbours(node.host_netns)
    assert ("169.254.1.1", host_if["mac"], "eth0", "PERMANENT") in neighbours(pod_path)
    assert ping(pod_path, HOST_ADDRESS) == 0, "pod -> node"
    assert ping(node.host_netns, address) == 0, "node -> pod"

    prev = {**node.conf(), "prevResult": added.output}
    checked = node.plugin(
        "CHECK", prev, container_id="e2e-iface-add", netns=pod_path, ifname="eth0"
    )
    assert checked.returncode == 0, checked.output

    deleted = node.plugin("DEL", prev, container_id="e2e-iface-add", netns=pod_path, ifname="eth0")
    assert deleted.returncode == 0, deleted.output
    assert host_name not in netns_links(node.host_netns)
    assert "eth0" not in netns_links(pod_path)
    assert node.ipamd.allocations(NETWORK) == {}
    gone = node.plugin("CHECK", prev, container_id="e2e-iface-add", netns=pod_path, ifname="eth0")
    assert gone.returncode == 1


def test_a_retried_add_replaces_the_veth_and_without_pod_names_the_container_names_it(
    node: Node, netns: NetnsFactory
) -> None:
    _, pod_path = netns()
    first = node.add("e2e-iface-retry", pod_path)
    assert first.returncode == 0, (first.output, first.stderr)
    host_name = result(first)["interfaces"][0]["name"]
    assert host_name.startswith("eni") and len(host_name) == 14
    assert host_name != veth_name("eni", "", "")
    # The same container again (its pod netns already holds eth0 from the first attempt).
    again = node.add("e2e-iface-retry", pod_path)
    assert again.returncode == 0, (again.output, again.stderr)
    assert result(again)["interfaces"][0]["name"] == host_name
    assert result(again)["ips"] == result(first)["ips"], "the same allocation"
    hosts = [n for n in netns_links(node.host_netns) if n.startswith("eni")]
    assert hosts == [host_name], "one veth, the new one"
    mac = result(again)["interfaces"][0]["mac"]
    assert link(node.host_netns, host_name)["address"] == mac
    deleted = node.plugin("DEL", container_id="e2e-iface-retry", ifname="eth0")
    assert deleted.returncode == 0, deleted.output
    assert host_name not in netns_links(node.host_netns), "DEL without netns or prevResult"


def test_a_failed_setup_leaves_no_veth(node: Node, netns: NetnsFactory) -> None:
    name, pod_path = netns()
    subprocess.run(
        ["ip", "-n", name, "link", "add", "eth0", "type", "veth", "peer", "name", "spare0"],
        check=True,
    )
    failed = node.add("e2e-iface-fail", pod_path, pod="web-2")
    assert failed.returncode == 1 and failed.error_code == 106, failed.output
    assert veth_name("eni", "e2e", "web-2") not in netns_links(node.host_netns)
    deleted = node.plugin("DEL", container_id="e2e-iface-fail", netns=pod_path, ifname="eth0")
    assert deleted.returncode == 0
    assert node.ipamd.allocations(NETWORK) == {}


@pytest.mark.parametrize(
    ("field", "value"),
    [("vethPrefix", "abcde"), ("vethPrefix", "eth"), ("mtu", 100), ("mtu", "9001")],
)
def test_a_bad_interface_setting_is_a_config_error(
    node: Node, netns: NetnsFactory, field: str, value: object
) -> None:
    _, pod_path = netns()
    conf = {**node.conf(), field: value}
    bad = node.plugin("ADD", conf, container_id="e2e-iface-bad", netns=pod_path, ifname="eth0")
    assert bad.returncode == 1 and bad.error_code == 7, bad.output
