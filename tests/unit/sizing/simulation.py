"""A pure model of a node for the policy tests: build stats, apply a plan as the pool manager would
(units arrive wholly free, new ENIs arrive with age 0), schedule pods by packing them as the engine
does, end pods (their addresses cool), and let time pass."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import count

from ipamd.sizing import (
    EniStats,
    NodeLimits,
    NodeStats,
    PoolPlan,
    PoolTargets,
    UnitStats,
    UnitStrategy,
    plan_pool,
)

OLD_S = 3600.0
"""An age well past the minimum ENI lifetime."""

_serial = count()


def unit(
    cidr: str, size: int = 1, assigned: int = 0, cooling: int = 0, releasing: bool = False
) -> UnitStats:
    return UnitStats(cidr, size, assigned, cooling, releasing)


def units(
    eni_no: int, n: int, size: int = 1, assigned: int = 0, cooling: int = 0
) -> list[UnitStats]:
    """`n` units on ENI number `eni_no`, each with `assigned` and `cooling` addresses."""
    return [unit(f"10.{eni_no}.{i}.0/{_bits(size)}", size, assigned, cooling) for i in range(n)]


def eni(device_index: int, unit_list: Sequence[UnitStats] = (), age_s: float = OLD_S) -> EniStats:
    """An ENI whose ID is `eni-<device index>`; device index 0 is the primary."""
    return EniStats(f"eni-{device_index}", device_index, device_index == 0, age_s, tuple(unit_list))


def node(*enis: EniStats) -> NodeStats:
    return NodeStats(tuple(enis))


def fresh_node() -> NodeStats:
    """A node just started: the primary ENI, no units on it yet."""
    return node(eni(0, age_s=0.0))


# --- measuring ------------------------------------------------------------------------------------


def addresses(stats: NodeStats) -> int:
    return sum(u.size for e in stats.enis for u in e.units if not u.releasing)


def assigned(stats: NodeStats) -> int:
    return sum(u.assigned for e in stats.enis for u in e.units)


def free(stats: NodeStats) -> int:
    return sum(u.free for e in stats.enis for u in e.units)


def unit_count(stats: NodeStats) -> int:
    return sum(len(e.units) for e in stats.enis)


def find_unit(stats: NodeStats, cidr: str) -> UnitStats:
    return next(u for e in stats.enis for u in e.units if u.cidr == cidr)


# --- changing -------------------------------------------------------------------------------------


def apply_plan(stats: NodeStats, plan: PoolPlan, strategy: UnitStrategy) -> NodeStats:
    """The node after the pool manager applied `plan` and every EC2 call succeeded."""
    released = set(plan.release_units) | set(plan.replace_units)
    gone = set(plan.release_enis)
    adds = dict(plan.assign)
    enis: list[EniStats] = []
    for e in stats.enis:
        if e.eni_id in gone:
            continue
        kept = tuple(u for u in e.units if u.cidr not in released)
        enis.append(replace(e, units=kept + _new_units(adds.get(e.eni_id, 0), strategy)))
    index = max((e.device_index for e in stats.enis), default=-1) + 1
    for n in plan.new_enis:
        enis.append(EniStats(f"eni-{index}", index, False, 0.0, _new_units(n, strategy)))
        index += 1
    return NodeStats(tuple(enis))


def schedule(stats: NodeStats, pods: int) -> tuple[NodeStats, int]:
    """Give up to `pods` pods a free address each, packing them: the fullest ENI, then the fullest
    unit on it. Returns the node and how many pods are still waiting."""
    while pods > 0:
        spot = _fullest_free(stats)
        if spot is None:
            break
        stats = _update_unit(stats, spot, assigned=1)
        pods -= 1
    return stats, pods


def end_pods(stats: NodeStats, cidr: str, n: int = 1) -> NodeStats:
    """`n` pods on unit `cidr` end: their addresses start cooling."""
    return _update_unit(stats, cidr, assigned=-n, cooling=n)


def end_all_pods(stats: NodeStats) -> NodeStats:
    """Every pod ends: all assigned addresses start cooling."""
    return NodeStats(
        tuple(replace(e, units=tuple(_cooled(u) for u in e.units)) for e in stats.enis)
    )


def cool_down(stats: NodeStats) -> NodeStats:
    """IP_COOLDOWN_PERIOD passes: cooling addresses become free."""
    return NodeStats(
        tuple(replace(e, units=tuple(replace(u, cooling=0) for u in e.units)) for e in stats.enis)
    )


def age(stats: NodeStats, seconds: float) -> NodeStats:
    return NodeStats(tuple(replace(e, age_s=e.age_s + seconds) for e in stats.enis))


@dataclass(frozen=True, slots=True)
class Settled:
    stats: NodeStats
    rounds: int
    waiting: int
    """Pods still without an address."""


def settle(
    stats: NodeStats,
    targets: PoolTargets,
    limits: NodeLimits,
    strategy: UnitStrategy,
    pods: int = 0,
    max_rounds: int = 50,
) -> Settled:
    """Pool ticks until the plan is empty, with `pods` pods arriving: each round plans, applies,
    then schedules waiting pods into free addresses. Stops at the first empty plan once no pod
    can be placed any more."""
    stats, pods = schedule(stats, pods)
    for rounds in range(1, max_rounds + 1):
        plan = plan_pool(stats, targets, limits, strategy)
        if plan.is_empty():
            return Settled(stats, rounds, pods)
        stats, pods = schedule(apply_plan(stats, plan, strategy), pods)
    raise AssertionError(f"no empty plan after {max_rounds} rounds: {stats}")


# --- internals ------------------------------------------------------------------------------------


def _bits(size: int) -> int:
    return 32 - (size.bit_length() - 1)


def _new_units(n: int, strategy: UnitStrategy) -> tuple[UnitStats, ...]:
    size = strategy.addresses_per_unit
    return tuple(unit(f"new-{next(_serial)}/{_bits(size)}", size) for _ in range(n))


def _cooled(u: UnitStats) -> UnitStats:
    return replace(u, assigned=0, cooling=u.cooling + u.assigned)


def _fullest_free(stats: NodeStats) -> str | None:
    best: tuple[int, int, str] | None = None
    for e in stats.enis:
        used = sum(u.assigned + u.cooling for u in e.units)
        for u in e.units:
            if u.free > 0:
                key = (-used, -(u.assigned + u.cooling), u.cidr)
                best = key if best is None or key < best else best
    return None if best is None else best[2]


def _update_unit(stats: NodeStats, cidr: str, assigned: int = 0, cooling: int = 0) -> NodeStats:
    def change(u: UnitStats) -> UnitStats:
        if u.cidr != cidr:
            return u
        return replace(u, assigned=u.assigned + assigned, cooling=u.cooling + cooling)

    return NodeStats(tuple(replace(e, units=tuple(change(u) for u in e.units)) for e in stats.enis))
