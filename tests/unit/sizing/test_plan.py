"""`plan_pool`, one plan at a time: where growth goes, what shrinking gives back, the limits, and
the cases where ipamd differs from VPC CNI on purpose (each says why)."""

from __future__ import annotations

import pytest

from ipamd.sizing import (
    PREFIXES,
    SECONDARY_IPS,
    EniStats,
    NodeLimits,
    NodeStats,
    PoolPlan,
    PoolTargets,
    UnitStrategy,
    plan_pool,
)
from tests.unit.sizing.simulation import (
    apply_plan,
    eni,
    node,
    unit,
    units,
)

LIMITS = NodeLimits(max_enis=3, units_per_eni=3)
WARM_ENI = PoolTargets(warm_eni_target=1)


def plan(
    stats: NodeStats,
    targets: PoolTargets,
    strategy: UnitStrategy = SECONDARY_IPS,
    limits: NodeLimits = LIMITS,
) -> PoolPlan:
    result = plan_pool(stats, targets, limits, strategy)
    # Every plan here is final: applied, the next one is empty.
    again = plan_pool(apply_plan(stats, result, strategy), targets, limits, strategy)
    assert again.is_empty(), again
    return result


# --- growing --------------------------------------------------------------------------------------


def test_fills_existing_enis_fullest_first_before_creating_one() -> None:
    stats = node(
        eni(0, units(0, 1, assigned=1)),
        eni(1, units(1, 2, assigned=1)),
        eni(2),
    )
    # 0 free, short 4: eni-1 (2 used) takes 1, eni-0 (1 used) 2, eni-2 (0 used) 1.
    got = plan(stats, PoolTargets(warm_ip_target=4))
    assert got == PoolPlan(assign=(("eni-1", 1), ("eni-0", 2), ("eni-2", 1)))
    assert got.reason.startswith("warm_ip: short 4 units")


def test_ties_go_to_the_primary_eni_which_can_never_be_released() -> None:
    got = plan(node(eni(1, age_s=0.0), eni(0)), PoolTargets(warm_ip_target=2))
    assert got == PoolPlan(assign=(("eni-0", 2),))


def test_new_enis_each_take_what_remains_up_to_a_full_eni() -> None:
    got = plan(node(eni(0, units(0, 3, assigned=1))), PoolTargets(warm_ip_target=5))
    assert got == PoolPlan(new_enis=(3, 2))


def test_a_releasing_unit_still_takes_its_slot() -> None:
    # EC2 counts it until the unassign completes: assigning a third unit to eni-0 would fail.
    stats = node(eni(0, [*units(0, 2, assigned=1), unit("10.0.9.0/32", releasing=True)]))
    assert plan(stats, PoolTargets(warm_ip_target=1)) == PoolPlan(new_enis=(1,))


def test_max_eni_caps_new_enis() -> None:
    stats = node(eni(0, units(0, 3, assigned=1)))
    got = plan(stats, PoolTargets(warm_ip_target=9, max_eni=2))
    assert got == PoolPlan(new_enis=(3,))


def test_no_new_eni_above_max_eni_lowered_below_the_current_count() -> None:
    stats = node(eni(0, units(0, 3, assigned=1)), eni(1, units(1, 3, assigned=1)))
    assert plan(stats, PoolTargets(warm_ip_target=2, max_eni=1)).is_empty()


def test_growth_stops_at_max_pods() -> None:
    stats = node(eni(0, units(0, 3, assigned=1)))
    got = plan(stats, PoolTargets(warm_ip_target=5, max_pods=5))
    assert got == PoolPlan(new_enis=(2,))


def test_in_prefix_mode_the_last_prefix_may_pass_max_pods() -> None:
    stats = node(eni(0, units(0, 1, size=16, assigned=16)))
    got = plan(stats, PoolTargets(warm_ip_target=20, max_pods=20), PREFIXES)
    assert got == PoolPlan(assign=(("eni-0", 1),))  # 32 addresses, not 48


def test_at_max_pods_nothing_grows() -> None:
    stats = node(eni(0, units(0, 3, assigned=1)))
    assert plan(stats, PoolTargets(warm_ip_target=5, max_pods=3)).is_empty()


def test_warm_eni_target_grows_whole_enis() -> None:
    # available 1 < 3: as VPC CNI, fill each ENI touched, not just the 2 missing addresses.
    stats = node(eni(0, units(0, 3, assigned=1)), eni(1, [unit("a/32", assigned=1), unit("b/32")]))
    assert plan(stats, WARM_ENI) == PoolPlan(assign=(("eni-1", 1),), new_enis=(3,))


