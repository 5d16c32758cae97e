"""A pod-aware pool (IPAMD_POD_AWARE_POOL): the pods bound here and holding no address are one more
input of the pure plan. With the mode's warm target at 0 (and no IP target) the pool grows only for
the pods on their way (filling the ENI it touches, as the warm ENI goal grows) and gives back what
neither its pods nor those on their way need; with a warm target, the larger of the two."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ipamd.sizing import PREFIXES, SECONDARY_IPS, NodeLimits, PoolTargets, plan_pool
from ipamd.sizing.modes import UnitStrategy
from tests.unit.sizing.simulation import addresses, eni, free, node, units

LIMITS = NodeLimits(3, 9)  # an m5.large: 3 ENIs of 9 secondary addresses
ZERO = PoolTargets(warm_eni_target=0, warm_prefix_target=0, pod_aware=True)


@pytest.mark.parametrize(
    ("targets", "ip_goal", "prefix_goal"),
    [
        (ZERO, "pods", "pods"),
        (PoolTargets(warm_eni_target=0, warm_prefix_target=0), "warm_eni", "warm_prefix"),
        (PoolTargets(pod_aware=True), "warm_eni", "warm_prefix"),
        (PoolTargets(warm_eni_target=0, minimum_ip_target=2, pod_aware=True), "warm_ip", "warm_ip"),
    ],
)
def test_the_pods_goal_needs_a_pod_aware_pool_and_every_warm_target_at_0(
    targets: PoolTargets, ip_goal: str, prefix_goal: str
) -> None:
    assert SECONDARY_IPS.goal_for(targets, LIMITS).name == ip_goal
    assert PREFIXES.goal_for(targets, LIMITS).name == prefix_goal


def test_it_grows_only_for_pods_on_their_way_and_fills_the_eni_it_touches() -> None:
    stats = node(eni(0, units(0, 4, assigned=1)))  # four pods, nothing free
    assert plan_pool(stats, ZERO, LIMITS, SECONDARY_IPS).is_empty(), "nobody coming: no growth"
    plan = plan_pool(stats, replace(ZERO, pods_to_come=3), LIMITS, SECONDARY_IPS)
    assert plan.assign == (("eni-0", 5),), "one call fills the ENI, as the warm ENI goal grows"

    unaware = PoolTargets(warm_eni_target=0)
    assert plan_pool(stats, unaware, LIMITS, SECONDARY_IPS).assign == (("eni-0", 5),), (
        "VPC CNI's WARM_ENI_TARGET=0 grows with nobody coming: one free address at least"
    )


def test_what_no_pod_uses_or_is_coming_for_goes_back() -> None:
    stats = node(eni(0, [*units(0, 4, assigned=1), *units(1, 5)]))
    assert free(stats) == 5 and addresses(stats) == 9
    plan = plan_pool(stats, replace(ZERO, pods_to_come=2), LIMITS, SECONDARY_IPS)
    assert len(plan.release_units) == 3, plan
    unaware = PoolTargets(warm_eni_target=0)
    assert plan_pool(stats, unaware, LIMITS, SECONDARY_IPS).is_empty(), (
        "under WARM_ENI_TARGET single addresses never go back"
    )


def test_with_a_warm_target_the_larger_of_the_two_is_kept() -> None:
    stats = node(eni(0, units(0, 9, assigned=1)), eni(1, units(1, 2)))
    coming = PoolTargets(warm_eni_target=1, pods_to_come=12, pod_aware=True)
    goal = SECONDARY_IPS.goal_for(coming, LIMITS)
    assert (goal.name, goal.keep_available) == ("warm_eni", 12)
    assert plan_pool(stats, coming, LIMITS, SECONDARY_IPS).assign, "short of 12 free"


def test_prefix_mode_returns_a_wholly_free_prefix_nobody_is_coming_for() -> None:
    strategy: UnitStrategy = PREFIXES
    stats = node(eni(0, [*units(0, 1, size=16, assigned=3), *units(1, 1, size=16)]))
    plan = plan_pool(stats, ZERO, LIMITS, strategy)
    assert len(plan.release_units) == 1, plan
    kept = plan_pool(stats, replace(ZERO, pods_to_come=14), LIMITS, strategy)
    assert kept.is_empty(), "13 free in the used prefix + 16: room for 14 needs both"
