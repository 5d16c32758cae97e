"""Properties of `plan_pool` over random nodes and knobs: a plan never passes a limit, never gives
back an address in use or the primary ENI, never grows the primary with custom networking, and is
final (applied, the next plan is empty)."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from ipamd.sizing import (
    PREFIXES,
    SECONDARY_IPS,
    EniStats,
    NodeLimits,
    NodeStats,
    PoolPlan,
    PoolTargets,
    UnitStats,
    UnitStrategy,
    compute_pod_limit,
    compute_pool_status,
    effective_max_enis,
    plan_pool,
)
from ipamd.sizing.plan import enis_for_pods, pod_stats
from tests.unit.sizing.simulation import addresses, apply_plan


@dataclass(frozen=True, slots=True)
class Case:
    stats: NodeStats
    targets: PoolTargets
    limits: NodeLimits
    strategy: UnitStrategy

    def plan(self, stats: NodeStats | None = None) -> PoolPlan:
        return plan_pool(stats or self.stats, self.targets, self.limits, self.strategy)


@st.composite
def units_of(draw: st.DrawFn, eni_no: int, size: int, foreign: bool, most: int) -> list[UnitStats]:
    """Up to `most` units; `foreign`: some of the other kind, as after a mode switch or while
    prefix mode falls back to secondary IPs. One unit in ten is releasing."""
    result: list[UnitStats] = []
    for i in range(draw(st.integers(0, most))):
        unit_size = draw(st.sampled_from([size, 17 - size])) if foreign else size
        if draw(st.integers(0, 9)) == 9:
            result.append(UnitStats(f"{eni_no}-{i}", unit_size, 0, 0, releasing=True))
            continue
        assigned = draw(st.integers(0, unit_size))
        cooling = draw(st.integers(0, unit_size - assigned))
        result.append(UnitStats(f"{eni_no}-{i}", unit_size, assigned, cooling))
    return result


@st.composite
def cases(draw: st.DrawFn) -> Case:
    strategy = draw(st.sampled_from([SECONDARY_IPS, PREFIXES]))
    limits = NodeLimits(max_enis=draw(st.integers(1, 8)), units_per_eni=draw(st.integers(1, 10)))
    foreign = draw(st.integers(0, 4)) == 0
    enis: list[EniStats] = []
    for index in range(draw(st.integers(1, limits.max_enis))):
        size = strategy.addresses_per_unit
        unit_list = draw(units_of(index, size, foreign, limits.units_per_eni))
        age = draw(st.sampled_from([0.0, 30.0, 60.0, 3600.0]))
        enis.append(EniStats(f"eni-{index}", index, index == 0, age, tuple(unit_list)))
    targets = PoolTargets(
        warm_eni_target=draw(st.integers(0, 3)),
        warm_ip_target=draw(st.sampled_from([0, 0, 1, 2, 5, 16, 40])),
        minimum_ip_target=draw(st.sampled_from([0, 0, 1, 5, 20, 64])),
        warm_prefix_target=draw(st.integers(0, 3)),
        max_eni=draw(st.none() | st.integers(1, limits.max_enis + 1)),
        max_pods=draw(st.none() | st.integers(1, 200)),
        min_eni_lifetime_s=60.0,
        custom_networking=draw(st.integers(0, 3)) == 0,
    )
    return Case(NodeStats(tuple(enis)), targets, limits, strategy)


@settings(max_examples=400, deadline=None)
@given(cases())
def test_a_plan_passes_no_limit_and_gives_back_nothing_in_use(case: Case) -> None:
    plan = case.plan()
    _check_growth(case, plan)
    _check_release(case, plan)


@settings(max_examples=400, deadline=None)
@given(cases())
def test_a_plan_is_final_and_leaves_the_pool_short_only_at_a_limit(case: Case) -> None:
    plan = case.plan()
    after = apply_plan(case.stats, plan, case.strategy)
    again = case.plan(after)
    assert again.is_empty(), again
    status = compute_pool_status(after, case.targets, case.limits, case.strategy)
    if status.short_units > 0:
        # Growth is blocked, and nothing of the pool was given back (with custom networking the
        # primary's free units are no part of it: they go back whatever the pool needs).
        stranded = set(pod_stats(case.stats, case.targets)[1])
        assert not (set(plan.release_units) - stranded or plan.release_enis)
        pool = pod_stats(after, case.targets)[0]
        full = all(len(e.units) >= case.limits.units_per_eni for e in pool.enis)
        at_enis = len(after.enis) >= status.max_enis
        assert (full and at_enis) or status.total >= status.max_pods


def _check_growth(case: Case, plan: PoolPlan) -> None:
    by_id = {e.eni_id: e for e in case.stats.enis}
    per_eni = case.limits.units_per_eni
    replaced = set(plan.replace_units)
    assert len({eni_id for eni_id, _ in plan.assign}) == len(plan.assign)
    for eni_id, n in plan.assign:
        # The slots of the leftovers given back first are the ENI's to fill again.
        freed = sum(1 for u in by_id[eni_id].units if u.cidr in replaced)
        assert 1 <= n <= per_eni - len(by_id[eni_id].units) + freed
    assert all(1 <= n <= per_eni for n in plan.new_enis)
    spare = effective_max_enis(case.targets, case.limits) - len(case.stats.enis)
    assert len(plan.new_enis) <= max(spare, 0)
    pool = pod_stats(case.stats, case.targets)[0]
    assert len(pool.enis) + len(plan.new_enis) <= max(
        enis_for_pods(case.targets, case.limits), len(pool.enis)
    )
    if case.targets.custom_networking:
        primary = {e.eni_id for e in case.stats.enis if e.is_primary}
        assert not {eni_id for eni_id, _ in plan.assign} & primary, "the primary carries no pods"
    added = sum(n for _, n in plan.assign) + sum(plan.new_enis)
    held = addresses(pool) - sum(u.size for u in _leftovers(case))
    room = compute_pod_limit(case.targets, case.limits, case.strategy) - held
    assert added <= case.strategy.units_for(room)


def _leftovers(case: Case) -> list[UnitStats]:
    """The wholly free units smaller than the mode's, when the mode replaces them: they go back,
    so the pod limit is measured without them (`ipamd.sizing.prefix_return`)."""
    if not case.strategy.replaces_smaller_units:
        return []
    size = case.strategy.addresses_per_unit
    pool = pod_stats(case.stats, case.targets)[0]
    return [u for e in pool.enis for u in e.units if u.wholly_free and u.size < size]


def _check_release(case: Case, plan: PoolPlan) -> None:
    """Only wholly free units go back, and only idle, old, secondary ENIs; with custom networking
    every wholly free unit of the primary goes."""
    units = {u.cidr: u for e in case.stats.enis for u in e.units}
    if case.targets.custom_networking:
        primary = [u for e in case.stats.enis if e.is_primary for u in e.units]
        assert {u.cidr for u in primary if u.wholly_free} <= set(plan.release_units)
    assert len(set(plan.release_units)) == len(plan.release_units)
    for cidr in plan.release_units:
        assert units[cidr].wholly_free, units[cidr]
    leftovers = {u.cidr for u in _leftovers(case)}
    assert len(set(plan.replace_units)) == len(plan.replace_units)
    assert set(plan.replace_units) <= leftovers, "only leftovers make room"
    assert not set(plan.replace_units) & set(plan.release_units)
    if plan.replace_units:
        spare = effective_max_enis(case.targets, case.limits) - len(case.stats.enis)
        assert len(plan.new_enis) == max(spare, 0), "leftovers make room only once new ENIs can't"
    by_id = {e.eni_id: e for e in case.stats.enis}
    for eni_id in plan.release_enis:
        eni = by_id[eni_id]
        assert not eni.is_primary
        assert eni.age_s >= case.targets.min_eni_lifetime_s
        assert all(u.wholly_free for u in eni.units), eni
        assert not {u.cidr for u in eni.units} & set(plan.release_units)
        assert not {u.cidr for u in eni.units} & set(plan.replace_units)
    assert not {eni_id for eni_id, _ in plan.assign} & set(plan.release_enis)
