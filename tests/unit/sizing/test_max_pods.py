"""Max pods as EKS computes it, against EKS's published figures for 34 instance types.

Sources of the expected numbers:
- `published`: VPC CNI's `misc/eni-max-pods.txt`, the generated table of ENIs x (IPv4 per ENI - 1)
  + 2 per instance type (secondary IPs, uncapped);
- `ips`, `ips_cn`, `prefixes`, `prefixes_cn`: the recommended value of the EKS AMI's
  `max-pods-calculator.sh` (`--cni-version 1.19.0`, alone, with `--cni-custom-networking-enabled`,
  with `--cni-prefix-delegation-enabled`, with both), run against each type's DescribeInstanceTypes
  answer. The EKS user guide quotes three of them for m5.large: 29, 20 with custom networking, 110
  with prefix delegation.

The limits (ENIs on the default network card, IPv4 per ENI, default vCPUs, hypervisor) are EC2's, as
moto's DescribeInstanceTypes data carries them; `test_the_table_holds_what_ec2_reports` checks that.
"""

from __future__ import annotations

from typing import NamedTuple

import pytest
from moto.ec2.models.instance_types import INSTANCE_TYPES

from cloud.ec2_answers import parse_limits
from ipamd.sizing import (
    PREFIXES,
    SECONDARY_IPS,
    MaxPods,
    MaxPodsRule,
    NodeLimits,
    PoolTargets,
    UnitStrategy,
    compute_max_pods,
    compute_node_max_pods,
    compute_pod_limit,
    compute_pod_limit_rule,
)
from ipamd.sizing.max_pods import AddressFamily
from tests.unit.sizing.simulation import addresses, fresh_node, settle


class Row(NamedTuple):
    instance_type: str
    enis: int
    ipv4_per_eni: int
    vcpus: int
    nitro: bool
    published: int
    ips: int
    ips_cn: int
    prefixes: int
    prefixes_cn: int

    @property
    def limits(self) -> NodeLimits:
        return NodeLimits(self.enis, self.ipv4_per_eni - 1, vcpus=self.vcpus, nitro=self.nitro)


# fmt: off
TABLE = [
    #   type             ENIs IPv4 vCPUs nitro  published ips  ips_cn prefixes prefixes_cn
    Row("t3.nano",          2,  2,   2, True,       4,   4,   3,     34,  18),
    Row("t4g.nano",         2,  2,   2, True,       4,   4,   3,     34,  18),
    Row("t3.small",         3,  4,   2, True,      11,  11,   8,    110,  98),
    Row("t3.medium",        3,  6,   2, True,      17,  17,  12,    110, 110),
    Row("t3.large",         3, 12,   2, True,      35,  35,  24,    110, 110),
    Row("t3.2xlarge",       4, 15,   8, True,      58,  58,  44,    110, 110),
    Row("c6g.medium",       2,  4,   1, True,       8,   8,   5,     98,  50),
    Row("m5.large",         3, 10,   2, True,      29,  29,  20,    110, 110),
    Row("m5.xlarge",        4, 15,   4, True,      58,  58,  44,    110, 110),
    Row("m5.4xlarge",       8, 30,  16, True,     234, 110, 110,    110, 110),
    Row("m5.8xlarge",       8, 30,  32, True,     234, 234, 205,    250, 250),
    Row("m5.16xlarge",     15, 50,  64, True,     737, 250, 250,    250, 250),
    Row("m5.24xlarge",     15, 50,  96, True,     737, 250, 250,    250, 250),
    Row("c5.large",         3, 10,   2, True,      29,  29,  20,    110, 110),
    Row("c5.4xlarge",       8, 30,  16, True,     234, 110, 110,    110, 110),
    Row("c5.9xlarge",       8, 30,  36, True,     234, 234, 205,    250, 250),
    Row("c5.18xlarge",     15, 50,  72, True,     737, 250, 250,    250, 250),
    Row("c6g.16xlarge",    15, 50,  64, True,     737, 250, 250,    250, 250),
    Row("r5.12xlarge",      8, 30,  48, True,     234, 234, 205,    250, 250),
    Row("r6i.32xlarge",    15, 50, 128, True,     737, 250, 250,    250, 250),
    Row("x2idn.32xlarge",  15, 50, 128, True,     737, 250, 250,    250, 250),
    Row("inf1.xlarge",      4, 10,   4, True,      38,  38,  29,    110, 110),
    Row("p4d.24xlarge",    15, 50,  96, True,     737, 250, 250,    250, 250),
    # Several network cards: only the default card's ENIs carry pods.
    Row("p5.48xlarge",      2, 50, 192, True,     100, 100,  51,    250, 250),
    Row("trn1.32xlarge",    5, 50, 128, True,     247, 247, 198,    250, 250),
    # Bare metal (Nitro, no hypervisor reported).
    Row("m5.metal",        15, 50,  96, True,     737, 250, 250,    250, 250),
    Row("m6i.metal",       15, 50, 128, True,     737, 250, 250,    250, 250),
    Row("m7g.metal",       15, 50,  64, True,     737, 250, 250,    250, 250),
    Row("a1.metal",         8, 30,  16, True,     234, 110, 110,    110, 110),
    # Xen: no prefixes, so prefix delegation changes nothing.
    Row("t2.medium",        3,  6,   2, False,     17,  17,  12,     17,  12),
    Row("m4.large",         2, 10,   2, False,     20,  20,  11,     20,  11),
    Row("i3.large",         3, 10,   2, False,     29,  29,  20,     29,  20),
    Row("d2.xlarge",        4, 15,   4, False,     58,  58,  44,     58,  44),
    Row("m4.10xlarge",      8, 30,  40, False,    234, 234, 205,    234, 205),
]
# fmt: on

