"""Pools over time: pods come and go, addresses cool, ENIs age; after each change the pool settles
in one plan, stays within its limits, and returns to its resting size when the pods are gone."""

from __future__ import annotations

import random

import pytest

from ipamd.sizing import (
    PREFIXES,
    SECONDARY_IPS,
    NodeLimits,
    NodeStats,
    PoolTargets,
    UnitStrategy,
    compute_pod_limit,
    effective_max_enis,
    plan_pool,
)
from tests.unit.sizing.simulation import (
    addresses,
    age,
    apply_plan,
    assigned,
    cool_down,
    end_all_pods,
    end_pods,
    fresh_node,
    schedule,
    settle,
)

T3_SMALL = NodeLimits(max_enis=3, units_per_eni=3)
M5_LARGE = NodeLimits(max_enis=3, units_per_eni=9)

REGIMES = [
    pytest.param(PoolTargets(warm_eni_target=1), M5_LARGE, SECONDARY_IPS, id="warm-eni-1"),
    pytest.param(PoolTargets(warm_eni_target=0), M5_LARGE, SECONDARY_IPS, id="warm-eni-0"),
    pytest.param(
        PoolTargets(warm_ip_target=2, minimum_ip_target=5), M5_LARGE, SECONDARY_IPS, id="warm-ip"
    ),
    pytest.param(PoolTargets(warm_prefix_target=1), T3_SMALL, PREFIXES, id="warm-prefix-1"),
    pytest.param(PoolTargets(warm_prefix_target=0), T3_SMALL, PREFIXES, id="warm-prefix-0"),
    pytest.param(PoolTargets(warm_ip_target=5), T3_SMALL, PREFIXES, id="warm-ip-prefixes"),
    pytest.param(PoolTargets(max_eni=2, max_pods=20), M5_LARGE, SECONDARY_IPS, id="capped"),
]


def rest(stats: NodeStats) -> NodeStats:
    """The pods are gone long enough: cooldowns over, every ENI past its minimum lifetime."""
    return age(cool_down(end_all_pods(stats)), 3600.0)


@pytest.mark.parametrize(("targets", "limits", "strategy"), REGIMES)
def test_scaling_up_then_to_zero_returns_to_the_resting_pool(
    targets: PoolTargets, limits: NodeLimits, strategy: UnitStrategy
) -> None:
    resting = settle(fresh_node(), targets, limits, strategy).stats
    busy = settle(resting, targets, limits, strategy, pods=40).stats
    assert addresses(busy) > addresses(resting)
    after = settle(rest(busy), targets, limits, strategy).stats
    assert addresses(after) == addresses(resting)
    assert len(after.enis) == len(resting.enis)


@pytest.mark.parametrize(("targets", "limits", "strategy"), REGIMES)
def test_random_churn_settles_in_one_plan_within_limits(
    targets: PoolTargets, limits: NodeLimits, strategy: UnitStrategy
) -> None:
    rng = random.Random(2896)
    stats = fresh_node()
    waiting = 0
    pod_limit = compute_pod_limit(targets, limits, strategy)
    # Pods come and go around 70% of what the node can hold, so the pool grows and shrinks.
    most = min(pod_limit, limits.max_enis * strategy.addresses_per_eni(limits)) * 7 // 10
    for _ in range(300):
        stats, waiting = _event(rng, stats, waiting, most)
        plan = plan_pool(stats, targets, limits, strategy)
        stats = apply_plan(stats, plan, strategy)
        assert plan_pool(stats, targets, limits, strategy).is_empty()
        assert len(stats.enis) <= effective_max_enis(targets, limits)
        assert all(len(e.units) <= limits.units_per_eni for e in stats.enis)
        assert addresses(stats) < pod_limit + strategy.addresses_per_unit
        stats, waiting = schedule(stats, waiting)


def _event(rng: random.Random, stats: NodeStats, waiting: int, most: int) -> tuple[NodeStats, int]:
    roll = rng.random()
    if roll < 0.35:
        return stats, min(waiting + rng.randint(1, 8), max(most - assigned(stats), 0))
    if roll < 0.7 and assigned(stats):
        busy = [u for e in stats.enis for u in e.units if u.assigned]
        target = rng.choice(busy)
        return end_pods(stats, target.cidr, rng.randint(1, target.assigned)), waiting
    if roll < 0.85:
        return cool_down(stats), waiting
    return age(stats, 30.0), waiting
