"""Prefix mode taking its pool back from the /32s its fallback left (`ipamd.sizing.prefix_return`):
the goal is counted without the free /32s, prefixes grow (in the free /32s' slots when nothing else
has room), and the free /32s go back; a /32 in use or cooling never does."""

from __future__ import annotations

from ipamd.sizing import (
    PREFIXES,
    SECONDARY_IPS,
    NodeLimits,
    NodeStats,
    PoolPlan,
    PoolTargets,
    UnitStrategy,
    compute_pool_status,
    plan_pool,
)
from tests.unit.sizing.simulation import apply_plan, eni, node, unit

LIMITS = NodeLimits(max_enis=3, units_per_eni=4)
WARM_PREFIX = PoolTargets(warm_prefix_target=1, min_eni_lifetime_s=0)


def plan(
    stats: NodeStats,
    targets: PoolTargets = WARM_PREFIX,
    limits: NodeLimits = LIMITS,
    strategy: UnitStrategy = PREFIXES,
) -> PoolPlan:
    result = plan_pool(stats, targets, limits, strategy)
    again = plan_pool(apply_plan(stats, result, strategy), targets, limits, strategy)
    assert again.is_empty(), again
    return result


def test_free_32s_are_not_capacity_a_prefix_grows_and_they_go_back() -> None:
    stats = node(eni(0, [unit("a/32", assigned=1), unit("b/32"), unit("c/32")]))
    got = plan(stats)
    assert got == PoolPlan(assign=(("eni-0", 1),), release_units=("c/32", "b/32"))
    assert got.reason == "warm_prefix: returning 2 units and 0 ENIs"


def test_a_32_in_use_or_cooling_stays_until_it_has_emptied_and_cooled() -> None:
    stats = node(
        eni(
            0,
            [
                unit("p/28", 16, assigned=2),
                unit("q/28", 16),
                unit("a/32", assigned=1),
                unit("b/32", cooling=1),
                unit("c/32"),
            ],
        )
    )
    assert plan(stats) == PoolPlan(release_units=("c/32",))
    status = compute_pool_status(stats, WARM_PREFIX, LIMITS, PREFIXES)
    assert status.leftover_units == 1 and status.total == 32 + 2
    assert status.excess_units == 1


def test_the_fallback_itself_counts_both_kinds_as_capacity() -> None:
    # Secondary IPs while prefixes are refused: a prefix is 16 addresses like any other.
    stats = node(eni(0, [unit("p/28", 16, assigned=2), unit("a/32"), unit("b/32")]))
    targets = PoolTargets(warm_ip_target=4)
    assert plan(stats, targets, strategy=SECONDARY_IPS) == PoolPlan(release_units=("b/32", "a/32"))


def test_with_no_slot_and_no_eni_left_prefixes_take_the_slots_of_free_32s() -> None:
    limits = NodeLimits(max_enis=1, units_per_eni=3)
    stats = node(eni(0, [unit("a/32", assigned=1), unit("b/32"), unit("c/32")]))
    got = plan(stats, limits=limits)
    # The prefix needs one slot: c goes back first, then the prefix, then b, now spare.
    assert got == PoolPlan(assign=(("eni-0", 1),), release_units=("b/32",), replace_units=("c/32",))
    assert "1 in place of leftovers" in got.reason


def test_a_new_eni_comes_before_giving_free_32s_back_to_make_room() -> None:
    limits = NodeLimits(max_enis=2, units_per_eni=2)
    stats = node(eni(0, [unit("a/32", assigned=1), unit("b/32")]))
    got = plan(stats, limits=limits)
    assert got == PoolPlan(new_enis=(1,), release_units=("b/32",))


def test_replacing_stops_at_what_is_short() -> None:
    limits = NodeLimits(max_enis=1, units_per_eni=4)
    free_32s = [unit(f"{c}/32") for c in "bcd"]
    stats = node(eni(0, [unit("a/32", assigned=1), *free_32s]))
    targets = PoolTargets(warm_ip_target=20, min_eni_lifetime_s=0)
    got = plan(stats, targets, limits)
    # 20 free addresses are two prefixes: two slots are made; the third free /32 is spare.
    assert got == PoolPlan(
        assign=(("eni-0", 2),), release_units=("b/32",), replace_units=("d/32", "c/32")
    )


def test_an_eni_of_free_32s_goes_whole() -> None:
    stats = node(
        eni(0, [unit("p/28", 16, assigned=3), unit("q/28", 16)]),
        eni(1, [unit("a/32"), unit("b/32")]),
    )
    assert plan(stats) == PoolPlan(release_enis=("eni-1",))