IDS = [row.instance_type for row in TABLE]


def max_pods(
    row: Row,
    strategy: UnitStrategy,
    custom_networking: bool = False,
    override: int | None = None,
    kubelet: int | None = None,
) -> MaxPods:
    return compute_node_max_pods(
        row.limits,
        strategy,
        row.enis,
        custom_networking=custom_networking,
        override=override,
        kubelet=kubelet,
    )


def test_the_table_is_large_enough_and_spans_the_cap() -> None:
    assert len(TABLE) >= 20
    assert {row.vcpus <= 30 for row in TABLE} == {True, False}
    assert {row.nitro for row in TABLE} == {True, False}


@pytest.mark.parametrize("row", TABLE, ids=IDS)
def test_the_table_holds_what_ec2_reports(row: Row) -> None:
    limits = parse_limits(INSTANCE_TYPES[row.instance_type])
    assert (limits.max_enis, limits.ipv4_per_eni, limits.vcpus) == (
        row.enis,
        row.ipv4_per_eni,
        row.vcpus,
    )
    assert (limits.hypervisor == "nitro") is row.nitro


@pytest.mark.parametrize("row", TABLE, ids=IDS)
def test_secondary_ip_formula_is_the_published_table(row: Row) -> None:
    got = max_pods(row, SECONDARY_IPS)
    assert got.formula_pods == row.published
    assert got.formula is MaxPodsRule.SECONDARY_IP


@pytest.mark.parametrize("row", TABLE, ids=IDS)
def test_secondary_ip_mode(row: Row) -> None:
    assert max_pods(row, SECONDARY_IPS).value == row.ips


@pytest.mark.parametrize("row", TABLE, ids=IDS)
def test_secondary_ip_mode_with_custom_networking(row: Row) -> None:
    assert max_pods(row, SECONDARY_IPS, custom_networking=True).value == row.ips_cn


@pytest.mark.parametrize("row", TABLE, ids=IDS)
def test_prefix_mode(row: Row) -> None:
    assert max_pods(row, PREFIXES).value == row.prefixes


@pytest.mark.parametrize("row", TABLE, ids=IDS)
def test_prefix_mode_with_custom_networking(row: Row) -> None:
    assert max_pods(row, PREFIXES, custom_networking=True).value == row.prefixes_cn


@pytest.mark.parametrize(
    ("instance_type", "uncapped"),
    [
        # The calculator's `--show-max-allowed` with prefix delegation.
        ("t3.small", 146),
        ("m5.large", 434),
        ("m5.4xlarge", 3714),
        ("m5.16xlarge", 11762),
        ("p5.48xlarge", 1570),
        ("trn1.32xlarge", 3922),
        ("t2.medium", 17),
    ],
)
def test_prefix_formula_before_the_cap(instance_type: str, uncapped: int) -> None:
    row = next(r for r in TABLE if r.instance_type == instance_type)
    assert max_pods(row, PREFIXES).formula_pods == uncapped


def test_bare_metal_counts_prefixes_where_the_calculator_does_not() -> None:
    """A decision (`ipamd.sizing.max_pods`): ipamd assigns prefixes on bare metal, as VPC CNI does,
    so the prefix formula applies there. The calculator keys on the reported hypervisor, which
    bare metal lacks, and with MAX_ENI=1 on m5.metal it would say 1 x 49 + 2 = 51."""
    metal = next(r for r in TABLE if r.instance_type == "m5.metal")
    got = compute_node_max_pods(metal.limits, PREFIXES, 1)
    assert (got.formula_pods, got.value, got.rule) == (786, 250, MaxPodsRule.HIGH_CPU_CAP)


