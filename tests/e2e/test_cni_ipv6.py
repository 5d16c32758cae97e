"""End to end: `ipamd-cni` as the interface plugin of an IPv6 node, against a real `ipamd run
--embedded` in IPv6 mode, in network namespaces made here: the pod's /128 on eth0 behind fe80::1,
and its IPv4 egress (`v4Egress`) on a second pair with an address from Debian's host-local.

The plugin is executed as a runtime executes it, inside a namespace standing for the node's. What
it made is read from the kernel with iproute2 and sysctl; pings cross both pairs both ways (IPv6 on
eth0, IPv4 on the egress pair), and DEL removes both and releases host-local's address.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.vpc.processes import (
    BIN,
    SYSTEM_CNI_DIR,
    Ipamd,
    add_netns,
    bare,
    delete_netns,
    make_workdir,
)
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

NETWORK = "e2e-ipv6"
MTU = 1500
HOST_V6 = "2001:db8:ffff::1"
HOST_V4 = "192.0.2.1"
"""Addresses of the node's namespace (on its lo) for the pod to ping, one per family."""
SUBNET = "169.254.172.0/22"
EGRESS_GATEWAY = "169.254.172.1"
CNI_ARGS = "IgnoreUnknown=1;K8S_POD_NAMESPACE=e2e;K8S_POD_NAME={name};K8S_POD_UID=uid-{name}"
IPV6_MODE = {"ENABLE_IPv6": "true", "ENABLE_IPv4": "false", "ENABLE_PREFIX_DELEGATION": "true"}

NetnsFactory = Callable[[], tuple[str, str]]


@dataclass
class Node:
    ipamd: Ipamd
    host_netns: str
    data_dir: Path
    """host-local's dataDir: one file per address it holds, under the network's name."""

    def conf(self, egress: bool = True) -> dict[str, object]:
        whole: Any = conflist(str(self.ipamd.socket_path), network=NETWORK)
        (plugin,) = whole["plugins"]
        conf = {"cniVersion": whole["cniVersion"], "name": NETWORK, **plugin, "mtu": MTU}
        if egress:
            conf["v4Egress"] = {"ifname": "v4if0", "subnet": SUBNET, "dataDir": str(self.data_dir)}
        return conf

    def plugin(self, command: str, conf: dict[str, object] | None = None, **env: str) -> CniOutcome:
        return run_plugin(
            BIN / "ipamd-cni",
            command,
            conf or self.conf(),
            cni_path=f"{SYSTEM_CNI_DIR}{os.pathsep}{BIN}",
            in_netns=self.host_netns,
            **env,
        )

    def add(
        self, container_id: str, netns_path: str, pod: str, conf: dict[str, object] | None = None
    ) -> CniOutcome:
        args = CNI_ARGS.format(name=pod)
        return self.plugin(
            "ADD", conf, container_id=container_id, netns=netns_path, ifname="eth0", cni_args=args
        )

    def held_by_host_local(self) -> set[str]:
        """The addresses host-local holds (its dataDir also keeps a last-reserved marker and a
        lock, which are not addresses)."""
        directory = self.data_dir / NETWORK
        if not directory.is_dir():
            return set()
        return {p.name for p in directory.iterdir() if p.name.count(".") == 3}


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    require_root()
    require(plugins=("host-local",), skip=True)
    require("ip", "nsenter", "ping", "sysctl")
    workdir = make_workdir("ipv6")
    host_ns = f"ipamd-e2e-ipv6-node-{os.getpid()}"
    host_path = add_netns(host_ns)
    for command in (
        ["link", "set", "lo", "up"],
        ["addr", "add", f"{HOST_V4}/32", "dev", "lo"],
        ["-6", "addr", "add", f"{HOST_V6}/128", "dev", "lo"],
    ):
        subprocess.run(["ip", "-n", host_ns, *command], check=True, timeout=30)
    ipamd = Ipamd.start(workdir, IPV6_MODE)
    try:
        ipamd.wait_ready()
        yield Node(ipamd, host_path, workdir / "v4egress")
    finally:
        code, log = ipamd.stop(), ipamd.log_tail()
        delete_netns(host_ns)
        shutil.rmtree(workdir, ignore_errors=True)
    assert code == 0, f"ipamd exited {code}:\n{log}"


