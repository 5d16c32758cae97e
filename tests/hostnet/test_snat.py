"""Tests of ipamd's SNAT and connmark table: `render_ruleset` as a pure function, the `NftSnatTable`
adapter against a real kernel, the traffic it shapes, and the fake the daemon's tests use.

The root tests run `nft` and `ip` only inside network namespaces they create (`ipamd-snat-<pid>...`)
and delete in teardown, whatever happened; they never touch the machine's own namespace. They are
skipped when not root or when `nft` or `ip` is missing.
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

from ipamd.hostnet.fake import FakeSnatTable
from ipamd.hostnet.ports import HostNetError, KernelUnreadable
from ipamd.hostnet.snat import (
    CONNMARK,
    TABLE,
    NftSnatTable,
    SnatPlan,
    SnatTable,
    normalize_listing,
    render_ruleset,
)

PLAN = SnatPlan(
    primary_ip="10.0.1.10",
    primary_ifname="eth0",
    eni_ifnames=("eth0", "eth1"),
    exempt_cidrs=("10.0.0.0/16",),
    randomize="prng",
)

needs_root_nft = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("nft") is None or shutil.which("ip") is None,
    reason="needs root, nft (nftables) and ip (iproute2)",
)
root = [needs_root_nft, pytest.mark.timeout(120)]


# --- render_ruleset -----------------------------------------------------------------------------


def test_the_script_replaces_the_table_in_one_transaction() -> None:
    script = render_ruleset(PLAN)
    lines = script.splitlines()
    assert lines[:3] == ["table ip ipamd", "delete table ip ipamd", "table ip ipamd {"]
    assert lines[-1] == "}"
    assert script.count("delete") == 1
    assert TABLE == "ipamd"
    assert CONNMARK == 0x80


def test_rendering_is_deterministic_up_to_order_and_duplicates() -> None:
    shuffled = replace(
        PLAN,
        eni_ifnames=("eth1", "eth0", "eth1"),
        exempt_cidrs=("10.0.0.0/16", "10.0.0.0/16", "10.0.128.0/17"),
    )
    assert render_ruleset(shuffled) == render_ruleset(PLAN) == render_ruleset(PLAN)


def test_the_rules_say_what_they_do() -> None:
    script = render_ruleset(PLAN)
    assert '\t\telements = { "eth0", "eth1" }' in script
    assert "\t\telements = { 10.0.0.0/16 }" in script
    assert "type filter hook prerouting priority dstnat + 10; policy accept;" in script
    assert "type nat hook postrouting priority srcnat + 10; policy accept;" in script
    assert (
        "iifname != @eni_links ct state new ip daddr != @exempt fib daddr type != local"
        " ct mark set ct mark | 0x00000080 comment" in script
    )
    assert (
        "iifname != @eni_links ct mark & 0x00000080 == 0x00000080"
        " meta mark set meta mark | 0x00000080 comment" in script
    )
    assert (
        'iifname "eth0" ct mark & 0x00000080 == 0x00000080'
        " meta mark set meta mark | 0x00000080 comment" in script
    )
    assert 'oifname "eth0" ip daddr != @exempt fib saddr type != local snat to 10.0.1.10' in script
    rules = [line for line in script.splitlines() if " set " in line or " snat " in line]
    assert len(rules) == 4
    assert all(' comment "' in rule for rule in rules)
    assert "counter" not in script, "counters would make two listings of one table differ"


@pytest.mark.parametrize(
    ("randomize", "snat"),
    [
        ("prng", 'snat to 10.0.1.10 fully-random comment "'),
        ("hashrandom", 'snat to 10.0.1.10 random comment "'),
        ("none", 'snat to 10.0.1.10 comment "'),
    ],
)
def test_each_randomize_mode(randomize: str, snat: str) -> None:
    plan = replace(PLAN, randomize=randomize)  # type: ignore[arg-type]
    assert snat in render_ruleset(plan)


def test_exempt_cidrs_are_collapsed_and_host_bits_masked() -> None:
    plan = replace(
        PLAN,
        exempt_cidrs=("10.1.0.0/16", "10.0.0.0/16", "10.0.1.0/24", "192.168.1.7/24", "10.0.0.0/16"),
    )
    assert "\t\telements = { 10.0.0.0/15, 192.168.1.0/24 }" in render_ruleset(plan)


def test_no_exempt_cidr_leaves_the_set_empty() -> None:
    script = render_ruleset(replace(PLAN, exempt_cidrs=()))
    exempt_set = script.split("set exempt {")[1].split("}")[0]
    assert "elements" not in exempt_set


@pytest.mark.parametrize(
    "hostile",
    [
        {"primary_ip": '10.0.1.10 comment "x"; flush ruleset'},
        {"primary_ip": "10.0.1.256"},
        {"primary_ip": "010.0.1.10"},
        {"primary_ip": "fe80::1"},
        {"primary_ip": "0.0.0.0"},
        {"primary_ip": "10.0.1.10\n"},
        {"primary_ifname": 'eth0"; flush ruleset; "', "eni_ifnames": ('eth0"; flush ruleset; "',)},
        {"primary_ifname": "eth2"},
        {"eni_ifnames": ("eth0", "")},
        {"eni_ifnames": ("eth0", "a" * 16)},
        {"eni_ifnames": ("eth0", "eth*")},
        {"eni_ifnames": ("eth0", "eth1 }")},
        {"eni_ifnames": ("eth0", "eth1\n")},
        {"eni_ifnames": ("eth0", "../x")},
        {"eni_ifnames": ("eth0", "\uff45th1")},
        {"exempt_cidrs": ("10.0.0.0/16 }",)},
        {"exempt_cidrs": ("10.0.0.0/16, 0.0.0.0/0",)},
        {"exempt_cidrs": ("10.0.0.0/33",)},
        {"exempt_cidrs": ("fd00::/8",)},
        {"exempt_cidrs": ("",)},
        {"randomize": "fully-random; flush ruleset"},
    ],
)
def test_hostile_input_is_refused(hostile: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        render_ruleset(replace(PLAN, **hostile))  # type: ignore[arg-type]


def test_a_listing_is_compared_without_counter_values_or_layout() -> None:
    one = 'table ip ipamd {\n\tchain c {\n\t\tiifname "x" counter packets 3 bytes 252\n\t}\n\n}\n'
    two = 'table ip ipamd {\n  chain c {\n    iifname "x" counter packets 0 bytes 0\n  }\n}'
    assert normalize_listing(one) == normalize_listing(two)
    assert "counter" in normalize_listing(one), "a counter someone added still shows"


# --- NftSnatTable without a kernel --------------------------------------------------------------


async def test_a_missing_nft_binary_names_the_package() -> None:
    table = NftSnatTable(("/nonexistent/ipamd-test/nft",))
    with pytest.raises(HostNetError, match="nftables"):
        await table.apply(PLAN)
    with pytest.raises(HostNetError, match="nftables"):
        await table.remove()


async def test_a_failing_listing_is_kernel_unreadable() -> None:
    table = NftSnatTable(("false",))
    with pytest.raises(KernelUnreadable):
        await table.matches(PLAN)
    with pytest.raises(KernelUnreadable):
        await table.apply(PLAN)
    with pytest.raises(KernelUnreadable):
        await table.remove()


async def test_a_hung_nft_times_out_as_kernel_unreadable() -> None:
    table = NftSnatTable(("sh", "-c", "sleep 30", "nft"), timeout_s=0.2)
    with pytest.raises(KernelUnreadable, match="timed out"):
        await table.matches(PLAN)


async def test_an_invalid_plan_is_refused_before_nft_runs() -> None:
    table = NftSnatTable(("/nonexistent/ipamd-test/nft",))
    with pytest.raises(ValueError):
        await table.apply(replace(PLAN, primary_ip="10.0.1.10; flush ruleset"))


# --- FakeSnatTable ------------------------------------------------------------------------------


async def test_the_fake_holds_a_plan_and_misbehaves_on_demand() -> None:
    fake = FakeSnatTable()
    table: SnatTable = fake
    assert not await table.matches(PLAN)
    assert await table.apply(PLAN) is True
    assert await table.apply(replace(PLAN, eni_ifnames=("eth1", "eth0"))) is False
    assert await table.matches(PLAN)
    fake.tamper()
    assert not await table.matches(PLAN)
    assert await table.apply(PLAN) is True
    assert (fake.applies, fake.changes) == (3, 2)
    fake.fail_apply = True
    with pytest.raises(HostNetError):
        await table.apply(replace(PLAN, randomize="none"))
    assert fake.plan == PLAN
    fake.fail_apply = False
    fake.unreadable = True
    with pytest.raises(KernelUnreadable):
        await table.matches(PLAN)
    fake.unreadable = False
    assert await table.remove() is True
    assert await table.remove() is False
    assert not await table.matches(PLAN)
    assert fake.removes == 1


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
