"""Planning the pool: from the node's stats, the knobs and the instance limits, which units to add
on which ENIs, which ENIs to create, and which units and ENIs to give back to EC2.

`plan_pool` is a pure function; the pool manager applies its `PoolPlan` through the EC2 port. It
grows when the goal (`ipamd.sizing.goals`) is short and then, on the pool that growth leaves, gives
back what the goal does not need. Growth and shrinking test the same conditions, so applying a plan
and planning again gives an empty plan.

Rules every plan keeps:
- no ENI gets more than `units_per_eni` units (releasing ones still take a slot), no more ENIs than
  `effective_max_enis`, and growth stops at the node's max pods (`ipamd.sizing.max_pods`; the last
  prefix may pass it);
- only wholly free units go back (no assigned, cooling or releasing address), and only ENIs that
  are not primary, hold no used or releasing unit, and are at least `min_eni_lifetime_s` old;
- with custom networking the primary ENI is no part of the pool (`pod_stats`): no unit is added to
  it, its units count for nothing, and its wholly free ones go back, as VPC CNI cleans up an ENI
  excluded from pod addresses;
- growth fills the fullest ENIs first, then new ENIs, and adds nothing to an ENI that does not
  grow (`EniStats.grows`: its subnet is full and a new ENI may go elsewhere); shrinking empties
  the emptiest non-primary ENIs first, so whole ENIs can go (VPC CNI picks in Go map order and
  spreads pods: docs/architecture.md §5.4);
- in prefix mode, wholly free /32s (what the fallback to secondary IPs left) are not capacity: they
  go back, and prefixes take their slots when nothing else has room (`ipamd.sizing.prefix_return`);
- while the subnets are scarce, the goal keeps no warm pool above its minimum
  (`ipamd.sizing.scarcity`).

This module must not import asyncio, do I/O, or know the engine, datastore or cloud adapters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from itertools import chain, repeat

from ipamd.sizing.goals import Goal
from ipamd.sizing.inputs import EniStats, NodeLimits, NodeStats, PoolTargets
from ipamd.sizing.max_pods import AddressFamily, MaxPods, compute_node_max_pods
from ipamd.sizing.modes import UnitStrategy
from ipamd.sizing.prefix_return import leftovers_to_return, replacements
from ipamd.sizing.scarcity import scarce_goal
from ipamd.sizing.tally import EniTally, NodeTally, PoolTally, tally_node


@dataclass(frozen=True, slots=True)
class PoolPlan:
    assign: tuple[tuple[str, int], ...] = ()
    """(ENI ID, units to add) on existing ENIs, the fullest ENI first."""
    new_enis: tuple[int, ...] = ()
    """For each ENI to create, the units to assign on it (at least 1)."""
    release_units: tuple[str, ...] = ()
    """CIDRs to return to EC2: each wholly free. Units of ENIs in `release_enis` are not listed."""
    release_enis: tuple[str, ...] = ()
    """ENIs to detach and delete, with their units (all wholly free)."""
    replace_units: tuple[str, ...] = ()
    """Leftover /32s of prefix mode's fallback to give back *before* growing: `assign` puts
    prefixes in their slots (`ipamd.sizing.prefix_return`). Not listed in `release_units`."""
    reason: str = field(default="", compare=False)
    """Why, in a few words, for logs (`warm_ip: short 2 units`)."""

    def is_empty(self) -> bool:
        return not (
            self.assign
            or self.new_enis
            or self.release_units
            or self.release_enis
            or self.replace_units
        )


def effective_max_enis(targets: PoolTargets, limits: NodeLimits) -> int:
    """min(instance type's ENI limit, MAX_ENI); MAX_ENI unset or < 1 is no cap, as in VPC CNI."""
    if targets.max_eni is None or targets.max_eni < 1:
        return limits.max_enis
    return min(limits.max_enis, targets.max_eni)


def enis_for_pods(targets: PoolTargets, limits: NodeLimits) -> int:
    """The ENIs whose addresses pods get: `effective_max_enis`, less the primary with custom
    networking."""
    enis = effective_max_enis(targets, limits)
    return max(enis - 1, 0) if targets.custom_networking else enis


def pod_stats(stats: NodeStats, targets: PoolTargets) -> tuple[NodeStats, tuple[str, ...]]:
    """The ENIs that make the pool, and the units to give back that are no part of it: with custom
    networking, the pool is the secondary ENIs, and the primary's wholly free units (left from a
    start without custom networking, or assigned by someone else) go back to EC2."""
    if not targets.custom_networking:
        return stats, ()
    pool: list[EniStats] = []
    stranded: list[str] = []
    for eni in stats.enis:
        if eni.is_primary:
            stranded.extend(u.cidr for u in eni.units if u.wholly_free)
        else:
            pool.append(eni)
    return NodeStats(tuple(pool)), tuple(stranded)


def compute_max_pods(limits: NodeLimits, strategy: UnitStrategy, enis: int | None = None) -> int:
    """Max pods as EKS computes it over `enis` ENIs (default: the instance type's limit), without
    an override: the mode's formula, capped by vCPU count (`ipamd.sizing.max_pods`)."""
    count = limits.max_enis if enis is None else enis
    return compute_node_max_pods(limits, strategy, count).value


def compute_pod_limit_rule(
    targets: PoolTargets,
    limits: NodeLimits,
    strategy: UnitStrategy,
    family: AddressFamily = "ipv4",
) -> MaxPods:
    """The max pods growth respects and the rule that set it: the override, else the kubelet's,
    else EKS's rules over the ENIs ipamd may use (with custom networking, the primary among them
    carries no pods). In IPv6 (`family`), EKS's rules as with prefix delegation over the instance
    type's ENIs (`ipamd.sizing.max_pods`, rule 6)."""
    enis = effective_max_enis(targets, limits)
    return compute_node_max_pods(
        limits,
        strategy,
        enis,
        custom_networking=targets.custom_networking,
        override=targets.max_pods,
        kubelet=targets.kubelet_max_pods,
        family=family,
    )


def compute_pod_limit(
    targets: PoolTargets,
    limits: NodeLimits,
    strategy: UnitStrategy,
    family: AddressFamily = "ipv4",
) -> int:
    """The max pods growth respects (`compute_pod_limit_rule`'s number)."""
    return compute_pod_limit_rule(targets, limits, strategy, family).value


def compute_address_capacity(
    targets: PoolTargets, limits: NodeLimits, strategy: UnitStrategy
) -> int:
    """Pod addresses the node can hold at most: every ENI ipamd may attach for pods, full."""
    return enis_for_pods(targets, limits) * strategy.addresses_per_eni(limits)


def plan_pool(
    stats: NodeStats,
    targets: PoolTargets,
    limits: NodeLimits,
    strategy: UnitStrategy,
    *,
    scarce: bool = False,
) -> PoolPlan:
    """The plan that brings the pool to the knobs' goal within the limits (empty when it is there);
    `scarce`: with the warm targets at their minimum (`ipamd.sizing.scarcity`)."""
    stats, stranded = pod_stats(stats, targets)
    plan = _plan_pods(stats, targets, limits, strategy, scarce)
    if not stranded:
        return plan
    reason = f"custom networking: returning {len(stranded)} units of the primary ENI"
    return replace(
        plan,
        release_units=stranded + plan.release_units,
        reason=f"{plan.reason}; {reason}" if plan.reason else reason,
    )


def pool_goal(
    targets: PoolTargets, limits: NodeLimits, strategy: UnitStrategy, *, scarce: bool = False
) -> Goal:
    """The goal the knobs set in this mode, its warm part at its minimum while the subnets are
    scarce (`ipamd.sizing.scarcity`)."""
    goal = strategy.goal_for(targets, limits)
    return scarce_goal(goal) if scarce else goal


def tally_for(stats: NodeStats, strategy: UnitStrategy) -> NodeTally:
    """The node counted as the mode plans it: leftovers set aside if the mode replaces them."""
    return tally_node(
        stats, strategy.addresses_per_unit, set_aside_smaller=strategy.replaces_smaller_units
    )


def _plan_pods(
    stats: NodeStats, targets: PoolTargets, limits: NodeLimits, strategy: UnitStrategy, scarce: bool
) -> PoolPlan:
    """`plan_pool` on the ENIs that make the pool (`pod_stats`)."""
    goal = pool_goal(targets, limits, strategy, scarce=scarce)
    node = tally_for(stats, strategy)
    wanted = _units_wanted(goal, node.pool, strategy)
    assign, new_enis, replaced = _plan_growth(node, goal, wanted, targets, limits, strategy)
    why = _reason(goal, wanted, assign, new_enis, replaced)
    if goal.is_short(node.pool):
        # Still short after growth (at a limit): nothing the pool holds is spare.
        return PoolPlan(assign, new_enis, replace_units=replaced, reason=why)
    grown = frozenset(eni_id for eni_id, _ in assign)
    units, enis = _plan_shrink(node, goal, targets, grown, strategy.addresses_per_unit)
    units += leftovers_to_return(node.enis, enis, replaced)
    if not (units or enis):
        return PoolPlan(assign, new_enis, replace_units=replaced, reason=why)
    reason = f"{goal.name}: returning {len(units)} units and {len(enis)} ENIs{_instead(replaced)}"
    return PoolPlan(assign, new_enis, units, enis, replaced, reason=reason)


def _units_wanted(goal: Goal, pool: PoolTally, strategy: UnitStrategy) -> int:
    """Units to add so the goal is met: the one conversion from addresses to units."""
    return max(strategy.units_for(goal.short_addresses(pool)), goal.short_free_units(pool))


def _reason(
    goal: Goal,
    wanted: int,
    assign: tuple[tuple[str, int], ...],
    new_enis: tuple[int, ...],
    replaced: tuple[str, ...],
) -> str:
    if wanted == 0:
        return ""
    added = sum(n for _, n in assign) + sum(new_enis)
    adding = f"adding {added} ({len(new_enis)} new ENIs){_instead(replaced)}"
    return f"{goal.name}: short {wanted} units, {adding}"


def _instead(replaced: tuple[str, ...]) -> str:
    return f", {len(replaced)} in place of leftovers" if replaced else ""


# --- growing --------------------------------------------------------------------------------------


def _plan_growth(
    node: NodeTally,
    goal: Goal,
    wanted: int,
    targets: PoolTargets,
    limits: NodeLimits,
    strategy: UnitStrategy,
) -> tuple[tuple[tuple[str, int], ...], tuple[int, ...], tuple[str, ...]]:
    """Place `wanted` units: existing ENIs first, fullest first, then new ENIs, then in the slots
    of leftovers given back first (`ipamd.sizing.prefix_return`). Updates the pool tally with what
    it adds. Returns the assignments, the new ENIs and the leftovers to give back first."""
    if wanted == 0:
        return (), (), ()
    pool = node.pool
    # VPC CNI stops growing once TotalIPs >= max pods (PR #2745); host-network pods are not
    # subtracted there either, since an override does not say how many there are.
    budget = strategy.units_for(compute_pod_limit(targets, limits, strategy) - pool.total)
    per_eni = limits.units_per_eni
    growing = sorted((eni for eni in node.enis if eni.stats.grows), key=_fill_order)
    rooms = [(eni.stats.eni_id, per_eni - eni.slots) for eni in growing if eni.slots < per_eni]
    spare_enis = max(enis_for_pods(targets, limits) - len(node.enis), 0)
    fresh: Iterable[tuple[str | None, int]] = repeat((None, per_eni), spare_enis)
    assign: list[tuple[str, int]] = []
    new_enis: list[int] = []
    for eni_id, take in _takes(chain(rooms, fresh), wanted, budget, goal.fill_whole_enis):
        if eni_id is None:
            new_enis.append(take)
        else:
            assign.append((eni_id, take))
    placed = sum(n for _, n in assign) + sum(new_enis)
    instead, replaced = replacements(growing, wanted - placed, budget - placed)
    merged = dict(assign)
    for eni_id, take in instead:
        merged[eni_id] = merged.get(eni_id, 0) + take
    added = placed + sum(n for _, n in instead)
    pool.add(strategy.addresses_in(added), added)
    return tuple(merged.items()), tuple(new_enis), replaced


def _takes(
    rooms: Iterable[tuple[str | None, int]], wanted: int, budget: int, whole: bool
) -> Iterator[tuple[str | None, int]]:
    """How many units each room (an ENI's free slots; None = a new ENI) takes, in order, until
    `wanted` units are placed (`whole`: each room touched is filled) or `budget` runs out."""
    for eni_id, room in rooms:
        if wanted <= 0 or budget <= 0 or room <= 0:
            return
        take = min(room if whole else min(room, wanted), budget)
        wanted -= take
        budget -= take
        yield eni_id, take


def _fill_order(eni: EniTally) -> tuple[int, bool, int, int, str]:
    """Fullest first: more used addresses, then the primary (it never goes anyway), then more
    units, then the lowest device index. Pods follow free addresses, so the emptiest ENIs stay
    empty and can be released."""
    s = eni.stats
    return (-eni.used, not s.is_primary, -eni.slots, s.device_index, s.eni_id)


# --- shrinking ------------------------------------------------------------------------------------


def _plan_shrink(
    node: NodeTally, goal: Goal, targets: PoolTargets, grown: frozenset[str], unit_size: int
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Give back what the goal does not need, emptiest non-primary ENI first: the whole ENI when it
    may go, else its wholly free units one by one. Each removal is checked against the pool the
    earlier ones leave, so the result is never short."""
    pool = node.pool
    units: list[str] = []
    enis: list[str] = []
    for eni in sorted(node.enis, key=_release_order):
        if _may_release_eni(eni, targets, grown) and goal.allows_removal(
            pool, eni.available, eni.free_units, whole_eni=True
        ):
            pool.remove(eni.available, eni.free_units)
            enis.append(eni.stats.eni_id)
        elif goal.releases_units:
            units.extend(_spare_units(eni, goal, pool, unit_size))
    return tuple(units), tuple(enis)


def _spare_units(eni: EniTally, goal: Goal, pool: PoolTally, unit_size: int) -> Iterator[str]:
    """The ENI's wholly free units the goal can spare, latest listed first."""
    for unit in reversed(eni.free):
        counted = int(unit.size == unit_size)
        if goal.allows_removal(pool, unit.size, counted, whole_eni=False):
            pool.remove(unit.size, counted)
            yield unit.cidr


def old_enough(age_s: float, targets: PoolTargets) -> bool:
    """Whether an ENI of that age may be released: all the plan reads of an ENI's age (a caller
    that keeps a plan while the ages move on keeps it while this answer stays the same)."""
    return age_s >= targets.min_eni_lifetime_s


def _may_release_eni(eni: EniTally, targets: PoolTargets, grown: frozenset[str]) -> bool:
    """Not primary, nothing used (assigned or cooling, as VPC CNI requires) and no unassign in
    flight (so the pool manager never races its own call), old enough, and not just grown."""
    s = eni.stats
    return (
        not s.is_primary and eni.all_free and old_enough(s.age_s, targets) and s.eni_id not in grown
    )


def _release_order(eni: EniTally) -> tuple[bool, int, int, int, str]:
    """Emptiest first: non-primary, fewer used addresses, fewer units, newest device index."""
    s = eni.stats
    return (s.is_primary, eni.used, eni.slots, -s.device_index, s.eni_id)


# --- releases in flight ---------------------------------------------------------------------------


def kept_after_marking(
    stats: NodeStats, marked: tuple[str, ...], plan: Callable[[NodeStats], PoolPlan]
) -> set[str]:
    """Units just marked for release that `plan` (the round's planner), counting them as free
    again, would keep: an ADD took what was free meanwhile, and the pool needs them after all."""
    if not marked:
        return set()
    wanted = set(marked)
    as_free = NodeStats(
        tuple(
            replace(
                eni,
                units=tuple(
                    replace(u, releasing=False) if u.cidr in wanted else u for u in eni.units
                ),
            )
            for eni in stats.enis
        )
    )
    again = plan(as_free)
    still = set(again.release_units) | set(again.replace_units)
    released = set(again.release_enis)
    for eni in as_free.enis:
        if eni.eni_id in released:
            still.update(u.cidr for u in eni.units)
    return wanted - still