def result(outcome: CniOutcome) -> Any:
    """The CNI result JSON, untyped for indexing."""
    return outcome.output


def routes(netns_path: str, family: str) -> set[tuple[str, str | None, str]]:
    return {
        (r["dst"], r.get("gateway"), r["dev"])
        for r in ip_json(netns_path, family, "route", "show", "table", "main")
    }


def neighbours(netns_path: str, family: str) -> set[tuple[str, str, str, str]]:
    return {
        (n["dst"], n.get("lladdr", ""), n["dev"], ",".join(n.get("state", [])))
        for n in ip_json(netns_path, family, "neigh", "show")
    }


def sysctl(netns_path: str, name: str) -> str:
    command = ["nsenter", f"--net={netns_path}", "sysctl", "-n", name]
    return subprocess.run(
        command, capture_output=True, text=True, check=True, timeout=30
    ).stdout.strip()


def test_add_makes_the_ipv6_interface_and_the_ipv4_egress_and_del_removes_them(
    node: Node, netns: NetnsFactory
) -> None:
    _, pod_path = netns()
    added = node.add("e2e-ipv6-add", pod_path, "web-1")
    assert added.returncode == 0, (added.output, added.stderr, node.ipamd.log_tail())
    host_name = veth_name("eni", "e2e", "web-1")
    egress_name = "v4-" + host_name[-11:]
    host_if, pod_if, egress_host_if, egress_pod_if = result(added)["interfaces"]
    assert host_if["name"] == host_name and egress_host_if["name"] == egress_name
    assert pod_if == {"name": "eth0", "mac": pod_if["mac"], "sandbox": pod_path}
    assert egress_pod_if == {"name": "v4if0", "mac": egress_pod_if["mac"], "sandbox": pod_path}
    (ip,) = result(added)["ips"]
    address = bare(ip["address"])
    assert ip == {"address": f"{address}/128", "gateway": "fe80::1", "interface": 1}
    assert ":" in address, "the pod's IP is its IPv6 address alone"
    assert result(added)["routes"] == [{"dst": "::/0", "gw": "fe80::1"}]
    assert node.ipamd.allocations(NETWORK) == {"e2e-ipv6-add/eth0": [address]}

    # The pod's eth0: IPv6 on, the /128 without DAD, fe80::1 at the host veth's MAC.
    pod = link(pod_path, "eth0")
    assert pod["mtu"] == MTU and pod["address"] == pod_if["mac"] and "UP" in pod["flags"]
    (v6,) = [a for a in pod["addr_info"] if a["family"] == "inet6" and a["scope"] == "global"]
    assert (v6["local"], v6["prefixlen"], v6.get("nodad")) == (address, 128, True)
    assert sysctl(pod_path, "net.ipv6.conf.all.disable_ipv6") == "0"
    assert sysctl(pod_path, "net.ipv6.conf.eth0.disable_ipv6") == "0"
    assert {("fe80::1", None, "eth0"), ("default", "fe80::1", "eth0")} <= routes(pod_path, "-6")
    assert ("fe80::1", host_if["mac"], "eth0", "PERMANENT") in neighbours(pod_path, "-6")
    # The node's side: the /128 routed to the veth, RAs off on it, IPv6 forwarded.
    host = link(node.host_netns, host_name)
    assert host["mtu"] == MTU and host["address"] == host_if["mac"] and "UP" in host["flags"]
    assert (address, None, host_name) in routes(node.host_netns, "-6")
    assert (address, pod_if["mac"], host_name, "PERMANENT") in neighbours(node.host_netns, "-6")
    assert sysctl(node.host_netns, f"net.ipv6.conf.{host_name}.accept_ra") == "0"
    assert sysctl(node.host_netns, "net.ipv6.conf.all.forwarding") == "1"

    # The egress pair: host-local's address as a /32 on v4if0 behind the subnet's first address.
    (egress_v4,) = node.held_by_host_local()
    egress_pod = link(pod_path, "v4if0")
    assert egress_pod["address"] == egress_pod_if["mac"] and "UP" in egress_pod["flags"]
    assert [
        (a["local"], a["prefixlen"]) for a in egress_pod["addr_info"] if a["family"] == "inet"
    ] == [(egress_v4, 32)]
    assert routes(pod_path, "-4") == {
        (EGRESS_GATEWAY, None, "v4if0"),
        ("default", EGRESS_GATEWAY, "v4if0"),
    }
    assert (EGRESS_GATEWAY, egress_host_if["mac"], "v4if0", "PERMANENT") in neighbours(
        pod_path, "-4"
    )
    assert (egress_v4, None, egress_name) in routes(node.host_netns, "-4")
    assert (egress_v4, egress_pod_if["mac"], egress_name, "PERMANENT") in neighbours(
        node.host_netns, "-4"
    )

    assert ping(pod_path, HOST_V6) == 0, "pod -> node over IPv6"
    assert ping(node.host_netns, address) == 0, "node -> pod over IPv6"
    assert ping(pod_path, HOST_V4) == 0, "pod -> node over the egress pair"
    assert ping(node.host_netns, egress_v4) == 0, "node -> pod over the egress pair"

    prev = {**node.conf(), "prevResult": added.output}
    checked = node.plugin("CHECK", prev, container_id="e2e-ipv6-add", netns=pod_path, ifname="eth0")
    assert checked.returncode == 0, checked.output

    deleted = node.plugin("DEL", prev, container_id="e2e-ipv6-add", netns=pod_path, ifname="eth0")
    assert deleted.returncode == 0, deleted.output
    assert not {host_name, egress_name} & netns_links(node.host_netns)
    assert not {"eth0", "v4if0"} & netns_links(pod_path)
    assert node.held_by_host_local() == set(), "host-local's address released"
    assert node.ipamd.allocations(NETWORK) == {}
    gone = node.plugin("CHECK", prev, container_id="e2e-ipv6-add", netns=pod_path, ifname="eth0")
    assert gone.returncode == 1