@pytest.mark.parametrize(
    ("vcpus", "value", "rule"),
    [
        (1, 110, MaxPodsRule.LOW_CPU_CAP),
        (30, 110, MaxPodsRule.LOW_CPU_CAP),
        (31, 250, MaxPodsRule.HIGH_CPU_CAP),
        (448, 250, MaxPodsRule.HIGH_CPU_CAP),
        (None, 737, MaxPodsRule.SECONDARY_IP),
    ],
)
def test_the_cap_turns_at_more_than_30_vcpus(
    vcpus: int | None, value: int, rule: MaxPodsRule
) -> None:
    got = compute_node_max_pods(NodeLimits(15, 49, vcpus=vcpus), SECONDARY_IPS, 15)
    assert (got.value, got.rule) == (value, rule)


def test_a_formula_at_or_under_the_cap_is_the_formula() -> None:
    # 8 x 29 + 2 = 234 < 250; 4 x 27 + 2 = 110, the cap itself.
    assert compute_node_max_pods(NodeLimits(8, 29, vcpus=32), SECONDARY_IPS, 8).rule == (
        MaxPodsRule.SECONDARY_IP
    )
    exact = compute_node_max_pods(NodeLimits(4, 27, vcpus=2), SECONDARY_IPS, 4)
    assert (exact.value, exact.rule) == (110, MaxPodsRule.SECONDARY_IP)


def test_custom_networking_on_a_single_eni_leaves_the_host_network_pods() -> None:
    got = compute_node_max_pods(NodeLimits(1, 9, vcpus=2), SECONDARY_IPS, 1, custom_networking=True)
    assert (got.enis_for_pods, got.value) == (0, 2)


def test_the_override_wins_over_the_formula_and_the_cap() -> None:
    m5_large = next(r for r in TABLE if r.instance_type == "m5.large")
    for override in (7, 110, 500):
        got = max_pods(m5_large, PREFIXES, override=override)
        assert (got.value, got.rule, got.formula_pods) == (override, MaxPodsRule.OVERRIDE, 434)


@pytest.mark.parametrize(
    ("instance_type", "strategy", "rule", "reason"),
    [
        (
            "m5.large",
            SECONDARY_IPS,
            MaxPodsRule.SECONDARY_IP,
            "secondary-IP formula: 3 ENIs x 9 addresses + 2 = 29, within the 110 cap for 2 vCPUs",
        ),
        (
            "m5.large",
            PREFIXES,
            MaxPodsRule.LOW_CPU_CAP,
            "the 110 cap for 2 vCPUs; the prefix formula gives 3 ENIs x 144 addresses + 2 = 434",
        ),
        (
            "m5.16xlarge",
            SECONDARY_IPS,
            MaxPodsRule.HIGH_CPU_CAP,
            "the 250 cap for 64 vCPUs; the secondary-IP formula gives 15 ENIs x 49 addresses + 2 = 737",
        ),
        (
            "c6g.medium",
            PREFIXES,
            MaxPodsRule.PREFIX,
            "prefix formula: 2 ENIs x 48 addresses + 2 = 98, within the 110 cap for 1 vCPU",
        ),
        (
            "t2.medium",
            PREFIXES,
            MaxPodsRule.SECONDARY_IP,
            "secondary-IP formula: 3 ENIs x 5 addresses + 2 = 17, within the 110 cap for 2 vCPUs",
        ),
    ],
)
def test_the_rule_and_its_reason(
    instance_type: str, strategy: UnitStrategy, rule: MaxPodsRule, reason: str
) -> None:
    row = next(r for r in TABLE if r.instance_type == instance_type)
    got = max_pods(row, strategy)
    assert (got.rule, got.reason) == (rule, reason)


def test_reasons_for_custom_networking_and_the_override() -> None:
    m5_large = next(r for r in TABLE if r.instance_type == "m5.large")
    assert max_pods(m5_large, SECONDARY_IPS, custom_networking=True).reason == (
        "secondary-IP formula: 2 ENIs, the primary carrying no pods, x 9 addresses + 2 = 20,"
        " within the 110 cap for 2 vCPUs"
    )
    assert max_pods(m5_large, SECONDARY_IPS, override=40).reason == (
        "IPAMD_MAX_PODS=40 (the secondary-IP formula gives 3 ENIs x 9 addresses + 2 = 29)"
    )


