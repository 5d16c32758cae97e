"""The lower bound on time to address (`bench.cluster.bound`) on small workloads worked out by hand:
m5.large-like nodes (3 ENIs of 9 secondary addresses), WARM_ENI_TARGET=1, a retry every second."""

from __future__ import annotations

import math

import pytest

from bench.cluster.bound import (
    ASSIGN,
    ATTACH,
    CREATE,
    Bound,
    BoundModel,
    NodeTrace,
    PodTrace,
    Step,
    lower_bound,
    schedule,
    steps_of,
)
from bench.cluster.front import Ec2Budget
from bench.cluster.report import waiting_series
from ipamd.sizing import PREFIXES, SECONDARY_IPS, NodeLimits, PoolTargets

LIMITS = NodeLimits(max_enis=3, units_per_eni=9, vcpus=2)
UNLIMITED = Ec2Budget(throttling=False, mutate_latency_s=0.3)


def model(budget: Ec2Budget = UNLIMITED, *, prefix: bool = False) -> BoundModel:
    strategy = PREFIXES if prefix else SECONDARY_IPS
    return BoundModel(PoolTargets(), LIMITS, strategy, budget, retry_s=1.0)


def pods_at(node: str, t: float, count: int, released_s: float | None = None) -> list[PodTrace]:
    return [PodTrace(node, t, released_s=released_s) for _ in range(count)]


def test_the_targets_steps_and_when_they_fall_due() -> None:
    """Joining, the node fills its primary ENI (9 free). The first pod leaves 8 free: the targets
    ask for a second ENI; the tenth pod leaves 8 of 18 free: a third. The first pod needs the
    primary's addresses, the tenth the second ENI's; the third ENI is never needed."""
    steps = steps_of(pods_at("a", 10.0, 10), [NodeTrace("a", 0.0)], model())
    assert [(s.calls(), s.released_s, s.before, s.due_s) for s in steps] == [
        ((ASSIGN,), 0.0, 0, 10.0),
        ((CREATE, ATTACH), 10.0, 9, 10.0),
        ((CREATE, ATTACH), 10.0, 18, None),
    ]
    assert [s.addresses for s in steps] == [9, 9, 9]


def test_without_throttling_the_bound_is_the_calls_latency_in_whole_retries() -> None:
    """The second ENI is asked for when the tenth pod arrives: create and attach answer 0.6 s
    later, so the tenth pod gets its address at its first retry."""
    bound = lower_bound(pods_at("a", 10.0, 10), [NodeTrace("a", 0.0)], model(), 0.0, 100.0)
    assert bound.seconds == 1.0


def test_a_warm_ask_nobody_needs_takes_no_token_from_a_needed_one() -> None:
    """Two tokens at t=10 (a bucket of 2, one a second): the second ENI's create and attach take
    them; the third ENI, wanted only to keep the pool warm, does not delay it."""
    budget = Ec2Budget(mutate_capacity=2, mutate_refill_per_s=1.0, mutate_latency_s=0.3)
    bound = lower_bound(pods_at("a", 10.0, 10), [NodeTrace("a", 0.0)], model(budget), 0.0, 100.0)
    assert bound.seconds == 1.0


def test_nodes_share_the_account_bucket() -> None:
    """Three nodes each need a new ENI (2 calls) at t=100 with 3 tokens in the bucket and one
    more a second: the six calls are admitted at 100, 100, 100, 101, 102 and 103, so the last
    ENI is answered at 103.3 and some pod waits 3.3 s: 4 retries."""
    budget = Ec2Budget(mutate_capacity=3, mutate_refill_per_s=1.0, mutate_latency_s=0.3)
    nodes = [NodeTrace(n, 0.0) for n in "abc"]
    pods = [p for n in "abc" for p in pods_at(n, 100.0, 10)]
    bound = lower_bound(pods, nodes, model(budget), 0.0, 200.0)
    assert bound.seconds == 4.0
    needed = [d for s, d in zip(bound.steps, bound.done_s, strict=True) if s.due_s == 100.0]
    assert sorted(needed)[-1] == pytest.approx(103.3)


def test_a_pod_leaving_ends_the_wait_before_the_step_is_done() -> None:
    """One token per 100 s: the second ENI is done at 200.3, but a pod leaves at 50, 30 s after
    the tenth pod came, and frees an address for it."""
    budget = Ec2Budget(mutate_capacity=1, mutate_refill_per_s=0.01, mutate_latency_s=0.3)
    pods = [*pods_at("a", 10.0, 1, released_s=50.0), *pods_at("a", 10.0, 8), *pods_at("a", 20, 1)]
    bound = lower_bound(pods, [NodeTrace("a", 0.0)], model(budget), 0.0, 1000.0)
    assert bound.seconds == 30.0


