"""The takeover from aws-node against a real kernel, as root, in a network namespace the test makes:
the namespace is prepared as aws-node leaves a node (VPC CNI's rules without ipamd's protocol, its
ENI table, its SNAT and connmark chains through iptables-nft, its `ip aws-cni` table and, when
iptables-legacy is installed, its legacy chains), then one datapath reconcile runs on the real
adapters (netlink, nft, iptables-legacy) inside it.

Every command runs in that namespace (`ip -n`, `ip netns exec`), which is deleted in teardown. Skipped
when not root or when ip, nft or iptables-nft is missing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from datastore.records import EniRecord
from ipamd.config.groups import DatapathSettings
from ipamd.engine.engine import Engine
from ipamd.hostnet.aws_snat import NftAwsNodeSnat
from ipamd.hostnet.datapath import Datapath
from ipamd.hostnet.netlink import NetlinkHostNetwork
from ipamd.hostnet.ports import RT_PROTO_IPAMD
from ipamd.hostnet.snat import NftSnatTable
from tests.support.node import NodeFixture, key

LEGACY = shutil.which("iptables-legacy-save") and shutil.which("iptables-legacy-restore")
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        os.geteuid() != 0 or not all(shutil.which(t) for t in ("ip", "nft", "iptables-nft")),
        reason="needs root, ip (iproute2), nft (nftables) and iptables-nft (iptables)",
    ),
]

PRIMARY_MAC = "02:00:00:00:10:00"
SECONDARY_MAC = "02:00:00:00:10:01"
NODE_IP = "10.0.0.5"
ENI_IP = "10.0.0.20"
GATEWAY = "10.0.0.1"
ON_PRIMARY, ON_SECONDARY, GONE = "10.0.0.10", "10.0.0.21", "10.0.0.22"

VPC_CNI_RULES = [
    f"to {ON_PRIMARY}/32 lookup main pref 512",
    f"to {ON_SECONDARY}/32 lookup main pref 512",
    f"to {GONE}/32 lookup main pref 512",
    "fwmark 0x80/0x80 lookup main pref 1024",
    f"from {ON_SECONDARY}/32 lookup 2 pref 1536",
    f"from {GONE}/32 lookup 2 pref 1536",
    f"from {ENI_IP}/32 lookup 2 pref 32765",
]
SOMEONE_ELSES_RULE = "to 192.168.5.5/32 lookup main pref 512"

# VPC CNI's chains (pkg/networkutils, v1.23), as aws-node's iptables-nft makes them, and rules of
# kube-proxy's and another's that must stay.
IPTABLES = [
    "-t nat -N AWS-SNAT-CHAIN-0",
    "-t nat -A POSTROUTING -m comment --comment 'AWS SNAT CHAIN' -j AWS-SNAT-CHAIN-0",
    "-t nat -A AWS-SNAT-CHAIN-0 -d 10.0.0.0/16 -m comment --comment 'AWS SNAT CHAIN' -j RETURN",
    "-t nat -A AWS-SNAT-CHAIN-0 ! -o vlan+ -m comment --comment 'AWS, SNAT'"
    " -m addrtype ! --dst-type LOCAL -j SNAT --to-source 10.0.0.5 --random-fully",
    "-t nat -N AWS-CONNMARK-CHAIN-0",
    "-t nat -A PREROUTING -i eni+ -m comment --comment 'AWS, outbound connections'"
    " -j AWS-CONNMARK-CHAIN-0",
    "-t nat -A PREROUTING -m comment --comment 'AWS, CONNMARK'"
    " -j CONNMARK --restore-mark --mask 0x80",
    "-t nat -A AWS-CONNMARK-CHAIN-0 -d 10.0.0.0/16 -m comment --comment 'AWS CONNMARK CHAIN'"
    " -j RETURN",
    "-t nat -A AWS-CONNMARK-CHAIN-0 -m comment --comment 'AWS, CONNMARK'"
    " -j CONNMARK --set-xmark 0x80/0x80",
    "-t mangle -A PREROUTING -m comment --comment 'AWS, primary ENI' -i eth0"
    " -m addrtype --dst-type LOCAL --limit-iface-in -j CONNMARK --set-mark 0x80/0x80",
    "-t mangle -A PREROUTING -m comment --comment 'AWS, primary ENI' -i eni+"
    " -j CONNMARK --restore-mark --mask 0x80",
]
KEPT = [
    "-t nat -N KUBE-POSTROUTING",
    "-t nat -A POSTROUTING -m comment --comment 'kubernetes postrouting rules' -j KUBE-POSTROUTING",
    "-t nat -A KUBE-POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE",
    "-t mangle -A PREROUTING -i eth0 -j MARK --set-mark 0x1",
]
AWS_CNI_TABLE = """table ip aws-cni {
\tchain nat-prerouting {
\t\ttype nat hook prerouting priority -90; policy accept;
\t\tfib daddr type local return
\t\tiifname "eni*" counter jump snat-mark
\t\tcounter ct mark & 0x80 == 0x80 meta mark set ct mark & 0x80
\t}
\tchain snat-mark {
\t\tip daddr 10.0.0.0/16 return
\t\tct mark set ct mark | 0x80
\t}
}
"""


def run(ns: str, *argv: str, stdin: str | None = None) -> str:
    """A command inside the test's namespace: the only way this module touches the network."""
    assert ns.startswith("ipamd-takeover-"), "refusing to run outside the test namespace"
    done = subprocess.run(
        ["ip", "netns", "exec", ns, *argv],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert done.returncode == 0, f"{argv}: {done.stderr}"
    return done.stdout


def ip_json(ns: str, *args: str) -> Any:
    return json.loads(run(ns, "ip", "-j", *args) or "[]")


@pytest.fixture
def netns() -> Iterator[str]:
    name = f"ipamd-takeover-{uuid.uuid4().hex[:8]}"
    created = subprocess.run(
        ["ip", "netns", "add", name], capture_output=True, text=True, check=False
    )
    if created.returncode != 0:
        pytest.skip(f"cannot create a network namespace: {created.stderr.strip()}")
    try:
        _as_aws_node_left_it(name)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


def _as_aws_node_left_it(ns: str) -> None:
    for link, peer, mac in (("eth0", "peer0", PRIMARY_MAC), ("eth1", "peer1", SECONDARY_MAC)):
        run(ns, "ip", "link", "add", link, "address", mac, "type", "veth", "peer", peer)
        run(ns, "ip", "link", "set", peer, "up")
        run(ns, "ip", "link", "set", link, "up")
    run(ns, "ip", "addr", "add", f"{NODE_IP}/24", "dev", "eth0")
    run(ns, "ip", "addr", "add", f"{ENI_IP}/24", "dev", "eth1", "noprefixroute")
    run(ns, "ip", "route", "add", GATEWAY, "dev", "eth1", "scope", "link", "table", "2")
    run(ns, "ip", "route", "add", "default", "via", GATEWAY, "dev", "eth1", "table", "2")
    for rule in [*VPC_CNI_RULES, SOMEONE_ELSES_RULE]:
        run(ns, "ip", "rule", "add", *rule.split())
    for line in [*IPTABLES, *KEPT]:
        run(ns, "sh", "-c", f"iptables-nft {line}")
    run(ns, "nft", "-f", "-", stdin=AWS_CNI_TABLE)
    if LEGACY:
        for line in IPTABLES:
            run(ns, "sh", "-c", f"iptables-legacy {line}")


async def _subnet(_: str) -> str:
    return "10.0.0.0/24"


async def _vpc(_: str) -> tuple[str, ...]:
    return ("10.0.0.0/16",)


@pytest.fixture
async def datapath(netns: str, node: NodeFixture) -> AsyncIterator[Datapath]:
    engine = await node.open()
    host = NetlinkHostNetwork(netns=netns)
    await host.open()
    in_ns = ("ip", "netns", "exec", netns)
    save = (*in_ns, "iptables-legacy-save") if LEGACY else None
    restore = (*in_ns, "iptables-legacy-restore", "--noflush") if LEGACY else None
    try:
        dp = Datapath(
            engine,
            host,
            NftSnatTable((*in_ns, "nft")),
            DatapathSettings(eni_mtu=1500),
            node_ip=NODE_IP,
            subnet_cidr=_subnet,
            vpc_cidrs=_vpc,
            clock=node.clock,
            aws_node_snat=NftAwsNodeSnat((*in_ns, "nft"), save, restore),
        )
        await _adopted(engine, node.clock.now())
        yield dp
    finally:
        await host.close()


async def _adopted(engine: Engine, now: float) -> None:
    """The state as the engine's adoption leaves it: the ENIs, and an allocation per live pod."""
    await engine.add_eni(EniRecord("eni-0", 0, "s", True, now, mac=PRIMARY_MAC, primary_ip=NODE_IP))
    await engine.add_units("eni-0", [f"{ON_PRIMARY}/32"], "ip")
    await engine.add_eni(
        EniRecord("eni-1", 1, "s", False, now, mac=SECONDARY_MAC, primary_ip=ENI_IP)
    )
    await engine.add_units("eni-1", [f"{ON_SECONDARY}/32", f"{GONE}/32"], "ip")
    for eni_id in list(engine.blocked_enis):  # as if its link were set up: pods are placed on it
        engine.unblock_eni(eni_id)
    first = await engine.assign(key("on-primary"))
    second = await engine.assign(key("on-secondary"))
    assert (first.addresses, second.addresses) == ((ON_PRIMARY,), (ON_SECONDARY,))


def rules(ns: str) -> set[tuple[int, str, str]]:
    """(priority, what it matches and where it sends, protocol) of the takeover's priorities."""
    shown = set()
    for r in ip_json(ns, "-4", "rule", "show"):
        if r["priority"] not in (512, 1024, 1536, 32765):
            continue
        match = " ".join(
            f"{k} {r[k]}" for k in ("src", "dst", "fwmark", "fwmask") if k in r and r[k] != "all"
        )
        shown.add((r["priority"], f"{match} lookup {r['table']}", str(r.get("protocol", "-"))))
    return shown


def _saved(ns: str, tool: str) -> list[str]:
    text = run(ns, tool)
    return [
        re.sub(r"\[\d+:\d+\]", "", line)
        for line in text.splitlines()
        if line and not line.startswith("#")
    ]


def kernel(ns: str) -> tuple[object, ...]:
    legacy = _saved(ns, "iptables-legacy-save") if LEGACY else []
    return (
        run(ns, "ip", "-4", "rule", "show"),
        run(ns, "ip", "-4", "route", "show", "table", "all"),
        re.sub(r"packets \d+ bytes \d+", "", run(ns, "nft", "list", "ruleset")),
        legacy,
    )


async def test_one_reconcile_takes_the_node_over_and_a_second_changes_nothing(
    netns: str, datapath: Datapath
) -> None:
    await datapath.reconcile()

    ipamd = str(RT_PROTO_IPAMD)
    assert rules(netns) == {
        (512, f"dst {ON_PRIMARY} lookup main", ipamd),
        (512, f"dst {ON_SECONDARY} lookup main", ipamd),
        (512, "dst 192.168.5.5 lookup main", "-"),
        (1024, "fwmark 0x80 fwmask 0x80 lookup main", ipamd),
        (1536, f"src {ON_SECONDARY} lookup 2", ipamd),
        (32765, f"src {ENI_IP} lookup 2", ipamd),
    }, "ipamd's rules only, and the one rule that is not VPC CNI's"
    table = ip_json(netns, "-4", "route", "show", "table", "2")
    assert sorted((r["dst"], r.get("gateway", ""), r["protocol"]) for r in table) == [
        (GATEWAY, "", ipamd),
        ("default", GATEWAY, ipamd),
    ], "claimed in place"

    ruleset = run(netns, "nft", "list", "ruleset")
    assert "table ip ipamd" in ruleset
    assert "AWS-" not in ruleset
    assert "table ip aws-cni" not in ruleset
    assert "ct mark and 0x80" not in ruleset and "ct mark or 0x80" not in ruleset
    saved = _saved(netns, "iptables-nft-save")
    assert [line for line in saved if line.startswith("-A")] == [
        "-A PREROUTING -i eth0 -j MARK --set-xmark 0x1/0xffffffff",
        '-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING',
        "-A KUBE-POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE",
    ], "every rule that is not VPC CNI's stays"
    if LEGACY:
        assert not any("AWS" in line for line in _saved(netns, "iptables-legacy-save"))

    fixes = dict(datapath.health.fixes)
    assert fixes["takeover_rule_removed"] == 7
    assert not datapath.health.takeover_failures

    before = kernel(netns)
    diff = await datapath.reconcile()
    assert diff.is_empty()
    assert kernel(netns) == before, "a second pass changes nothing"
    assert dict(datapath.health.fixes) == fixes


async def test_the_netlink_adapter_lists_and_deletes_only_vpc_cnis_shapes(netns: str) -> None:
    run(
        netns,
        "ip",
        "rule",
        "add",
        "from",
        f"{GONE}/32",
        "iif",
        "eth0",
        "lookup",
        "2",
        "pref",
        "1536",
    )
    host = NetlinkHostNetwork(netns=netns)
    await host.open()
    try:
        foreign = await host.list_rules(foreign=True)
        assert len(foreign) == len(VPC_CNI_RULES) + 1, "the rule with an iif is not listed"
        assert await host.list_rules() == frozenset(), "none of ipamd's yet"
        routes = await host.list_routes(foreign=True)
        assert {(r.table, r.dst, r.gateway) for r in routes} == {
            (2, f"{GATEWAY}/32", ""),
            (2, "0.0.0.0/0", GATEWAY),
        }, "only the ENI table's: main's and local's are never listed"

        twin = next(r for r in foreign if r.dst == f"{ON_PRIMARY}/32")
        await host.add_rules([twin])
        await host.delete_rules([twin], foreign=True)
        assert await host.list_rules() == {twin}, "ipamd's twin stays"
        assert twin not in await host.list_rules(foreign=True)
        iif = [r for r in ip_json(netns, "-4", "rule", "show") if r.get("iif") == "eth0"]
        assert len(iif) == 1, "a rule with other selectors is never taken"
    finally:
        await host.close()