def test_without_v4egress_an_ipv6_pod_gets_its_interface_alone(
    node: Node, netns: NetnsFactory
) -> None:
    _, pod_path = netns()
    conf = node.conf(egress=False)
    added = node.add("e2e-ipv6-only", pod_path, "web-2", conf)
    assert added.returncode == 0, (added.output, added.stderr)
    assert [i["name"] for i in result(added)["interfaces"]] == [
        veth_name("eni", "e2e", "web-2"),
        "eth0",
    ]
    assert "v4if0" not in netns_links(pod_path) and node.held_by_host_local() == set()
    assert ping(pod_path, HOST_V6) == 0
    deleted = node.plugin("DEL", conf, container_id="e2e-ipv6-only", netns=pod_path, ifname="eth0")
    assert deleted.returncode == 0, deleted.output
    assert node.ipamd.allocations(NETWORK) == {}


def test_a_failed_egress_undoes_the_add_but_keeps_the_allocation(
    node: Node, netns: NetnsFactory
) -> None:
    name, pod_path = netns()
    subprocess.run(
        ["ip", "-n", name, "link", "add", "v4if0", "type", "veth", "peer", "name", "spare0"],
        check=True,
    )
    failed = node.add("e2e-ipv6-fail", pod_path, "web-3")
    assert failed.returncode == 1 and failed.error_code == 106, failed.output
    assert "egress" in str(failed.output["msg"])
    host_name = veth_name("eni", "e2e", "web-3")
    assert not {host_name, "v4-" + host_name[-11:]} & netns_links(node.host_netns)
    assert "eth0" not in netns_links(pod_path)
    assert node.held_by_host_local() == set(), "host-local's address released"
    assert list(node.ipamd.allocations(NETWORK)) == ["e2e-ipv6-fail/eth0"], "never DELETEd"
    deleted = node.plugin("DEL", container_id="e2e-ipv6-fail", netns=pod_path, ifname="eth0")
    assert deleted.returncode == 0, deleted.output
    assert node.ipamd.allocations(NETWORK) == {}


