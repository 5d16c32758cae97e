"""Subnet scarcity in the plan: when the mode turns on and off, and what a scarce plan keeps, grows
and gives back in each goal (`ipamd.sizing.scarcity`)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from ipamd.sizing import (
    PREFIXES,
    SECONDARY_IPS,
    NodeLimits,
    NodeStats,
    PoolPlan,
    PoolTargets,
    UnitStrategy,
    plan_pool,
)
from ipamd.sizing.scarcity import RECOVERY_FACTOR, scarce_after
from tests.unit.sizing.simulation import addresses, apply_plan, eni, node, unit, units
from tests.unit.sizing.test_properties import Case, _check_growth, _check_release, cases

LIMITS = NodeLimits(max_enis=3, units_per_eni=3)


def scarce_plan(
    stats: NodeStats,
    targets: PoolTargets,
    strategy: UnitStrategy = SECONDARY_IPS,
    limits: NodeLimits = LIMITS,
) -> PoolPlan:
    result = plan_pool(stats, targets, limits, strategy, scarce=True)
    again = plan_pool(apply_plan(stats, result, strategy), targets, limits, strategy, scarce=True)
    assert again.is_empty(), again
    return result


@pytest.mark.parametrize(
    ("was", "free", "threshold", "now"),
    [
        (False, None, 64, False),  # never read: plenty, as far as anyone knows
        (False, 64, 64, False),
        (False, 63, 64, True),
        (True, 64, 64, True),  # back above the threshold is not enough
        (True, 127, 64, True),
        (True, 128, 64, False),  # twice the threshold ends it
        (True, None, 64, False),
        (False, 0, 0, False),  # a threshold of 0 is off
        (True, 0, 0, False),
    ],
)
def test_the_mode_turns_on_below_the_threshold_and_off_at_twice_it(
    was: bool, free: int | None, threshold: int, now: bool
) -> None:
    assert RECOVERY_FACTOR == 2
    assert scarce_after(was, free, threshold) is now


def test_warm_ip_target_counts_as_0_and_the_minimum_stays() -> None:
    # 2 pods, 7 free: as much of WARM_IP_TARGET=8 as the node can hold; MINIMUM_IP_TARGET=4.
    stats = node(
        eni(0, [*units(0, 2, assigned=1), *units(10, 1)]), eni(1, units(1, 3)), eni(2, units(2, 3))
    )
    targets = PoolTargets(warm_ip_target=8, minimum_ip_target=4)
    assert plan_pool(stats, targets, LIMITS, SECONDARY_IPS).is_empty()
    got = scarce_plan(stats, targets)
    assert got.release_enis == ("eni-2",)
    assert got.release_units == ("10.1.2.0/32", "10.1.1.0/32")
    assert got.reason == "scarce: returning 2 units and 1 ENIs"
    assert addresses(apply_plan(stats, got, SECONDARY_IPS)) == 4, "the minimum, pods included"


def test_above_the_minimum_one_address_stays_free_and_an_empty_pool_grows_by_one() -> None:
    targets = PoolTargets(warm_ip_target=8, minimum_ip_target=2)
    busy = node(eni(0, [*units(0, 3, assigned=1)]), eni(1, [unit("a/32"), unit("b/32")]))
    assert scarce_plan(busy, targets) == PoolPlan(release_units=("b/32",))
    full = node(eni(0, units(0, 3, assigned=1)), eni(1, [unit("a/32", assigned=1)]))
    assert scarce_plan(full, targets) == PoolPlan(assign=(("eni-1", 1),))


def test_warm_eni_target_gives_single_addresses_back_and_grows_by_what_is_short() -> None:
    stats = node(eni(0, [*units(0, 1, assigned=1), *units(10, 2)]), eni(1, units(1, 3)))
    got = scarce_plan(stats, PoolTargets(warm_eni_target=2))
    assert got == PoolPlan(release_units=("10.10.1.0/32",), release_enis=("eni-1",))
    empty = node(eni(0, units(0, 3, assigned=1)))
    assert scarce_plan(empty, PoolTargets(warm_eni_target=2)) == PoolPlan(new_enis=(1,))


def test_warm_prefix_target_keeps_no_free_prefix_while_a_partly_used_one_has_room() -> None:
    stats = node(eni(0, [unit("a/28", 16, assigned=3), unit("b/28", 16), unit("c/28", 16)]))
    targets = PoolTargets(warm_prefix_target=2)
    assert plan_pool(stats, targets, LIMITS, PREFIXES).is_empty()
    assert scarce_plan(stats, targets, PREFIXES) == PoolPlan(release_units=("c/28", "b/28"))
    full = node(eni(0, [unit("a/28", 16, assigned=16)]))
    assert scarce_plan(full, targets, PREFIXES) == PoolPlan(assign=(("eni-0", 1),))


def test_a_minimum_alone_is_what_it_was() -> None:
    stats = node(eni(0, units(0, 3, assigned=1)), eni(1, units(1, 2)))
    targets = PoolTargets(minimum_ip_target=5)
    normal = plan_pool(stats, targets, LIMITS, SECONDARY_IPS)
    assert scarce_plan(stats, targets) == normal == PoolPlan()


def test_nothing_in_use_or_cooling_goes_back() -> None:
    stats = node(
        eni(0, [unit("a/32", assigned=1), unit("b/32", cooling=1), unit("c/32")]),
        eni(1, [unit("d/32", cooling=1), unit("e/32")]),
    )
    got = scarce_plan(stats, PoolTargets(warm_ip_target=5))
    assert got == PoolPlan(release_units=("e/32",)), "one of c and e stays free; a, b, d are used"


@settings(max_examples=300, deadline=None)
@given(cases())
def test_a_scarce_plan_keeps_the_rules_of_every_plan_and_never_grows_more(case: Case) -> None:
    scarce = plan_pool(case.stats, case.targets, case.limits, case.strategy, scarce=True)
    _check_growth(case, scarce)
    _check_release(case, scarce)
    after = apply_plan(case.stats, scarce, case.strategy)
    again = plan_pool(after, case.targets, case.limits, case.strategy, scarce=True)
    assert again.is_empty(), again
    normal = plan_pool(case.stats, case.targets, case.limits, case.strategy)
    grown = sum(n for _, n in scarce.assign) + sum(scarce.new_enis)
    assert grown <= sum(n for _, n in normal.assign) + sum(normal.new_enis)