def test_warm_eni_target_0_grows_only_when_nothing_is_available() -> None:
    targets = PoolTargets(warm_eni_target=0)
    assert plan(node(eni(0, units(0, 2, assigned=1))), targets) == PoolPlan(assign=(("eni-0", 1),))
    assert plan(node(eni(0, [*units(0, 2, assigned=1), unit("x/32")])), targets).is_empty()


def test_ip_targets_override_the_warm_eni_and_prefix_targets() -> None:
    stats = node(eni(0, units(0, 1)))
    assert plan(stats, PoolTargets(warm_eni_target=3, warm_ip_target=1)).is_empty()
    prefix = node(eni(0, units(0, 1, size=16, assigned=8)))
    assert plan(prefix, PoolTargets(warm_prefix_target=2, warm_ip_target=8), PREFIXES).is_empty()


# --- where ipamd differs from VPC CNI -------------------------------------------------------------


def test_cooling_addresses_are_not_available() -> None:
    # VPC CNI counts them as available (#2896) and so does not grow, and the next pods wait out
    # the cooldown. They cannot be handed out, so they are not warm.
    stats = node(eni(0, [unit("a/32", cooling=1), unit("b/32")]))
    assert plan(stats, PoolTargets(warm_ip_target=2)) == PoolPlan(assign=(("eni-0", 1),))


def test_a_unit_with_a_cooling_address_is_never_returned() -> None:
    # VPC CNI's FindFreeableCidrs takes any unit with no assigned address, cooling ones included,
    # so a pod's old address can reach another node while kube-proxy still routes it here.
    stats = node(eni(0, [unit("a/32"), unit("b/32"), unit("c/32", cooling=1)]))
    got = plan(stats, PoolTargets(warm_ip_target=1))
    assert got == PoolPlan(release_units=("b/32",))


def test_a_partly_cooling_prefix_is_neither_warm_nor_returned() -> None:
    stats = node(eni(0, [unit("p/28", 16, cooling=1), unit("q/28", 16)]))
    # One wholly free prefix (q) meets WARM_PREFIX_TARGET=1; p is not free and stays.
    assert plan(stats, PoolTargets(warm_prefix_target=1), PREFIXES).is_empty()
    # With a target of 2, p does not count: one more prefix.
    got = plan(stats, PoolTargets(warm_prefix_target=2), PREFIXES)
    assert got == PoolPlan(assign=(("eni-0", 1),))


def test_releasing_units_are_not_available_nor_returned_twice() -> None:
    stats = node(eni(0, [unit("a/32", releasing=True), unit("b/32", assigned=1)]))
    assert plan(stats, PoolTargets(warm_ip_target=1)) == PoolPlan(assign=(("eni-0", 1),))


def test_warm_prefix_target_counts_wholly_free_prefixes() -> None:
    # Two half used prefixes hold 16 free addresses: VPC CNI does not grow (it tests free
    # addresses) yet would shrink on whole prefixes. A burst of pods needs a whole free prefix,
    # and growing and shrinking on the same measure cannot disagree.
    stats = node(eni(0, units(0, 2, size=16, assigned=8)))
    got = plan(stats, PoolTargets(warm_prefix_target=1), PREFIXES)
    assert got == PoolPlan(assign=(("eni-0", 1),))


def test_warm_eni_target_0_does_not_release_the_last_eni_with_free_addresses() -> None:
    # VPC CNI frees an ENI once available >= (0 + 1) x 3 even if it holds all of them, then finds
    # nothing available and attaches a new ENI: churn on every tick past the minimum lifetime.
    stats = node(eni(0, units(0, 3, assigned=1)), eni(1, units(1, 3)))
    assert plan(stats, PoolTargets(warm_eni_target=0)).is_empty()


def test_releases_the_emptiest_non_primary_eni_so_it_can_go() -> None:
    # VPC CNI walks ENIs in Go map order; emptying the emptiest lets the whole ENI be released.
    stats = node(
        eni(0, [*units(0, 1, assigned=1), *units(10, 2)]),
        eni(1, [*units(1, 1, assigned=1), *units(11, 2)]),
        eni(2, units(2, 2)),
    )
    got = plan(stats, PoolTargets(warm_ip_target=1))
    assert got.release_enis == ("eni-2",)
    assert got.release_units == ("10.11.1.0/32", "10.11.0.0/32", "10.10.1.0/32")


# --- shrinking ------------------------------------------------------------------------------------


def test_warm_eni_target_never_releases_single_addresses() -> None:
    stats = node(eni(0, units(0, 3)), eni(1, units(1, 2, assigned=1)))
    assert plan(stats, WARM_ENI).is_empty()


