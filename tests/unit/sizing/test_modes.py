"""The mode strategies, the goal the knobs select, max pods and the ENI cap, and the pool status."""

from __future__ import annotations

import pytest

from ipamd.sizing import (
    PREFIXES,
    SECONDARY_IPS,
    NodeLimits,
    PoolTargets,
    compute_max_pods,
    compute_pod_limit,
    compute_pool_status,
    effective_max_enis,
    strategy_for,
)
from tests.unit.sizing.simulation import eni, node, unit, units


def test_strategy_is_chosen_by_prefix_delegation() -> None:
    assert strategy_for(False) is SECONDARY_IPS
    assert strategy_for(True) is PREFIXES
    assert (SECONDARY_IPS.kind, SECONDARY_IPS.addresses_per_unit) == ("ip", 1)
    assert (PREFIXES.kind, PREFIXES.addresses_per_unit) == ("prefix", 16)


@pytest.mark.parametrize(
    ("addresses", "ips", "prefixes"),
    [(-3, 0, 0), (0, 0, 0), (1, 1, 1), (16, 16, 1), (17, 17, 2), (33, 33, 3)],
)
def test_units_for_rounds_up(addresses: int, ips: int, prefixes: int) -> None:
    assert SECONDARY_IPS.units_for(addresses) == ips
    assert PREFIXES.units_for(addresses) == prefixes


@pytest.mark.parametrize(
    ("targets", "ip_goal", "prefix_goal"),
    [
        (PoolTargets(), "warm_eni", "warm_prefix"),
        (PoolTargets(warm_ip_target=1), "warm_ip", "warm_ip"),
        (PoolTargets(minimum_ip_target=1), "warm_ip", "warm_ip"),
        (PoolTargets(warm_eni_target=0, warm_prefix_target=0), "warm_eni", "warm_prefix"),
    ],
)
def test_ip_targets_take_over_from_the_modes_own_target(
    targets: PoolTargets, ip_goal: str, prefix_goal: str
) -> None:
    limits = NodeLimits(3, 3)
    assert SECONDARY_IPS.goal_for(targets, limits).name == ip_goal
    assert PREFIXES.goal_for(targets, limits).name == prefix_goal


@pytest.mark.parametrize(
    ("name", "enis", "ipv4_per_eni", "ips", "prefixes"),
    [
        # VPC CNI's eni-max-pods.txt, and the EKS max-pods calculator in prefix mode
        # (docs/architecture.md §5.3).
        ("t3.small", 3, 4, 11, 146),
        ("m5.large", 3, 10, 29, 434),
        ("m5.xlarge", 4, 15, 58, 898),
        ("m5.16xlarge", 15, 50, 737, 11762),
    ],
)
def test_max_pods(name: str, enis: int, ipv4_per_eni: int, ips: int, prefixes: int) -> None:
    limits = NodeLimits(enis, ipv4_per_eni - 1)
    assert compute_max_pods(limits, SECONDARY_IPS) == ips, name
    assert compute_max_pods(limits, PREFIXES) == prefixes, name
    assert compute_max_pods(limits, SECONDARY_IPS, enis=1) == ipv4_per_eni - 1 + 2


def test_pod_limit_is_the_override_or_the_formula_over_usable_enis() -> None:
    limits = NodeLimits(3, 3)
    assert compute_pod_limit(PoolTargets(), limits, SECONDARY_IPS) == 11
    assert compute_pod_limit(PoolTargets(max_eni=1), limits, SECONDARY_IPS) == 5
    assert compute_pod_limit(PoolTargets(max_pods=7, max_eni=1), limits, SECONDARY_IPS) == 7


@pytest.mark.parametrize(("max_eni", "effective"), [(None, 4), (0, 4), (-1, 4), (2, 2), (9, 4)])
def test_effective_max_enis(max_eni: int | None, effective: int) -> None:
    assert effective_max_enis(PoolTargets(max_eni=max_eni), NodeLimits(4, 3)) == effective


def test_pool_status_counts_cooling_and_releasing_apart() -> None:
    stats = node(
        eni(0, [unit("a/32", assigned=1), unit("b/32", cooling=1), unit("c/32")]),
        eni(1, [unit("d/32", releasing=True), *units(1, 2)]),
    )
    status = compute_pool_status(
        stats, PoolTargets(warm_ip_target=1), NodeLimits(3, 3), SECONDARY_IPS
    )
    assert (status.total, status.assigned, status.cooling, status.available) == (5, 1, 1, 3)
    assert (status.free_units, status.releasing_units, status.enis) == (3, 1, 2)
    assert (status.goal, status.short_units, status.excess_units) == ("warm_ip", 0, 2)
    assert (status.max_enis, status.max_pods) == (3, 11)
    short = compute_pool_status(
        stats, PoolTargets(warm_ip_target=6), NodeLimits(3, 3), SECONDARY_IPS
    )
    assert (short.short_units, short.excess_units) == (3, 0)
