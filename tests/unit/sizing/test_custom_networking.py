"""Custom networking in the pool policy: the primary ENI carries no pods. No unit is added to it, what
it holds counts for nothing and its free units go back, one ENI fewer holds pods, and max pods is
EKS's custom-networking figure (20 on an m5.large)."""

from __future__ import annotations

import pytest

from ipamd.sizing import (
    PREFIXES,
    SECONDARY_IPS,
    MaxPodsRule,
    NodeLimits,
    NodeStats,
    PoolPlan,
    PoolTargets,
    UnitStrategy,
    compute_pod_limit_rule,
    compute_pool_status,
    plan_pool,
)
from ipamd.sizing.plan import compute_address_capacity, enis_for_pods, pod_stats
from tests.unit.sizing.simulation import apply_plan, eni, fresh_node, node, settle, units

M5_LARGE = NodeLimits(max_enis=3, units_per_eni=9, vcpus=2)
CUSTOM = PoolTargets(custom_networking=True)


def _plan(
    stats: NodeStats, targets: PoolTargets, strategy: UnitStrategy = SECONDARY_IPS
) -> PoolPlan:
    result = plan_pool(stats, targets, M5_LARGE, strategy)
    again = plan_pool(apply_plan(stats, result, strategy), targets, M5_LARGE, strategy)
    assert again.is_empty(), again
    return result


@pytest.mark.parametrize("strategy", [SECONDARY_IPS, PREFIXES], ids=["ips", "prefixes"])
def test_a_fresh_node_grows_on_new_enis_only(strategy: UnitStrategy) -> None:
    got = _plan(fresh_node(), CUSTOM, strategy)

    assert got.assign == (), "nothing is added to the primary ENI"
    assert got.new_enis, "the pool grows on a secondary ENI"


def test_the_primary_is_passed_over_even_when_it_has_room() -> None:
    # Without custom networking the primary, the fullest ENI with room, is filled first.
    stats = node(eni(0, units(0, 3, assigned=1)), eni(1, units(1, 1, assigned=1)))

    assert plan_pool(stats, PoolTargets(warm_ip_target=2), M5_LARGE, SECONDARY_IPS).assign == (
        ("eni-0", 2),
    )
    got = _plan(stats, PoolTargets(warm_ip_target=2, custom_networking=True))
    assert got == PoolPlan(assign=(("eni-1", 2),))


def test_two_secondary_enis_are_all_a_three_eni_node_has_for_pods() -> None:
    targets = PoolTargets(warm_ip_target=50, custom_networking=True)

    settled = settle(fresh_node(), targets, M5_LARGE, SECONDARY_IPS, pods=40)

    primary, *secondaries = settled.stats.enis
    assert primary.units == ()
    assert len(secondaries) == 2 and all(len(e.units) == 9 for e in secondaries)
    assert settled.waiting == 40 - 18


def test_what_the_primary_holds_counts_for_nothing_and_its_free_units_go_back() -> None:
    # Left from a start without custom networking: one unit with a pod, two free.
    stats = node(eni(0, units(0, 1, assigned=1) + units(9, 2)), eni(1, units(1, 9)))

    got = _plan(stats, PoolTargets(warm_ip_target=10, custom_networking=True))

    assert got.release_units == ("10.9.0.0/32", "10.9.1.0/32"), "the free ones, not the used one"
    assert got.new_enis == (1,), (
        "nine free on eni-1 is one short of ten: the primary's are not free"
    )
    assert "returning 2 units of the primary ENI" in got.reason


def test_the_primary_is_not_in_the_pool_the_goal_sees() -> None:
    stats = node(eni(0, units(0, 2)), eni(1, units(1, 3, assigned=1)))

    assert pod_stats(stats, CUSTOM) == (
        node(eni(1, units(1, 3, assigned=1))),
        ("10.0.0.0/32", "10.0.1.0/32"),
    )
    assert pod_stats(stats, PoolTargets()) == (stats, ())
    status = compute_pool_status(stats, CUSTOM, M5_LARGE, SECONDARY_IPS)
    assert (status.total, status.available, status.assigned) == (3, 0, 3)
    assert status.excess_units == 2
    assert status.enis == 2, "ENIs attached: the primary is one"


@pytest.mark.parametrize(
    ("strategy", "max_pods", "addresses"),
    [(SECONDARY_IPS, 20, 18), (PREFIXES, 110, 288)],
    ids=["ips", "prefixes"],
)
def test_limits_count_one_eni_fewer(strategy: UnitStrategy, max_pods: int, addresses: int) -> None:
    rule = compute_pod_limit_rule(CUSTOM, M5_LARGE, strategy)

    assert rule.value == max_pods and rule.custom_networking
    assert enis_for_pods(CUSTOM, M5_LARGE) == 2
    assert compute_address_capacity(CUSTOM, M5_LARGE, strategy) == addresses


def test_max_pods_is_eks_custom_networking_figure_for_an_m5_large() -> None:
    # EKS's user guide: 29 pods on an m5.large, 20 with custom networking.
    assert compute_pod_limit_rule(PoolTargets(), M5_LARGE, SECONDARY_IPS).value == 29
    rule = compute_pod_limit_rule(CUSTOM, M5_LARGE, SECONDARY_IPS)
    assert (rule.value, rule.rule, rule.enis_for_pods) == (20, MaxPodsRule.SECONDARY_IP, 2)
    assert "the primary carrying no pods" in rule.reason


def test_max_eni_counts_the_primary() -> None:
    targets = PoolTargets(max_eni=2, warm_ip_target=30, custom_networking=True)

    settled = settle(fresh_node(), targets, M5_LARGE, SECONDARY_IPS)

    assert enis_for_pods(targets, M5_LARGE) == 1
    assert [len(e.units) for e in settled.stats.enis] == [0, 9]
    assert compute_pod_limit_rule(targets, M5_LARGE, SECONDARY_IPS).value == 11
