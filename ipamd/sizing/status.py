"""The pool's numbers for metrics and introspection: what it holds, what the knobs ask for, and how
far it is from that. Pure; no asyncio, no I/O."""

from __future__ import annotations

from dataclasses import dataclass

from ipamd.sizing.inputs import NodeLimits, NodeStats, PoolTargets
from ipamd.sizing.modes import UnitStrategy
from ipamd.sizing.plan import (
    compute_pod_limit,
    effective_max_enis,
    plan_pool,
    pod_stats,
    pool_goal,
    tally_for,
)


@dataclass(frozen=True, slots=True)
class PoolStatus:
    goal: str
    """`warm_ip`, `warm_eni`, `warm_prefix` or `pods` (a pod-aware pool whose warm targets are 0):
    which knobs are in charge; `scarce` while the subnets are (`ipamd.sizing.scarcity`)."""
    enis: int
    max_enis: int
    """`effective_max_enis`: the instance type's limit, capped by MAX_ENI."""
    max_pods: int
    """The max pods growth respects (override, or computed)."""
    total: int
    """Addresses in units that are not releasing (of the secondary ENIs, with custom networking),
    leftovers not counted."""
    assigned: int
    cooling: int
    available: int
    """Free addresses; cooling ones are not counted."""
    free_units: int
    """Wholly free units of the mode's size."""
    releasing_units: int
    short_units: int
    """Units the knobs ask for on top of what the pool holds (before limits); 0 when met."""
    excess_units: int
    """Units the next plan gives back, those on released ENIs included."""
    leftover_units: int = 0
    """Wholly free /32s in prefix mode, which go back (`ipamd.sizing.prefix_return`)."""


def compute_pool_status(
    stats: NodeStats,
    targets: PoolTargets,
    limits: NodeLimits,
    strategy: UnitStrategy,
    *,
    scarce: bool = False,
) -> PoolStatus:
    goal = pool_goal(targets, limits, strategy, scarce=scarce)
    pool = tally_for(pod_stats(stats, targets)[0], strategy).pool
    short = max(strategy.units_for(goal.short_addresses(pool)), goal.short_free_units(pool))
    plan = plan_pool(stats, targets, limits, strategy, scarce=scarce)
    released = set(plan.release_enis)
    excess = (
        len(plan.release_units)
        + len(plan.replace_units)
        + sum(len(eni.units) for eni in stats.enis if eni.eni_id in released)
    )
    return PoolStatus(
        goal=goal.name,
        enis=len(stats.enis),
        max_enis=effective_max_enis(targets, limits),
        max_pods=compute_pod_limit(targets, limits, strategy),
        total=pool.total,
        assigned=pool.assigned,
        cooling=pool.cooling,
        available=pool.available,
        free_units=pool.free_units,
        releasing_units=pool.releasing_units,
        short_units=short,
        excess_units=excess,
        leftover_units=pool.leftovers,
    )
