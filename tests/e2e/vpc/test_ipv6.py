"""End to end (c), IPv6: the dual-stack emulated VPC's fabric on its own (`fabric_ipv6`, no ipamd).

A namespace standing for a pod, with an address in the /80 EC2 assigned to the primary ENI, reaches
the VPC host over IPv6 and back, while a spoofed source is dropped and counted by IPv6's
source/destination check. `test_ipv6_node` runs ipamd in IPv6 mode on the same fabric.
"""

from __future__ import annotations

import ipaddress
import json
import sys
from collections.abc import Iterator

import pytest

from bench.vpc.fabric import Namespaces, ip, netns_path, read_counters, sysctl
from bench.vpc.fabric_ipv6 import NFT6_FAMILY, ROUTER_LINK_LOCAL, link_local
from bench.vpc.processes import add_netns, make_workdir, wait_until
from tests.e2e.support import require, require_root
from tests.e2e.vpc.harness import VpcNode
from tests.e2e.vpc.probes6 import ec2_prefixes, ping

pytestmark = pytest.mark.timeout(600)


def sdc6_drops(node: VpcNode) -> int:
    """Packets IPv6's source/destination check dropped, on every ENI."""
    return sum(read_counters(node.ns.vpc, NFT6_FAMILY).values())


@pytest.fixture
def world_node() -> Iterator[VpcNode]:
    """A dual-stack world with nothing running in the node: no containerd, no ipamd."""
    require_root()
    require("ip", "nsenter", "nft", "ping")
    node = VpcNode(make_workdir("vpc6"), Namespaces.unique())
    try:
        node.start_world(ipv6=True)
        yield node
    except BaseException:
        print(node.diagnostics(), file=sys.stderr)
        raise
    finally:
        node.close()


def plug_pod(node: VpcNode, address: str) -> str:
    """A namespace wired as ipamd wires an IPv6 pod: `address`/128 on its eth0, default via fe80::1
    with a permanent neighbour entry (the host veth's MAC), and on the node a route to `address` by
    the host veth, IPv6 forwarding on. Returns the namespace's name."""
    name = f"{node.ns.node}-pod"
    add_netns(name)
    node.made_namespaces.append(name)
    host_link = "v6pod"
    ip(node.ns.node, *f"link add {host_link} type veth peer name eth0 netns {name}".split())
    sysctl(node.ns.node, f"net.ipv6.conf.{host_link}.accept_dad", "0")
    sysctl(node.ns.node, "net.ipv6.conf.all.forwarding", "1")
    ip(node.ns.node, "link", "set", host_link, "up")
    ip(node.ns.node, "-6", "route", "add", f"{address}/128", "dev", host_link)
    mac = json.loads(ip(node.ns.node, "-j", "link", "show", "dev", host_link))[0]["address"]
    ip(name, "link", "set", "lo", "up")
    ip(name, "addr", "add", f"{address}/128", "dev", "eth0", "nodad")
    ip(name, "link", "set", "eth0", "up")
    ip(name, "-6", "route", "add", "default", "via", ROUTER_LINK_LOCAL, "dev", "eth0")
    ip(name, *f"neigh replace {ROUTER_LINK_LOCAL} lladdr {mac} dev eth0 nud permanent".split())
    return name


def test_the_fabric_delivers_an_assigned_80_and_drops_spoofed_ipv6(world_node: VpcNode) -> None:
    node = world_node
    ready = node.world_ready
    subnet = ipaddress.IPv6Network(ready.subnet_ipv6_cidr)
    assert ipaddress.IPv6Address(ready.vpc_host_ipv6) in ipaddress.IPv6Network(ready.vpc_ipv6_cidr)
    assert ipaddress.IPv6Address(ready.vpc_host_ipv6) not in subnet, "the VPC host is elsewhere"
    assert ec2_prefixes(node) == [], "no /80 before one is assigned"
    (prefix,) = ec2_prefixes(node, "assign")
    network = ipaddress.IPv6Network(prefix)
    assert network.prefixlen == 80 and network.subnet_of(subnet), prefix

    def delivered() -> str | None:
        return ip(node.ns.vpc, "-6", "route", "show", prefix).strip() or None

    route = wait_until(delivered, f"the VPC's route to {prefix}", 10.0)
    node_link_local = link_local(ready.primary_mac)
    assert f"via {node_link_local} dev en0" in route, route
    eth0 = ip(node.ns.node, "-6", "addr", "show", "dev", "eth0", "scope", "link")
    assert f"{node_link_local}/64" in eth0, f"the kernel derives the same link-local: {eth0}"
    pod = str(network[0x5])
    pod_ns = plug_pod(node, pod)
    netns = netns_path(pod_ns)
    wait_until(lambda: ping(netns, ready.vpc_host_ipv6) or None, "a first IPv6 echo reply", 10.0)
    assert ping(netns, ready.vpc_host_ipv6, count=10) == 10, "the pod reaches the VPC host"
    vpchost = netns_path(node.ns.vpchost)
    assert ping(vpchost, pod, count=10) == 10, "the VPC host reaches the pod"
    assert sdc6_drops(node) == 0, node.sdc_drops()

    spoofed = str(subnet[0x99])  # in the subnet, outside the ENI's /80: not the ENI's
    assert ipaddress.IPv6Address(spoofed) not in network
    ip(pod_ns, "addr", "add", f"{spoofed}/128", "dev", "eth0", "nodad")
    assert ping(netns, ready.vpc_host_ipv6, "-I", spoofed, count=3) == 0
    assert sdc6_drops(node) == 3, "each spoofed echo request dropped and counted"
    assert node.sdc_drops() == {ready.primary_eni_id: 3}, "counted against the primary ENI"