def test_check_fails_when_the_egress_veth_is_gone(node: Node, netns: NetnsFactory) -> None:
    _, pod_path = netns()
    added = node.add("e2e-ipv6-check", pod_path, "web-4")
    assert added.returncode == 0, (added.output, added.stderr)
    egress_name = result(added)["interfaces"][2]["name"]
    subprocess.run(
        ["nsenter", f"--net={node.host_netns}", "ip", "link", "del", egress_name], check=True
    )
    prev = {**node.conf(), "prevResult": added.output}
    checked = node.plugin(
        "CHECK", prev, container_id="e2e-ipv6-check", netns=pod_path, ifname="eth0"
    )
    assert checked.returncode == 1 and checked.error_code == 106, checked.output
    assert egress_name in str(checked.output.get("details"))
    deleted = node.plugin("DEL", prev, container_id="e2e-ipv6-check", netns=pod_path, ifname="eth0")
    assert deleted.returncode == 0, deleted.output
    assert node.held_by_host_local() == set() and node.ipamd.allocations(NETWORK) == {}


@pytest.mark.parametrize(
    "block",
    [
        {"subnet": SUBNET, "dataDir": "/run/x"},
        {"ifname": "v4if0", "subnet": "169.254.172.0/31", "dataDir": "/run/x"},
        {"ifname": "v4if0", "subnet": SUBNET, "dataDir": "relative"},
        {"ifname": "eth0", "subnet": SUBNET, "dataDir": "/run/x"},
    ],
)
def test_a_bad_v4egress_block_is_a_config_error_before_anything_is_done(
    node: Node, netns: NetnsFactory, block: dict[str, object]
) -> None:
    _, pod_path = netns()
    conf = {**node.conf(), "v4Egress": block}
    bad = node.add("e2e-ipv6-bad", pod_path, "web-5", conf)
    assert bad.returncode == 1 and bad.error_code == 7, bad.output
    assert "v4Egress." in str(bad.output["msg"])
    assert node.ipamd.allocations(NETWORK) == {}
    assert veth_name("eni", "e2e", "web-5") not in netns_links(node.host_netns)


def test_a_retried_add_holds_one_egress_address_and_one_pair(
    node: Node, netns: NetnsFactory
) -> None:
    _, pod_path = netns()
    first = node.add("e2e-ipv6-retry", pod_path, "web-6")
    assert first.returncode == 0, (first.output, first.stderr)
    assert len(node.held_by_host_local()) == 1
    # host-local refuses the attachment a second address: the plugin releases the first and asks
    # again (host-local hands out the next address of its range).
    again = node.add("e2e-ipv6-retry", pod_path, "web-6")
    assert again.returncode == 0, (again.output, again.stderr)
    assert result(again)["ips"] == result(first)["ips"], "the same allocation"
    (egress_v4,) = node.held_by_host_local()
    addresses = link(pod_path, "v4if0")["addr_info"]
    assert [a["local"] for a in addresses if a["family"] == "inet"] == [egress_v4]
    names = [i["name"] for i in result(again)["interfaces"]]
    assert sorted(n for n in netns_links(node.host_netns) if n in names) == sorted(names[::2])
    assert {"eth0", "v4if0"} <= netns_links(pod_path)
    deleted = node.plugin("DEL", container_id="e2e-ipv6-retry", netns=pod_path, ifname="eth0")
    assert deleted.returncode == 0, deleted.output
    assert node.held_by_host_local() == set() and node.ipamd.allocations(NETWORK) == {}