def test_only_steps_falling_due_in_the_window_count() -> None:
    budget = Ec2Budget(mutate_capacity=3, mutate_refill_per_s=1.0, mutate_latency_s=0.3)
    nodes = [NodeTrace(n, 0.0) for n in "abc"]
    pods = [p for n in "abc" for p in pods_at(n, 100.0, 10)]
    assert lower_bound(pods, nodes, model(budget), 0.0, 50.0).seconds == 0.0
    assert lower_bound(pods, nodes, model(budget), 150.0, 300.0).seconds == 0.0


def test_steps_released_before_the_budget_applies_take_no_token() -> None:
    """A steady run builds its cluster unmetered: one token, then one per 100 s. Unmetered until
    50, the primary ENI's addresses (asked for at join, 0) cost nothing, and the second ENI,
    asked for when the tenth pod comes at 60, takes the full bucket's token and the next one:
    done at 160.3. Metered from the start, the join's assign took that first token, and the
    create waits for the next one too (at 100), the attach for the one after (200)."""
    budget = Ec2Budget(mutate_capacity=1, mutate_refill_per_s=0.01, mutate_latency_s=0.3)
    pods, nodes = pods_at("a", 60.0, 10), [NodeTrace("a", 0.0)]
    metered = lower_bound(pods, nodes, model(budget), 50.0, 1000.0)
    assert metered.seconds == 141.0  # 200.3 - 60, in whole retries
    grown = BoundModel(PoolTargets(), LIMITS, SECONDARY_IPS, budget, 1.0, metered_from_s=50.0)
    assert lower_bound(pods, nodes, grown, 50.0, 1000.0).seconds == 101.0  # 160.3 - 60


def test_a_terminated_node_needs_nothing_after_it_is_gone() -> None:
    budget = Ec2Budget(mutate_capacity=1, mutate_refill_per_s=0.01, mutate_latency_s=0.3)
    pods = pods_at("a", 10.0, 10, released_s=12.0)
    bound = lower_bound(pods, [NodeTrace("a", 0.0, gone_s=12.0)], model(budget), 0.0, 1000.0)
    assert bound.seconds == 2.0  # the tenth pod waits from 10 until its node goes at 12


def test_prefix_mode_asks_a_prefix_at_a_time() -> None:
    """WARM_PREFIX_TARGET=1: a prefix at join, another once the first is in use; the 17th pod
    needs the second, asked for when the first pod came (at the same instant here)."""
    steps = steps_of(pods_at("a", 10.0, 17), [NodeTrace("a", 0.0)], model(prefix=True))
    assert [(s.calls(), s.addresses, s.before, s.due_s) for s in steps] == [
        ((ASSIGN,), 16, 0, 10.0),
        ((ASSIGN,), 16, 16, 10.0),
        ((ASSIGN,), 16, 32, None),
    ]
    bound = lower_bound(pods_at("a", 10.0, 17), [NodeTrace("a", 0.0)], model(prefix=True), 0, 99)
    assert bound.seconds == 1.0


def test_tokens_go_to_the_earliest_deadline_even_if_it_was_asked_later() -> None:
    """One token now, the next in 10 s: a step released at 0.5 with a deadline of 2 overtakes one
    released at 0 with a deadline of 100, but not one already admitted."""
    budget = Ec2Budget(mutate_capacity=1, mutate_refill_per_s=0.1, mutate_latency_s=0.3)
    early = Step("a", 0, 0, 1, 1, False, 0.0, 0)
    late = Step("b", 0, 0, 1, 1, False, 0.0, 0)
    urgent = Step("c", 0, 0, 1, 1, False, 0.5, 0)
    done = schedule([early, late, urgent], [50.0, 100.0, 12.0], budget)
    assert done is not None
    assert done == pytest.approx([0.3, 20.3, 10.3])
    assert schedule([early, late, urgent], [50.0, 100.0, 2.0], budget) is None
    none_needed = schedule([early, late], [math.inf, math.inf], budget)
    assert none_needed == [math.inf, math.inf]


def test_pods_waiting_in_the_run_and_under_the_bound() -> None:
    """Two pods from t=0: the run served them at 5 and 7; the bound's one step (1 address) was
    done at 3, so under it one pod still waits after 3 (the second step is never done)."""
    pods = [PodTrace("a", 0.0, address_s=5.0), PodTrace("a", 0.0, address_s=7.0)]
    steps = [Step("a", 0, 0, 1, 1, False, 0.0, 0), Step("a", 1, 0, 1, 1, False, 0.0, 1)]
    bound = Bound(3.0, steps, [3.0, math.inf])
    series = waiting_series(pods, bound, 0.0, 8.0)
    at = {t: (run, best) for t, run, best in series}
    assert at[0.0] == (2, 2)
    assert at[4.0] == (2, 1)
    assert at[6.0] == (1, 1)
    assert at[8.0] == (0, 1)
