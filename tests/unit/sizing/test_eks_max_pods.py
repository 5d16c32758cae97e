"""ipamd's max pods against EKS's published figures for every instance type of its limits table.

The table: the instance types ipamd's embedded cloud answers DescribeInstanceTypes for (moto's data,
through `cloud.ec2_answers.parse_limits`, as the EC2 adapter reads a real answer), and the fallback
table of `cloud.limits`. The figures: `eks_max_pods.txt` beside this file, whose header says where
each column comes from; every type of the table has them but the few EKS publishes nothing for
(`NO_EKS_FIGURES`). Each test collects every mismatch and fails listing them all, so one run shows
the whole disagreement.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from moto.ec2.models.instance_types import INSTANCE_TYPES

from cloud.ec2_answers import parse_limits
from cloud.limits import FALLBACK_LIMITS
from ipamd.sizing import (
    PREFIXES,
    SECONDARY_IPS,
    MaxPodsRule,
    NodeLimits,
    UnitStrategy,
    compute_node_max_pods,
)

FIGURES = Path(__file__).with_name("eks_max_pods.txt")

MOTO_BEHIND_EKS = {
    # Two network cards; moto's data gives the default card 8 (i7ie) or 12 (i8ge) ENIs where EKS's
    # copy of DescribeInstanceTypes gives 15 or 24. The figures follow EKS's.
    "i7ie.48xlarge",
    "i7ie.metal-48xl",
    "i8ge.48xlarge",
    "i8ge.metal-48xl",
}


NO_EKS_FIGURES = {
    # Newer than EKS's instance-info.jsonl (and eni-max-pods.txt): no figure published anywhere.
    *(
        f"r9g{d}.{size}"
        for d in ("", "d")
        for size in (
            "medium",
            "large",
            "xlarge",
            "2xlarge",
            "4xlarge",
            "8xlarge",
            "12xlarge",
            "16xlarge",
            "24xlarge",
            "48xlarge",
            "metal-48xl",
        )
    ),
    "t8i.nano",
    "t8i.micro",
    "t8i.small",
    "t8i.medium",
    "trn2u.48xlarge",
}


class Figure(NamedTuple):
    instance_type: str
    enis: int
    ipv4_per_eni: int
    vcpus: int
    hypervisor: str
    eni_max_pods: int
    calc_ips: int
    calc_prefixes: int
    published_in: str
    """`txt` (eni-max-pods.txt) or `nodeadm` (its instance-info.jsonl and default formula)."""

    @property
    def limits(self) -> NodeLimits:
        # Bare metal runs on Nitro (`cloud.ec2_answers.parse_limits`), as VPC CNI counts it.
        nitro = self.hypervisor in ("nitro", "metal")
        return NodeLimits(self.enis, self.ipv4_per_eni - 1, vcpus=self.vcpus, nitro=nitro)


def _figures() -> dict[str, Figure]:
    rows: dict[str, Figure] = {}
    for line in FIGURES.read_text(encoding="utf-8").splitlines():
        if not line or line.startswith("#"):
            continue
        name, enis, ipv4, vcpus, hypervisor, published, ips, prefixes, where = line.split()
        numbers = (int(published), int(ips), int(prefixes))
        row = Figure(name, int(enis), int(ipv4), int(vcpus), hypervisor, *numbers, where)
        assert name not in rows, f"{name} appears twice in {FIGURES.name}"
        rows[name] = row
    return rows


EKS = _figures()


def _value(row: Figure, strategy: UnitStrategy) -> int:
    return compute_node_max_pods(row.limits, strategy, row.enis).value


def _with_kubelet(row: Figure, strategy: UnitStrategy, kubelet: int) -> tuple[int, MaxPodsRule]:
    got = compute_node_max_pods(row.limits, strategy, row.enis, kubelet=kubelet)
    return got.value, got.rule


def test_the_figures_cover_the_table() -> None:
    assert len(EKS) > 1300
    assert set(FALLBACK_LIMITS) <= set(EKS), "a fallback type without an EKS figure"
    assert set(EKS) <= set(INSTANCE_TYPES), "a figure for a type the embedded cloud does not know"
    assert set(INSTANCE_TYPES) - set(EKS) == NO_EKS_FIGURES, "a type of the table without a figure"
    assert {row.published_in for row in EKS.values()} == {"txt", "nodeadm"}
    assert {row.hypervisor for row in EKS.values()} == {"nitro", "xen", "metal"}
    assert {row.vcpus <= 30 for row in EKS.values()} == {True, False}
    # The type the issue found without a figure: EKS's eni-max-pods.txt says 58.
    assert (EKS["a1.2xlarge"].eni_max_pods, EKS["a1.2xlarge"].calc_ips) == (58, 58)


def test_the_figures_agree_with_themselves() -> None:
    """The published uncapped figure is the formula over EKS's own limits on every line."""
    wrong = [
        row.instance_type
        for row in EKS.values()
        if row.enis * (row.ipv4_per_eni - 1) + 2 != row.eni_max_pods
    ]
    assert wrong == []


