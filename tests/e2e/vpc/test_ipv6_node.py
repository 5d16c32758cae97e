"""End to end (c), an IPv6 node: ipamd in IPv6 mode (VPC CNI's ENABLE_IPv6=true, ENABLE_IPv4=false,
ENABLE_PREFIX_DELEGATION=true) in a dual-stack emulated VPC (`fabric_ipv6`). Pods over containerd get
/128s of the primary ENI's /80 and reach the VPC host over IPv6, and the IPv4 internet through their
IPv4 egress interface, SNATed to the node's primary address; after a restart that loses ipamd's
nftables table, the SNAT is back by the time ipamd reports ready.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bench.vpc.fabric import INET_HOST, in_netns, netns_path, run
from bench.vpc.processes import wait_until
from tests.e2e.support import netns_addresses
from tests.e2e.vpc.harness import VpcNode, vpc_node
from tests.e2e.vpc.pings import Pings
from tests.e2e.vpc.probes6 import ec2_prefixes, ping

pytestmark = pytest.mark.timeout(600)

V4_EGRESS = ipaddress.IPv4Network("169.254.172.0/22")
"""VPC CNI's range for an IPv6 pod's IPv4 egress interface, SNATed to the node's primary address."""
PODS = 4
STEADY_AFTER_S = 1.0
"""Pings may lose what they send in their first second (neighbour discovery); none after it."""


def start_pods(node: VpcNode, count: int) -> dict[str, str]:
    names = [f"pod6-{i:02d}" for i in range(count)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        sandbox_ids = list(pool.map(node.run_pod, names))
    return dict(zip(sandbox_ids, names, strict=True))


def pod_addresses(netns: str) -> tuple[str, str]:
    """The pod's one global IPv6 address on eth0 and IPv4 address on v4if0, with prefix lengths."""
    (six,) = [a for a in netns_addresses(netns, "eth0") if ":" in a]
    (four,) = netns_addresses(netns, "v4if0")
    return six, four


def snat_tables(node: VpcNode) -> list[tuple[str, str]]:
    """(family, name) of every nftables table in the node with a rule naming the IPv4 egress range."""
    listed = json.loads(run(in_netns(node.ns.node, "nft", "-j", "list", "ruleset")))["nftables"]
    return sorted(
        {
            (str(item["rule"]["family"]), str(item["rule"]["table"]))
            for item in listed
            if "rule" in item and str(V4_EGRESS.network_address) in json.dumps(item["rule"])
        }
    )


def snat_rule_text(node: VpcNode) -> str:
    """The node's nftables rules that name the IPv4 egress range, one a line."""
    text = run(in_netns(node.ns.node, "nft", "list", "ruleset"))
    return "\n".join(line.strip() for line in text.splitlines() if str(V4_EGRESS) in line)


def egress_state(node: VpcNode, paths: list[str]) -> str:
    """What the IPv4 egress path looked like when a pod's pings went unanswered, for the failure's
    message: each pod's IPv4 routes and neighbours, the node's neighbours and IPv4 routes, and the
    node's connection-tracking entries toward the internet host."""

    def read(argv: list[str]) -> str:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        return (done.stdout + done.stderr).strip()

    lines = []
    for path in paths:
        for what in (["ip", "-4", "route"], ["ip", "-4", "neigh"]):
            lines.append(
                f"pod {path}: {' '.join(what)}\n{read(['nsenter', f'--net={path}', *what])}"
            )
    for what in (["ip", "-4", "route", "show", "table", "all"], ["ip", "-4", "neigh"]):
        lines.append(f"node: {' '.join(what)}\n{read(in_netns(node.ns.node, *what))}")
    tracked = read(in_netns(node.ns.node, "cat", "/proc/net/nf_conntrack"))
    lines.append(
        "node: conntrack to "
        + INET_HOST
        + "\n"
        + "\n".join(line for line in tracked.splitlines() if INET_HOST in line)
    )
    return "\n".join(lines)


def assert_pods_reach_both(node: VpcNode, netns: dict[str, str], addresses: list[str]) -> None:
    """Each pod (`netns`: name → namespace path) pings the VPC host over IPv6 without a loss after
    its first second, and the IPv4 internet host through its IPv4 egress; the VPC host pings each
    pod's IPv6 address (`addresses`); nothing is dropped on the way."""
    ready = node.world_ready
    pings = Pings(node.workdir)
    try:
        started = time.time()
        for name, path in netns.items():
            pings.start(name, path, ready.vpc_host_ipv6)

        def enough() -> bool | None:
            logs = [p.read_text(errors="replace") for p in pings.logs.values()]
            return True if all(log.count("bytes from") >= 15 for log in logs) else None

        wait_until(enough, "15 echo replies per pod", 30.0)
        outcome = pings.stop()
    finally:
        pings.close()
    lost = {k: v.lost_after(started + STEADY_AFTER_S) for k, v in outcome.items()}
    assert all(not v for v in lost.values()), f"IPv6 echo requests lost: {lost}"
    failed = [name for name, path in netns.items() if ping(path, INET_HOST, "-4", count=3) != 3]
    assert not failed, f"no IPv4 egress from {failed}:\n{snat_rule_text(node)}\n" + egress_state(
        node, [netns[name] for name in failed]
    )
    vpchost = netns_path(node.ns.vpchost)
    unanswered = [a for a in addresses if ping(vpchost, a, count=3) != 3]
    assert not unanswered, f"the VPC host got no answer from {unanswered} (no SNAT for IPv6)"
    drops = node.sdc_drops()
    assert set(drops.values()) == {0}, f"source/destination check drops: {drops}"
    assert node.igw_drops() == 0, "the internet gateway saw an address other than the node's"


def test_ipv6_pods_reach_the_vpc_and_the_ipv4_internet_and_survive_a_restart(
    pause_image: Path,
) -> None:
    with vpc_node(pause_image, "on", ipv6=True) as node:
        names = start_pods(node, PODS)
        (prefix,) = ec2_prefixes(node)
        network = ipaddress.IPv6Network(prefix)
        netns = {name: node.netns_of(sandbox) for sandbox, name in names.items()}
        for name, path in netns.items():
            six, four = pod_addresses(path)
            address = ipaddress.IPv6Interface(six)
            assert address.network.prefixlen == 128 and address.ip in network, (name, six, prefix)
            assert ipaddress.IPv4Interface(four).ip in V4_EGRESS, (name, four)
        pods = node.pods(names)
        assert {p.eni_id for p in pods.values()} == {node.world_ready.primary_eni_id}, pods
        assert {p.address for p in pods.values()} == {
            str(ipaddress.IPv6Interface(pod_addresses(path)[0]).ip) for path in netns.values()
        }, "ipamd holds each pod's address"
        addresses = sorted(p.address for p in pods.values())
        assert_pods_reach_both(node, netns, addresses)

        tables = snat_tables(node)
        primary = node.world_ready.primary_ip
        assert tables and primary in snat_rule_text(node), f"SNAT to {primary}: {tables}"
        print(f"pods {addresses} of {prefix}; SNAT in {tables}:\n{snat_rule_text(node)}")
        assert node.daemon.stop() == 0
        for family, table in tables:  # what a reboot takes with it
            run(in_netns(node.ns.node, "nft", "delete", "table", family, table))
        assert snat_tables(node) == []
        node.start_ipamd()
        node.wait_ipamd_ready(every_s=0.02)
        assert snat_tables(node) == tables, "the SNAT is back when ipamd reports ready"
        assert primary in snat_rule_text(node), f"SNATed to {primary}:\n{snat_rule_text(node)}"
        assert_pods_reach_both(node, netns, addresses)