def test_pod_limit_counts_the_enis_max_eni_allows() -> None:
    """MAX_ENI caps the ENIs before the formula, as the calculator's `--cni-max-eni` does."""
    m5_16xlarge = next(r for r in TABLE if r.instance_type == "m5.16xlarge").limits
    capped = compute_pod_limit_rule(PoolTargets(max_eni=2), m5_16xlarge, SECONDARY_IPS)
    assert (capped.enis_for_pods, capped.value, capped.rule) == (2, 100, MaxPodsRule.SECONDARY_IP)
    assert compute_pod_limit(PoolTargets(max_eni=2), m5_16xlarge, PREFIXES) == 250
    assert compute_pod_limit(PoolTargets(max_pods=300), m5_16xlarge, PREFIXES) == 300
    assert compute_max_pods(m5_16xlarge, SECONDARY_IPS) == 250
    assert compute_max_pods(m5_16xlarge, SECONDARY_IPS, enis=1) == 51


@pytest.mark.parametrize(
    ("instance_type", "strategy", "held"),
    [
        ("m5.large", PREFIXES, 112),  # max pods 110: 7 prefixes, the last one passing it
        ("m5.16xlarge", SECONDARY_IPS, 250),
        ("m5.4xlarge", SECONDARY_IPS, 110),
    ],
)
def test_the_pool_never_grows_past_max_pods(
    instance_type: str, strategy: UnitStrategy, held: int
) -> None:
    row = next(r for r in TABLE if r.instance_type == instance_type)
    greedy = PoolTargets(warm_ip_target=20_000, minimum_ip_target=20_000)
    settled = settle(fresh_node(), greedy, row.limits, strategy, pods=20_000)
    assert addresses(settled.stats) == held


def test_the_kubelet_wins_over_the_formula_and_the_cap_and_the_override_over_it() -> None:
    m5_16xlarge = next(r for r in TABLE if r.instance_type == "m5.16xlarge")
    got = max_pods(m5_16xlarge, SECONDARY_IPS, kubelet=737)
    assert (got.value, got.rule, got.formula_pods) == (737, MaxPodsRule.KUBELET, 737)
    assert got.reason == (
        "the kubelet's maxPods=737 (the secondary-IP formula gives 15 ENIs x 49 addresses + 2 = 737)"
    )
    assert max_pods(m5_16xlarge, PREFIXES, kubelet=58).value == 58
    got = max_pods(m5_16xlarge, SECONDARY_IPS, kubelet=737, override=300)
    assert (got.value, got.rule) == (300, MaxPodsRule.OVERRIDE)


def test_pod_limit_follows_the_kubelet() -> None:
    m5_16xlarge = next(r for r in TABLE if r.instance_type == "m5.16xlarge").limits
    kubelet = compute_pod_limit_rule(PoolTargets(kubelet_max_pods=737), m5_16xlarge, SECONDARY_IPS)
    assert (kubelet.value, kubelet.rule) == (737, MaxPodsRule.KUBELET)
    assert (
        compute_pod_limit(PoolTargets(kubelet_max_pods=737, max_pods=5), m5_16xlarge, PREFIXES) == 5
    )


FORMULA_ON_M5_LARGE: dict[tuple[AddressFamily, str], int] = {
    ("ipv4", "ip"): 3 * 9 + 2,
    ("ipv4", "prefix"): 3 * 9 * 16 + 2,
    ("ipv6", "ip"): 3 * 9 * 16 + 2,  # IPv6 counts as prefix mode, whatever the pool's unit
    ("ipv6", "prefix"): 3 * 9 * 16 + 2,
}
"""EKS's formula on an m5.large (3 ENIs, 9 addresses each but the primary's), by family and unit."""


@pytest.mark.parametrize("family", ["ipv4", "ipv6"])
@pytest.mark.parametrize("strategy", [SECONDARY_IPS, PREFIXES], ids=["ips", "prefixes"])
def test_the_kubelet_and_the_override_win_in_either_family(
    strategy: UnitStrategy, family: AddressFamily
) -> None:
    m5_large = next(r for r in TABLE if r.instance_type == "m5.large").limits
    kubelet = compute_node_max_pods(m5_large, strategy, 3, kubelet=58, family=family)
    override = compute_node_max_pods(m5_large, strategy, 3, kubelet=58, override=17, family=family)
    above = compute_node_max_pods(m5_large, strategy, 3, kubelet=500, family=family)

    assert (kubelet.value, kubelet.rule) == (58, MaxPodsRule.KUBELET)
    assert (override.value, override.rule) == (17, MaxPodsRule.OVERRIDE)
    assert (above.value, above.rule) == (500, MaxPodsRule.KUBELET)
    formula = FORMULA_ON_M5_LARGE[family, strategy.kind]
    assert kubelet.formula_pods == override.formula_pods == above.formula_pods == formula
