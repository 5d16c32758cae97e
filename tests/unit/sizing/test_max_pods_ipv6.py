"""Max pods in IPv6 mode, as EKS computes it for an IPv6 cluster: the EKS AMI's max-pods calculator
run as with prefix delegation (`calc_prefixes` of eks_max_pods.txt, whose header says where each
figure comes from), over the instance type's ENIs, whatever the pool's mode, MAX_ENI or custom
networking; the kubelet's maxPods and IPAMD_MAX_PODS still win, in either family
(`test_max_pods.py`). IPv4 is unchanged."""

from __future__ import annotations

import pytest

from ipamd.sizing import (
    PREFIXES,
    SECONDARY_IPS,
    MaxPodsRule,
    NodeLimits,
    PoolTargets,
    compute_node_max_pods,
    compute_pod_limit,
    compute_pod_limit_rule,
)
from ipamd.sizing.max_pods import address_family
from tests.unit.sizing.test_eks_max_pods import EKS

M5_LARGE = EKS["m5.large"].limits


def test_ipv6_is_the_calculator_with_prefix_delegation_for_every_type() -> None:
    """Whatever mode and ENIs the caller passes: IPv6 counts the instance type's ENIs as prefixes."""
    mismatches = [
        (row.instance_type, strategy.kind, enis, got)
        for row in EKS.values()
        for strategy, enis in ((SECONDARY_IPS, row.enis), (PREFIXES, 1), (SECONDARY_IPS, 1))
        if (got := compute_node_max_pods(row.limits, strategy, enis, family="ipv6").value)
        != row.calc_prefixes
    ]
    assert mismatches == []


@pytest.mark.parametrize(
    ("instance_type", "expected", "rule"),
    [
        ("m5.large", 110, MaxPodsRule.LOW_CPU_CAP),
        ("t3.nano", 34, MaxPodsRule.PREFIX),
        ("a1.medium", 98, MaxPodsRule.PREFIX),
        ("c5.18xlarge", 250, MaxPodsRule.HIGH_CPU_CAP),
        ("m6i.metal", 250, MaxPodsRule.HIGH_CPU_CAP),
        # Xen has no prefixes: the calculator falls back to the secondary-IP formula, as in IPv4.
        ("c4.large", 29, MaxPodsRule.SECONDARY_IP),
        ("t2.micro", 4, MaxPodsRule.SECONDARY_IP),
    ],
)
def test_ipv6_figures_for_several_types(
    instance_type: str, expected: int, rule: MaxPodsRule
) -> None:
    row = EKS[instance_type]

    got = compute_node_max_pods(row.limits, SECONDARY_IPS, row.enis, family="ipv6")

    assert (got.value, got.rule, got.family) == (expected, rule, "ipv6")
    assert got.value == row.calc_prefixes
    assert got.enis_for_pods == row.enis


def test_ipv4_is_unchanged_by_the_family_argument() -> None:
    for row in EKS.values():
        for strategy in (SECONDARY_IPS, PREFIXES):
            default = compute_node_max_pods(row.limits, strategy, row.enis)
            ipv4 = compute_node_max_pods(row.limits, strategy, row.enis, family="ipv4")
            assert ipv4 == default and default.family == "ipv4"
    assert compute_node_max_pods(M5_LARGE, SECONDARY_IPS, 3).value == 29


def test_the_pod_limit_ignores_max_eni_and_custom_networking_in_ipv6() -> None:
    """MAX_ENI caps the ENIs the IPv4 pool may attach; IPv6 pods take /128s from the primary ENI's
    /80, so neither it nor custom networking (refused with IPv6) lowers EKS's figure."""
    targets = PoolTargets(max_eni=1, custom_networking=True)

    ipv6 = compute_pod_limit_rule(targets, M5_LARGE, SECONDARY_IPS, "ipv6")
    ipv4 = compute_pod_limit_rule(targets, M5_LARGE, SECONDARY_IPS)

    assert (ipv6.value, ipv6.enis_for_pods, ipv6.custom_networking) == (110, 3, False)
    assert (ipv4.value, ipv4.enis_for_pods, ipv4.custom_networking) == (2, 0, True)
    assert compute_pod_limit(PoolTargets(max_pods=40), M5_LARGE, PREFIXES, "ipv6") == 40
    assert compute_pod_limit(PoolTargets(kubelet_max_pods=29), M5_LARGE, PREFIXES, "ipv6") == 29


def test_the_reason_says_ipv6_counts_as_prefix_mode() -> None:
    got = compute_node_max_pods(M5_LARGE, SECONDARY_IPS, 3, family="ipv6")
    unknown_cpus = NodeLimits(3, 9, vcpus=None, nitro=True)

    assert got.reason == (
        "the 110 cap for 2 vCPUs; the prefix formula (IPv6 counts as prefix mode) gives 3 ENIs x "
        "144 addresses + 2 = 434"
    )
    assert compute_node_max_pods(unknown_cpus, SECONDARY_IPS, 1, family="ipv6").reason == (
        "prefix formula (IPv6 counts as prefix mode): 3 ENIs x 144 addresses + 2 = 434"
    )


def test_the_address_family_follows_enable_ipv6() -> None:
    assert (address_family(False), address_family(True)) == ("ipv4", "ipv6")