def test_the_embedded_cloud_reports_the_limits_eks_computed_from() -> None:
    differ = []
    for row in EKS.values():
        limits = parse_limits(INSTANCE_TYPES[row.instance_type])
        hypervisor = (
            "metal" if INSTANCE_TYPES[row.instance_type].get("BareMetal") else row.hypervisor
        )
        got = (limits.max_enis, limits.ipv4_per_eni, limits.vcpus, limits.hypervisor == "nitro")
        want = (row.enis, row.ipv4_per_eni, row.vcpus, hypervisor in ("nitro", "metal"))
        if got != want:
            differ.append(row.instance_type)
    assert set(differ) == MOTO_BEHIND_EKS


def test_the_fallback_table_is_eks_limits() -> None:
    for name, limits in FALLBACK_LIMITS.items():
        row = EKS[name]
        assert (limits.max_enis, limits.ipv4_per_eni, limits.vcpus) == (
            row.enis,
            row.ipv4_per_eni,
            row.vcpus,
        )


def test_the_secondary_ip_formula_is_eni_max_pods_for_every_type() -> None:
    mismatches = [
        (row.instance_type, got.formula_pods, row.eni_max_pods)
        for row in EKS.values()
        if (got := compute_node_max_pods(row.limits, SECONDARY_IPS, row.enis)).formula_pods
        != row.eni_max_pods
    ]
    assert mismatches == []


def test_secondary_ip_mode_is_the_calculator_for_every_type() -> None:
    mismatches = [
        (row.instance_type, got, row.calc_ips)
        for row in EKS.values()
        if (got := _value(row, SECONDARY_IPS)) != row.calc_ips
    ]
    assert mismatches == []


def test_prefix_mode_is_the_calculator_for_every_type() -> None:
    mismatches = [
        (row.instance_type, got, row.calc_prefixes)
        for row in EKS.values()
        if (got := _value(row, PREFIXES)) != row.calc_prefixes
    ]
    assert mismatches == []


def test_with_the_eks_amis_kubelet_config_max_pods_is_eni_max_pods_for_every_type() -> None:
    """A self-managed node's kubelet, given eni-max-pods.txt's figure by the EKS AMI: ipamd follows
    it in both modes, above the calculator's cap (c5.18xlarge: 737, not 250) or below it."""
    mismatches = [
        (row.instance_type, strategy.kind, got)
        for row in EKS.values()
        for strategy in (SECONDARY_IPS, PREFIXES)
        if (got := _with_kubelet(row, strategy, row.eni_max_pods))
        != (row.eni_max_pods, MaxPodsRule.KUBELET)
    ]
    assert mismatches == []
    assert _with_kubelet(EKS["c5.18xlarge"], SECONDARY_IPS, 737) == (737, MaxPodsRule.KUBELET)


def test_with_a_managed_node_groups_kubelet_config_max_pods_is_the_calculator() -> None:
    """A kubelet given the calculator's value (what EKS managed node groups do): the same number,
    now because the kubelet says so."""
    mismatches = [
        (row.instance_type, strategy.kind, got)
        for row in EKS.values()
        for strategy, want in ((SECONDARY_IPS, row.calc_ips), (PREFIXES, row.calc_prefixes))
        if (got := _with_kubelet(row, strategy, want)) != (want, MaxPodsRule.KUBELET)
    ]
    assert mismatches == []
