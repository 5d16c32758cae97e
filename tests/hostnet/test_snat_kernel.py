"""Tests of ipamd's SNAT and connmark table in a real kernel: the `NftSnatTable` adapter, and the
traffic it shapes through a node made of namespaces.

They run `nft` and `ip` only inside network namespaces they create (`ipamd-snat-<pid>...`) and delete
in teardown, whatever happened; they never touch the machine's own namespace. They are skipped when not
root or when `nft` or `ip` is missing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import replace

import pytest

from ipamd.hostnet.ports import KernelUnreadable
from ipamd.hostnet.snat import (
    CONNMARK,
    TABLE,
    NftSnatTable,
    SnatPlan,
    render_ruleset,
)
from tests.hostnet.plans import PLAN

needs_root_nft = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("nft") is None or shutil.which("ip") is None,
    reason="needs root, nft (nftables) and ip (iproute2)",
)
root = [needs_root_nft, pytest.mark.timeout(120)]


# --- NftSnatTable in a namespace of the test's own ----------------------------------------------


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=30)


def _ns_nft(ns: str, *args: str, script: str | None = None) -> str:
    done = _nft_script(ns, script, *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _nft_script(ns: str, script: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    argv = ("ip", "netns", "exec", ns, "nft", *args)
    return subprocess.run(
        argv, input=script, capture_output=True, text=True, check=False, timeout=30
    )


def _listing(ns: str, *flags: str) -> str | None:
    done = _run("ip", "netns", "exec", ns, "nft", *flags, "list", "table", "ip", TABLE, check=False)
    return done.stdout if done.returncode == 0 else None


@pytest.fixture
def netns() -> Iterator[str]:
    name = f"ipamd-snat-{os.getpid()}"
    _run("ip", "netns", "add", name)
    try:
        yield name
    finally:
        _run("ip", "netns", "del", name, check=False)


def _nft_in(ns: str) -> tuple[str, ...]:
    return ("ip", "netns", "exec", ns, "nft")


FOREIGN_NAT = """table ip nat {
\tchain POSTROUTING {
\t\ttype nat hook postrouting priority srcnat; policy accept;
\t\toifname "eth0" ip saddr 10.0.0.0/8 masquerade
\t}
}
"""


class TestNftSnatTable:
    pytestmark = root

    async def test_apply_creates_the_table_and_the_same_plan_again_changes_nothing(
        self, netns: str
    ) -> None:
        table = NftSnatTable(_nft_in(netns))
        assert _listing(netns) is None
        assert not await table.matches(PLAN)
        assert await table.apply(PLAN) is True
        listing = _listing(netns)
        assert listing is not None
        assert "10.0.0.0/16" in listing
        assert '"eth1"' in listing
        assert "snat to 10.0.1.10 fully-random" in listing
        assert await table.matches(PLAN)
        with_handles = _listing(netns, "-a")
        assert await table.apply(PLAN) is False
        assert _listing(netns, "-a") == with_handles, "not even re-applied: the handles are kept"

    async def test_ipv6_modes_table_snats_only_the_egress_range_and_replaces_ipv4s(
        self, netns: str
    ) -> None:
        egress = replace(PLAN, egress_cidr="169.254.172.0/22")
        table = NftSnatTable(_nft_in(netns))
        assert await table.apply(PLAN) is True
        assert await table.apply(egress) is True
        listing = _listing(netns)
        assert listing is not None
        assert "ip saddr 169.254.172.0/22 ip daddr != 224.0.0.0/4 snat to 10.0.1.10" in listing
        assert "prerouting" not in listing and "exempt" not in listing, "no connmark, no exempt"
        assert await table.matches(egress) and not await table.matches(PLAN)
        assert await table.apply(egress) is False

    async def test_the_kernel_takes_each_mix_of_snat_and_inbound_marks(self, netns: str) -> None:
        table = NftSnatTable(_nft_in(netns))
        inbound = replace(PLAN, node_port=True)
        assert await table.apply(inbound) is True
        listing = _listing(netns)
        assert listing is not None
        assert "type filter hook prerouting priority mangle; policy accept;" in listing
        assert 'iifname "eth0" fib daddr . iif type local ct mark set ct mark' in listing
        assert "snat to 10.0.1.10" in listing
        only_inbound = replace(inbound, snat=False)
        assert await table.apply(only_inbound) is True
        listing = _listing(netns)
        assert listing is not None
        assert "fib daddr . iif type local" in listing
        assert "snat" not in listing and "exempt" not in listing, "external SNAT: no SNAT"
        assert await table.matches(only_inbound) and await table.apply(only_inbound) is False

    async def test_a_fresh_adapter_reports_no_change_for_the_table_already_there(
        self, netns: str
    ) -> None:
        assert await NftSnatTable(_nft_in(netns)).apply(PLAN) is True
        fresh = NftSnatTable(_nft_in(netns))
        assert not await fresh.matches(PLAN), "it knows no listing of its own yet"
        assert await fresh.apply(PLAN) is False
        assert await fresh.matches(PLAN)

    async def test_a_changed_plan_replaces_the_table(self, netns: str) -> None:
        table = NftSnatTable(_nft_in(netns))
        await table.apply(PLAN)
        changed = replace(
            PLAN, eni_ifnames=("eth0",), exempt_cidrs=("172.16.0.0/12",), randomize="none"
        )
        assert await table.apply(changed) is True
        listing = _listing(netns)
        assert listing is not None
        assert "10.0.0.0/16" not in listing
        assert "172.16.0.0/12" in listing
        assert '"eth1"' not in listing
        assert "fully-random" not in listing
        assert await table.matches(changed)
        assert not await table.matches(PLAN)

    async def test_one_script_is_one_transaction(self, netns: str) -> None:
        """What `apply` relies on: a script that fails part-way leaves the old table whole."""
        table = NftSnatTable(_nft_in(netns))
        await table.apply(PLAN)
        before = _listing(netns, "-a")
        broken = render_ruleset(replace(PLAN, exempt_cidrs=("172.16.0.0/12",)))
        broken += "add rule ip ipamd no_such_chain accept\n"
        failed = _nft_script(netns, broken, "-f", "-")
        assert failed.returncode != 0
        assert "no_such_chain" in failed.stderr
        assert _listing(netns, "-a") == before
        assert await table.matches(PLAN)

    async def test_a_hand_edit_is_seen_and_undone(self, netns: str) -> None:
        table = NftSnatTable(_nft_in(netns))
        await table.apply(PLAN)
        _ns_nft(netns, "add", "rule", "ip", TABLE, "postrouting", "counter", "accept")
        assert not await table.matches(PLAN)
        assert await table.apply(PLAN) is True
        assert await table.matches(PLAN)

        chain = _ns_nft(netns, "-a", "list", "chain", "ip", TABLE, "prerouting")
        handle = re.search(r'iifname "eth0" ct mark .* # handle (\d+)', chain)
        assert handle is not None, chain
        _ns_nft(netns, "delete", "rule", "ip", TABLE, "prerouting", "handle", handle.group(1))
        assert not await table.matches(PLAN)
        assert await table.apply(PLAN) is True

        _ns_nft(netns, "add", "element", "ip", TABLE, "exempt", "{ 203.0.113.0/24 }")
        assert not await table.matches(PLAN)
        assert await table.apply(PLAN) is True
        assert await table.matches(PLAN)

    async def test_remove(self, netns: str) -> None:
        table = NftSnatTable(_nft_in(netns))
        assert await table.remove() is False
        await table.apply(PLAN)
        assert await table.remove() is True
        assert _listing(netns) is None
        assert not await table.matches(PLAN)
        assert await table.remove() is False

    async def test_a_foreign_table_is_untouched(self, netns: str) -> None:
        _ns_nft(netns, "-f", "-", script=FOREIGN_NAT)
        foreign = _ns_nft(netns, "-a", "list", "table", "ip", "nat")
        table = NftSnatTable(_nft_in(netns))
        await table.apply(PLAN)
        await table.apply(replace(PLAN, exempt_cidrs=("172.16.0.0/12",)))
        assert _ns_nft(netns, "-a", "list", "table", "ip", "nat") == foreign
        await table.remove()
        assert _ns_nft(netns, "-a", "list", "table", "ip", "nat") == foreign

    async def test_an_unreadable_kernel_is_kernel_unreadable(self) -> None:
        table = NftSnatTable(_nft_in(f"ipamd-snat-{os.getpid()}-absent"))
        with pytest.raises(KernelUnreadable):
            await table.matches(PLAN)


# --- traffic through a node of namespaces -------------------------------------------------------

POD_IP = "10.0.1.50"
PRIMARY_IP = "10.0.1.10"
OUTSIDE_IP = "198.51.100.10"
VPC_HOST_IP = "10.0.2.20"
SERVICE_IP = "172.20.0.10"
"""A ClusterIP outside the VPC CIDRs, DNATed (as kube-proxy does, in a table of its own) to a VPC
host: the destination that decides the mark is the one after DNAT."""

OUTSIDE_PROBE = f"""table ip probe {{
\tcounter from_primary {{
\t}}
\tcounter from_pod {{
\t}}
\tchain prerouting {{
\t\ttype filter hook prerouting priority raw; policy accept;
\t\tip saddr {PRIMARY_IP} icmp type echo-request counter name "from_primary"
\t\tip saddr {POD_IP} icmp type echo-request counter name "from_pod"
\t}}
}}
"""

NODE_PROBE = f"""table ip probe {{
\tcounter marked_from_pod {{
\t}}
\tcounter marked_from_eth0 {{
\t}}
\tchain forward {{
\t\ttype filter hook forward priority filter; policy accept;
\t\tiifname "vethpod" meta mark & 0x{CONNMARK:x} == 0x{CONNMARK:x} counter name "marked_from_pod"
\t\tiifname "eth0" meta mark & 0x{CONNMARK:x} == 0x{CONNMARK:x} counter name "marked_from_eth0"
\t}}
}}
table ip kubeproxy {{
\tchain prerouting {{
\t\ttype nat hook prerouting priority dstnat; policy accept;
\t\tip daddr {SERVICE_IP} dnat to {VPC_HOST_IP}
\t}}
}}
"""


class Node:
    """A pod ns, a node ns and an outside ns: the pod's veth ends in the node as `vethpod`, and the
    node's `eth0` (the primary ENI, holding 10.0.1.10) leads to the outside ns, which holds a host
    outside the VPC and one inside it, and routes back only to the node's 10.0.1.10."""

    def __init__(self) -> None:
        base = f"ipamd-snat-{os.getpid()}"
        self.pod, self.node, self.outside = f"{base}-pod", f"{base}-node", f"{base}-out"

    def build(self) -> None:
        pod, node, out = self.pod, self.node, self.outside
        for ns in (pod, node, out):
            _run("ip", "netns", "add", ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
        _run("ip", "-n", node, "link", "add", "eth0", "type", "veth", "peer", "eth0", "netns", out)
        _run(
            "ip", "-n", node, "link", "add", "vethpod", "type", "veth", "peer", "eth0", "netns", pod
        )
        for ns, link in ((node, "eth0"), (node, "vethpod"), (out, "eth0"), (pod, "eth0")):
            _run("ip", "-n", ns, "link", "set", link, "up")
        _run("ip", "netns", "exec", node, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        _run("ip", "-n", node, "addr", "add", f"{PRIMARY_IP}/32", "dev", "eth0")
        _run("ip", "-n", node, "addr", "add", "169.254.1.1/32", "dev", "vethpod")
        _run("ip", "-n", node, "route", "add", f"{POD_IP}/32", "dev", "vethpod")
        _run("ip", "-n", node, "route", "add", "198.51.100.0/24", "dev", "eth0")
        _run("ip", "-n", node, "route", "add", "10.0.2.0/24", "dev", "eth0")
        _run("ip", "-n", pod, "addr", "add", f"{POD_IP}/32", "dev", "eth0")
        _run("ip", "-n", pod, "route", "add", "169.254.1.1", "dev", "eth0", "scope", "link")
        _run("ip", "-n", pod, "route", "add", "default", "via", "169.254.1.1", "dev", "eth0")
        _run("ip", "-n", out, "addr", "add", f"{OUTSIDE_IP}/24", "dev", "eth0")
        _run("ip", "-n", out, "addr", "add", f"{VPC_HOST_IP}/32", "dev", "eth0")
        _run("ip", "-n", out, "route", "add", f"{PRIMARY_IP}/32", "dev", "eth0")
        _ns_nft(out, "-f", "-", script=OUTSIDE_PROBE)
        _ns_nft(node, "-f", "-", script=NODE_PROBE)

    def destroy(self) -> None:
        for ns in (self.pod, self.node, self.outside):
            _run("ip", "netns", "del", ns, check=False)

    def ping_from_pod(self, address: str) -> int:
        argv = ("ip", "netns", "exec", self.pod, "ping", "-n", "-c", "1", "-W", "2", address)
        return _run(*argv, check=False).returncode

    def counters(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for ns in (self.node, self.outside):
            listing = json.loads(_ns_nft(ns, "-j", "list", "counters", "table", "ip", "probe"))
            for item in listing["nftables"]:
                if "counter" in item:
                    found[item["counter"]["name"]] = item["counter"]["packets"]
        return found


@pytest.fixture
def topology() -> Iterator[Node]:
    node = Node()
    try:
        node.build()
        yield node
    finally:
        node.destroy()


def _node_plan(*exempt: str) -> SnatPlan:
    return SnatPlan(PRIMARY_IP, "eth0", ("eth0",), exempt, "prng")


@pytest.mark.timeout(120)
@needs_root_nft
class TestTraffic:
    async def test_pod_traffic_leaving_the_vpc_is_snated_to_the_primary_address(
        self, topology: Node
    ) -> None:
        await NftSnatTable(_nft_in(topology.node)).apply(_node_plan("10.0.0.0/16"))
        # A reply at all proves the SNAT: the outside routes back only to 10.0.1.10.
        assert topology.ping_from_pod(OUTSIDE_IP) == 0
        assert topology.counters() == {
            "from_primary": 1,
            "from_pod": 0,
            "marked_from_pod": 1,
            "marked_from_eth0": 1,
        }

    async def test_an_exempt_destination_keeps_the_pod_address(self, topology: Node) -> None:
        await NftSnatTable(_nft_in(topology.node)).apply(
            _node_plan("10.0.0.0/16", "198.51.100.0/24")
        )
        assert topology.ping_from_pod(OUTSIDE_IP) == 1, "no route back to the pod's own address"
        assert topology.counters() == {
            "from_primary": 0,
            "from_pod": 1,
            "marked_from_pod": 0,
            "marked_from_eth0": 0,
        }

    async def test_the_mark_follows_the_destination_after_dnat(self, topology: Node) -> None:
        """A service address outside the VPC DNATed to a VPC host: neither marked nor SNATed."""
        await NftSnatTable(_nft_in(topology.node)).apply(_node_plan("10.0.0.0/16"))
        assert topology.ping_from_pod(SERVICE_IP) == 1, "no route back to the pod's own address"
        assert topology.counters() == {
            "from_primary": 0,
            "from_pod": 1,
            "marked_from_pod": 0,
            "marked_from_eth0": 0,
        }