def test_warm_eni_target_releases_an_eni_above_one_more_enis_worth() -> None:
    stats = node(eni(0, units(0, 3)), eni(1, units(1, 3)), eni(2, units(2, 1)))
    # available 7 >= (1 + 1) x 3: eni-2 (fewest units) goes; then 6 >= 6: eni-1 goes too.
    assert plan(stats, WARM_ENI) == PoolPlan(release_enis=("eni-2", "eni-1"))


def test_warm_eni_target_keeps_an_eni_below_the_hysteresis() -> None:
    stats = node(eni(0, units(0, 3, assigned=1)), eni(1, units(1, 3)), eni(2, units(2, 2)))
    assert plan(stats, WARM_ENI).is_empty()  # available 5 < 6


@pytest.mark.parametrize(
    ("second", "why"),
    [
        (eni(1, units(1, 3), age_s=59.0), "younger than the minimum lifetime"),
        (eni(1, [*units(1, 2), unit("c/32", cooling=1)]), "holds a cooling address"),
        (eni(1, [*units(1, 2), unit("r/32", releasing=True)]), "an unassign is in flight"),
        (eni(1, [*units(1, 2), unit("a/32", assigned=1)]), "serves a pod"),
    ],
)
def test_an_eni_is_kept_when(second: EniStats, why: str) -> None:
    stats = node(eni(0, units(0, 3)), second, eni(2, units(2, 3)))
    got = plan(stats, WARM_ENI)
    assert got.release_enis == ("eni-2",), why


def test_the_primary_eni_is_never_released() -> None:
    stats = node(eni(0, units(0, 3)), eni(1, units(1, 3, assigned=1)), eni(2, units(2, 3)))
    # available 6 >= (0 + 1) x 3: eni-2 goes; the primary, as free, stays.
    assert plan(stats, PoolTargets(warm_eni_target=0)) == PoolPlan(release_enis=("eni-2",))


def test_units_on_the_primary_eni_may_go() -> None:
    stats = node(eni(0, units(0, 3)), eni(1, units(1, 3, assigned=1)))
    got = plan(stats, PoolTargets(warm_ip_target=1))
    assert got == PoolPlan(release_units=("10.0.2.0/32", "10.0.1.0/32"))


def test_warm_ip_target_keeps_the_minimum() -> None:
    stats = node(eni(0, units(0, 3)), eni(1, units(1, 3)))
    got = plan(stats, PoolTargets(warm_ip_target=1, minimum_ip_target=4))
    assert got == PoolPlan(release_units=("10.1.2.0/32", "10.1.1.0/32"))


def test_prefixes_above_the_warm_prefix_target_go_back() -> None:
    stats = node(
        eni(0, [unit("a/28", 16, assigned=3), unit("b/28", 16)]),
        eni(1, [unit("c/28", 16), unit("d/28", 16, assigned=1), unit("e/28", 16)]),
    )
    got = plan(stats, PoolTargets(warm_prefix_target=1), PREFIXES)
    assert got == PoolPlan(release_units=("e/28", "c/28"))


def test_an_emptied_eni_goes_with_its_free_prefixes() -> None:
    stats = node(
        eni(0, [unit("a/28", 16, assigned=3), unit("b/28", 16)]),
        eni(1, [unit("c/28", 16), unit("d/28", 16)]),
    )
    got = plan(stats, PoolTargets(warm_prefix_target=1), PREFIXES)
    assert got == PoolPlan(release_enis=("eni-1",))


def test_warm_prefix_target_0_keeps_one_free_prefix_when_nothing_else_is_free() -> None:
    full = node(eni(0, [unit("a/28", 16, assigned=16), unit("b/28", 16)]))
    assert plan(full, PoolTargets(warm_prefix_target=0), PREFIXES).is_empty()
    part = node(eni(0, [unit("a/28", 16, assigned=10), unit("b/28", 16)]))
    got = plan(part, PoolTargets(warm_prefix_target=0), PREFIXES)
    assert got == PoolPlan(release_units=("b/28",))


def test_grows_and_releases_an_empty_eni_in_one_plan() -> None:
    stats = node(eni(0, units(0, 3, assigned=1)), eni(1), eni(2))
    got = plan(stats, PoolTargets(warm_ip_target=2))
    assert got == PoolPlan(assign=(("eni-1", 2),), release_enis=("eni-2",))


def test_a_pool_on_target_plans_nothing() -> None:
    stats = node(eni(0, units(0, 3, assigned=1)), eni(1, units(1, 3)))
    assert plan(stats, WARM_ENI).is_empty()
    assert plan(stats, WARM_ENI).reason == ""
