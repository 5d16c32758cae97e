"""The least time-to-address the account's API budget allows a run's workload: no node-local policy
that obeys the pool's targets could have made its longest wait for an address shorter.

The model (docs/benchmarks.md, "The lower bound on time to address", says why it is a bound):

- **The workload as it happened.** Each pod wants an address on its node from its first ADD until
  it left (its DEL, the ADD given up, its node terminated), as in the run; `d(t)` is how many
  pods a node has then. Nodes join when their ipamd started.
- **Steps, from the targets.** A policy that obeys the targets asks for addresses only when
  `ipamd.sizing.plan_pool` (warm and minimum targets, instance limits, max pods) finds the pool
  short, with every pod the node ever had at once counted and nothing given back: those asks are
  the node's steps, in order, each released when the targets first allow it. A step costs its
  fewest mutating calls: units on an ENI the node has, one AssignPrivateIpAddresses; a new ENI,
  one CreateNetworkInterface carrying its units and one AttachNetworkInterface.
- **When a step is needed.** Step k is due when `d(t)` first exceeds the addresses of the steps
  before it: from then one of the `w` pods beyond them waits until step k is done or `w` pods
  have left the node (its relief). A policy that completes step k only at `c` makes some pod wait
  at least `min(c, relief) - due`.
- **The account's buckets.** Every call takes a token from the run's buckets (`front.Ec2Budget`,
  full at the start) and is answered `mutate_latency_s` later; a step is done when its last call
  is answered, and no sooner than its calls one after another. Where the run's budget applies only
  from `metered_from_s` on (a steady run's cluster built unmetered), a step released before then
  takes no token, and the buckets start full then.

`lower_bound` finds the least `T` for which every step due in the window can be done by
`due + T` (or has its relief sooner), with each node's steps done in order; tokens go to steps in
order of deadline as soon as the buckets have them, which is the order that meets every deadline
whenever any order does. The runtime retries an ADD every `retry_s`, so `T` is rounded up to a
whole number of retries.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from bench.cluster.front import AccountFront, Ec2Budget
from ipamd.sizing import (
    EniStats,
    NodeLimits,
    NodeStats,
    PoolTargets,
    UnitStats,
    UnitStrategy,
    plan_pool,
)

ASSIGN = "AssignPrivateIpAddresses"
CREATE = "CreateNetworkInterface"
ATTACH = "AttachNetworkInterface"
EPSILON_S = 1e-6
MAX_RETRIES = 1 << 22
"""Search ceiling for the bound, in retries (~48 days at 1 s)."""


@dataclass(slots=True)
class PodTrace:
    """One pod as the run saw it (times in the run's clock seconds)."""

    node: str
    first_add_s: float
    address_s: float | None = None
    """When an ADD got it an address; None if none ever did."""
    released_s: float | None = None
    """When it stopped wanting its address (its DEL, the ADD given up, its node gone); None if it
    still held or wanted one at the end."""
    gave_up: bool = False
    """Its ADD was given up at its deadline, without an address."""
    bound_s: float | None = None
    """When the scheduler bound it to its node (None: not known)."""


@dataclass(slots=True)
class NodeTrace:
    name: str
    joined_s: float
    """When its ipamd started."""
    gone_s: float | None = None
    """When its instance was terminated."""


@dataclass(frozen=True, slots=True)
class BoundModel:
    """What the policies the bound covers obey, besides the workload."""

    targets: PoolTargets
    limits: NodeLimits
    strategy: UnitStrategy
    budget: Ec2Budget
    retry_s: float
    metered_from_s: float = -math.inf
    """When the budget began to apply (the buckets full then); steps released before cost no
    token."""


@dataclass(slots=True)
class Step:
    """One ask of one node: `units` on ENI `eni` of the node (a new ENI when `new`)."""

    node: str
    index: int
    """Its place among the node's steps."""
    eni: int
    units: int
    addresses: int
    new: bool
    released_s: float
    before: int
    """Addresses of the node's earlier steps."""
    due_s: float | None = None
    waiting: int = 0
    """Pods beyond the earlier steps' addresses when it fell due."""
    relief_s: float = math.inf
    """When `waiting` pods had left the node after it fell due (inf: never)."""

    def calls(self) -> tuple[str, ...]:
        return (CREATE, ATTACH) if self.new else (ASSIGN,)


# -- the steps of a workload -----------------------------------------------------------------


def steps_of(pods: Sequence[PodTrace], nodes: Iterable[NodeTrace], model: BoundModel) -> list[Step]:
    """Every node's steps, with when each was released and fell due (module docstring)."""
    events: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for pod in pods:
        events[pod.node].append((pod.first_add_s, 1))
        if pod.released_s is not None:
            events[pod.node].append((pod.released_s, -1))
    steps: list[Step] = []
    for node in nodes:
        end = math.inf if node.gone_s is None else node.gone_s
        mine = sorted(e for e in events.get(node.name, ()) if node.joined_s <= e[0] < end)
        steps += _NodeSteps(node, model).replay(mine, end)
    return steps


@dataclass(slots=True)
class _NodeSteps:
    node: NodeTrace
    model: BoundModel
    asked: list[int] = field(default_factory=lambda: [0])
    """Units asked for on each ENI (device index order; the primary first)."""
    steps: list[Step] = field(default_factory=list)
    planned: int = -1

    def replay(self, events: Sequence[tuple[float, int]], end_s: float) -> list[Step]:
        demand = 0
        self._plan(demand, self.node.joined_s)
        due_next = 0
        for t, change in events:
            demand += change
            if change > 0:
                self._plan(demand, t)
                while due_next < len(self.steps) and demand > self.steps[due_next].before:
                    step = self.steps[due_next]
                    step.due_s, step.waiting = t, demand - step.before
                    due_next += 1
            else:
                for step in self.steps[:due_next]:
                    if step.relief_s == math.inf:
                        step.waiting -= 1
                        if step.waiting <= 0:
                            step.relief_s = t
        for step in self.steps[:due_next]:
            step.relief_s = min(step.relief_s, end_s)
        return self.steps

    def _plan(self, demand: int, t: float) -> None:
        """The targets' asks with `demand` pods on the node; nothing when no more pods than
        already planned for (the pool only grows, so they would ask for nothing)."""
        if demand <= self.planned:
            return
        self.planned = demand
        m = self.model
        for _ in range(m.limits.max_enis + len(self.asked) + 2):
            plan = plan_pool(self._stats(demand), m.targets, m.limits, m.strategy)
            if not (plan.assign or plan.new_enis):
                return
            for eni_id, units in plan.assign:
                self._ask(int(eni_id), units, new=False, t=t)
            for units in plan.new_enis:
                self.asked.append(0)
                self._ask(len(self.asked) - 1, units, new=True, t=t)

    def _ask(self, eni: int, units: int, *, new: bool, t: float) -> None:
        before = sum(s.addresses for s in self.steps)
        addresses = self.model.strategy.addresses_in(units)
        self.asked[eni] += units
        index = len(self.steps)
        self.steps.append(Step(self.node.name, index, eni, units, addresses, new, t, before))

    def _stats(self, demand: int) -> NodeStats:
        """The pool as `plan_pool` reads it: every unit asked for, `demand` of its addresses
        assigned (primary ENI first), nothing cooling, every ENI old enough."""
        size = self.model.strategy.addresses_per_unit
        left = demand
        enis: list[EniStats] = []
        for index, count in enumerate(self.asked):
            units: list[UnitStats] = []
            for n in range(count):
                assigned = min(size, left)
                left -= assigned
                units.append(UnitStats(f"{index}/{n}", size, assigned, 0))
            enis.append(EniStats(str(index), index, index == 0, math.inf, tuple(units)))
        return NodeStats(tuple(enis))


# -- the account -----------------------------------------------------------------------------


def deadlines(steps: Sequence[Step], late_s: float, since_s: float, until_s: float) -> list[float]:
    """Each step's deadline if no step due in the window may make a pod wait more than `late_s`:
    a step due in the window whose relief comes later must be done by `due + late_s`, and so must
    every earlier step of its node (inf: no deadline)."""
    out = [math.inf] * len(steps)
    by_node: dict[str, list[int]] = defaultdict(list)
    for i, step in enumerate(steps):
        by_node[step.node].append(i)
    for members in by_node.values():
        limit = math.inf
        for i in reversed(members):
            step = steps[i]
            due = step.due_s
            if due is not None and since_s <= due <= until_s and step.relief_s - due > late_s:
                limit = min(limit, due + late_s)
            out[i] = limit
    return out


def schedule(
    steps: Sequence[Step],
    due_by: Sequence[float],
    budget: Ec2Budget,
    *,
    every: bool = False,
    metered_from_s: float = -math.inf,
) -> list[float] | None:
    """When each step with a deadline is done (inf for the others), its calls given tokens in
    order of deadline as soon as the buckets hold them; None if one misses its deadline. With
    `every`, the steps without one take tokens too, after the others (for the plots). Steps
    released before `metered_from_s` take none."""
    latency_s = budget.mutate_latency_s
    done = [
        s.released_s + len(s.calls()) * latency_s if every or due < math.inf else math.inf
        for s, due in zip(steps, due_by, strict=True)
    ]
    if any(d > limit + EPSILON_S for d, limit in zip(done, due_by, strict=True)):
        return None
    if not budget.throttling:
        return done
    calls: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    for i, step in enumerate(steps):
        if step.released_s < metered_from_s:
            continue
        if every or due_by[i] < math.inf:
            for op in step.calls():
                bucket = AccountFront.bucket_name(budget, op)
                calls[bucket].append((step.released_s, due_by[i] - latency_s, i))
    for wants in calls.values():
        for i, taken, deadline in _serve(wants, budget):
            if taken > deadline + EPSILON_S:
                return None
            done[i] = max(done[i], taken + latency_s)
    return done


def _serve(
    wants: list[tuple[float, float, int]], budget: Ec2Budget
) -> Iterable[tuple[int, float, float]]:
    """(step, when the token was taken, by when it had to be) for each (release, deadline, step)
    call of one bucket: the bucket starts full, and a token goes as soon as it is there to the
    waiting call with the earliest deadline."""
    wants.sort()
    capacity, rate = float(budget.mutate_capacity), budget.mutate_refill_per_s
    level, now, k = capacity, wants[0][0] if wants else 0.0, 0
    ready: list[tuple[float, float, int]] = []
    while k < len(wants) or ready:
        if not ready:
            t = wants[k][0]
            level, now = min(capacity, level + rate * (t - now)), t
        while k < len(wants) and wants[k][0] <= now:
            released, deadline, i = wants[k]
            heapq.heappush(ready, (deadline, released, i))
            k += 1
        at = now if level >= 1.0 else now + (1.0 - level) / rate
        if k < len(wants) and wants[k][0] < at:
            t = wants[k][0]  # a call with an earlier deadline may arrive before the token
            level, now = min(capacity, level + rate * (t - now)), t
            continue
        level, now = min(capacity, level + rate * (at - now)) - 1.0, at
        deadline, _, i = heapq.heappop(ready)
        yield i, now, deadline


# -- the bound -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Bound:
    seconds: float
    """The bound: the least longest wait, in whole retries."""
    steps: list[Step]
    done_s: list[float]
    """When each step is done in a schedule that meets the bound: the steps it needs by their
    deadlines, the others with the tokens left (inf: not needed, and none left in time)."""

    def calls_between(self, since_s: float, until_s: float) -> int:
        """Mutating calls of the steps released in the window."""
        return sum(len(s.calls()) for s in self.steps if since_s <= s.released_s <= until_s)


def lower_bound(
    pods: Sequence[PodTrace],
    nodes: Iterable[NodeTrace],
    model: BoundModel,
    since_s: float,
    until_s: float,
) -> Bound:
    """The bound on the longest time to address of the pods whose steps fall due in the window."""
    steps = steps_of(pods, nodes, model)
    retry_s = model.retry_s

    def feasible(retries: int) -> list[float] | None:
        due_by = deadlines(steps, retries * retry_s, since_s, until_s)
        return schedule(steps, due_by, model.budget, metered_from_s=model.metered_from_s)

    low, high = -1, 1
    while feasible(high) is None and high < MAX_RETRIES:
        low, high = high, high * 2
    if feasible(0) is not None:
        high = 0
    while high - low > 1:
        middle = (low + high) // 2
        if feasible(middle) is None:
            low = middle
        else:
            high = middle
    due_by = deadlines(steps, high * retry_s, since_s, until_s)
    done = schedule(
        steps, due_by, model.budget, every=True, metered_from_s=model.metered_from_s
    ) or feasible(high)
    return Bound(high * retry_s, steps, done or [math.inf] * len(steps))
