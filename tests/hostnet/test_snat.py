"""Tests of ipamd's SNAT and connmark table without a kernel: `render_ruleset` as a pure function,
the `NftSnatTable` adapter's refusals and failures, and the fake the daemon's tests use. The same table
in a real kernel is tests/hostnet/test_snat_kernel.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ipamd.hostnet.fake import FakeSnatTable
from ipamd.hostnet.ports import HostNetError, KernelUnreadable
from ipamd.hostnet.snat import (
    CONNMARK,
    TABLE,
    NftSnatTable,
    SnatTable,
    normalize_listing,
    render_ruleset,
)
from tests.hostnet.plans import PLAN

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


def test_inbound_connections_are_marked_before_dnat_as_vpc_cni_marks_them() -> None:
    # VPC CNI: mangle PREROUTING `-i eth0 -m addrtype --dst-type LOCAL --limit-iface-in -j CONNMARK
    # --set-mark 0x80/0x80` (aws/amazon-vpc-cni-k8s v1.23.1, pkg/networkutils/network.go).
    script = render_ruleset(replace(PLAN, node_port=True))
    inbound = script.split("chain inbound {")[1].split("\t}")[0]
    assert "type filter hook prerouting priority mangle; policy accept;" in inbound, "before DNAT"
    assert (
        'iifname "eth0" fib daddr . iif type local ct mark set ct mark | 0x00000080 comment'
        in inbound
    )
    assert "chain inbound" not in render_ruleset(PLAN), "AWS_VPC_CNI_NODE_PORT_SUPPORT=false"


def test_without_snat_the_table_only_marks_inbound_and_routes_replies() -> None:
    script = render_ruleset(replace(PLAN, snat=False, node_port=True))
    assert "snat to" not in script and "set exempt" not in script
    assert "ct state new" not in script, "pods' outbound connections are not marked"
    assert "iifname != @eni_links ct mark & 0x00000080 == 0x00000080" in script, "replies restored"
    assert "chain inbound" in script
    with pytest.raises(ValueError, match="no table"):
        render_ruleset(replace(PLAN, snat=False, node_port=False))


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
