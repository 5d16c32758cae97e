"""Pods that wait first (`ipamd.pool.pace`): while the account throttles, warm-up holds back
and a round an ADD waits for does not; a new ENI comes holding its units, and DeleteOnTermination
follows once its addresses can be handed out (docs/architecture.md §5.5 and docs/architecture.md §5.6)."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from cloud.calls import CallLog
from cloud.errors import ServiceUnavailable, Throttled
from cloud.fakes import FakeEc2, FakeImds
from cloud.ports import CallUrgency
from cloud.ratelimit import AttemptFailed, Retrier, RetryPolicy
from ipamd.clock import FakeClock
from ipamd.config.settings import Config
from ipamd.errors import NoAddressAvailable
from ipamd.node.engine_parts import Parts, describe_node, open_parts
from ipamd.pool.enis import BIND_SETTLE_S, BIND_WAIT_CAP_S
from ipamd.pool.pace import (
    DEMAND_EPISODE_SHARE,
    DEMAND_THROTTLE_CAP_S,
    EPISODE_GAP_S,
)
from ipamd.runtime.fake import FakeRuntime
from tests.support.ec2_doubles import PassThroughEc2
from tests.support.node import key

T = TypeVar("T")

READS = frozenset({"describe_enis", "find_enis"})


class ThrottledAccount(PassThroughEc2):
    """EC2 whose mutating calls are refused with RequestLimitExceeded while `throttling`."""

    def __init__(self, inner: FakeEc2) -> None:
        super().__init__(inner)
        self._throttling = [False]  # shared with the views (`with_urgency`)
        self.asked: Counter[str] = Counter()
        """Every call that reached EC2, by port method."""
        self.refused: Counter[str] = Counter()
        self.failing: set[str] = set()
        """Port methods refused as if EC2 were out of capacity, throttling or not."""

    @property
    def throttling(self) -> bool:
        return self._throttling[0]

    @throttling.setter
    def throttling(self, on: bool) -> None:
        self._throttling[0] = on

    async def _around(self, operation: str, call: Callable[[], Awaitable[T]]) -> T:
        self.asked[operation] += 1
        if operation in self.failing:
            raise ServiceUnavailable(operation, "Unavailable", "The service is unavailable.")
        if self.throttling and operation not in READS:
            self.refused[operation] += 1
            raise Throttled(operation, "RequestLimitExceeded", "Request limit exceeded.")
        return await call()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


async def _open(
    tmp_path: Path, clock: FakeClock, env: dict[str, str] | None = None
) -> tuple[Parts, ThrottledAccount]:
    # An m5.large with VPC CNI's defaults (WARM_ENI_TARGET=1): 3 ENIs of 9 pod addresses.
    environ = {"IPAMD_STATE_DIR": str(tmp_path), "IPAMD_MIN_ENI_LIFETIME": "0", **(env or {})}
    fake = FakeEc2(clock)
    account = ThrottledAccount(fake)
    facts = await describe_node(fake, fake.instance_id)
    parts = await open_parts(
        Config.from_env(environ),
        facts,
        ec2=account,
        imds=FakeImds(fake),
        runtime=FakeRuntime(clock),
        clock=clock,
    )
    return parts, account


@pytest.fixture
async def node(tmp_path: Path, clock: FakeClock) -> AsyncIterator[tuple[Parts, ThrottledAccount]]:
    parts, account = await _open(tmp_path, clock)
    yield parts, account
    await parts.engine.close()


async def _settle(parts: Parts, clock: FakeClock) -> None:
    """The targets met and every new ENI's DeleteOnTermination set."""
    for wait_s in (1.0, 1.0, 1.0, 1.0, BIND_SETTLE_S):
        clock.advance(max(parts.pool.conditions.backoff_until - clock.now(), 0.0) + wait_s)
        await parts.pool.run_once()
    assert parts.pool.plan().is_empty() and not parts.pool.unbound_enis


async def test_a_new_eni_comes_holding_its_units_and_is_bound_after_they_are_recorded(
    node: tuple[Parts, ThrottledAccount], clock: FakeClock
) -> None:
    parts, account = node
    await _settle(parts, clock)
    before = set(parts.engine.state.enis())
    for n in range(9):  # the pool's 9 addresses: the warm ENI is due
        await parts.engine.assign(key(f"pod-{n}"))
    account.asked.clear()
    await parts.pool.run_once()
    assert account.asked["create_eni"] == 1 and account.asked["assign_units"] == 0, (
        "the units came with the create"
    )
    (new,) = set(parts.engine.state.enis()) - before
    assert len(parts.engine.state.units_on(new)) == 9, "recorded with its units"
    assert account.asked["set_delete_on_termination"] == 0, "no pod waits on DeleteOnTermination"
    assert parts.pool.unbound_enis == {new} and not parts.pool.pending_enis

    clock.advance(BIND_SETTLE_S - 1.0)
    await parts.pool.run_once()
    assert account.asked["set_delete_on_termination"] == 0, "it waits out the settling time"
    clock.advance(1.0)
    assert (await parts.pool.run_once()).is_empty(), "the pool grows no more"
    assert account.asked["set_delete_on_termination"] == 1
    assert not parts.pool.unbound_enis
    listed = await account.describe_enis(parts.node.instance.instance_id)
    (attached,) = [e for e in listed if e.eni_id == new]
    assert attached.delete_on_termination


async def test_delete_on_termination_waits_while_the_pool_grows_but_not_past_its_cap(
    node: tuple[Parts, ThrottledAccount], clock: FakeClock
) -> None:
    parts, account = node
    pool, engine = parts.pool, parts.engine
    await _settle(parts, clock)
    for n in range(9):
        await engine.assign(key(f"pod-{n}"))
    account.asked.clear()
    await pool.run_once()
    (first,) = pool.unbound_enis
    for n in range(9, 11):  # the new ENI in use: the last warm ENI is due, and cannot be made
        await engine.assign(key(f"pod-{n}"))
    account.failing = {"create_eni"}
    clock.advance(BIND_SETTLE_S)
    await pool.run_once()
    assert pool.plan().new_enis, "the pool still grows"
    assert account.asked["set_delete_on_termination"] == 0, "so DeleteOnTermination waits"
    clock.advance(
        BIND_WAIT_CAP_S - BIND_SETTLE_S + max(pool.conditions.backoff_until - clock.now(), 0)
    )
    await pool.run_once()
    assert account.asked["set_delete_on_termination"] == 1, "but not past its cap"
    assert first not in pool.unbound_enis


async def test_warm_up_holds_back_while_throttled_and_a_waiting_add_goes_first(
    node: tuple[Parts, ThrottledAccount], clock: FakeClock
) -> None:
    parts, account = node
    pool, engine = parts.pool, parts.engine
    await _settle(parts, clock)
    for n in range(8):  # 1 of the pool's 9 addresses left: short of a warm ENI, none waits
        await engine.assign(key(f"pod-{n}"))
    account.throttling = True
    await pool.run_once()
    assert sum(account.refused.values()) == 1, "the warm-up round tried once"
    assert pool.conditions.warm_hold_until > clock.now(), "and holds back after the throttle"
    clock.advance(max(pool.conditions.backoff_until - clock.now(), 0.0))
    assert clock.now() < pool.conditions.warm_hold_until
    before = sum(account.asked.values())
    assert (await pool.run_once()).is_empty()
    assert sum(account.asked.values()) == before, "no call while held, no pod waiting"

    await engine.assign(key("pod-8"))
    with pytest.raises(NoAddressAvailable):
        await engine.assign(key("pod-9"))  # this one waits
    assert pool.pace.demand()
    account.throttling = False
    plan = await pool.run_once()
    assert plan.new_enis == (9,), "the round the pod waits for ran, hold or not"
    assert clock.now() < pool.conditions.warm_hold_until
    assert (await engine.assign(key("pod-9"))).addresses, "and the pod has its address"
    assert pool.health.demand_rounds == 1
    assert not pool.pace.demand(), "served: what is left is warm-up"

    # What the targets still want is background work: it waits out the hold, then goes.
    assert not pool.plan().is_empty()
    clock.advance(max(pool.conditions.backoff_until - clock.now(), 0.0))
    before = sum(account.asked.values())
    if clock.now() < pool.conditions.warm_hold_until:
        assert (await pool.run_once()).is_empty()
        assert sum(account.asked.values()) == before
    clock.advance(max(pool.conditions.warm_hold_until - clock.now(), 0.0) + 0.1)
    assert not (await pool.run_once()).is_empty()
    assert sum(account.asked.values()) > before


async def test_a_waiting_round_asks_one_new_eni_and_leaves_the_rest_to_its_own_round(
    tmp_path: Path, clock: FakeClock
) -> None:
    parts, account = await _open(tmp_path, clock, {"WARM_IP_TARGET": "20"})
    pool, engine = parts.pool, parts.engine
    try:
        with pytest.raises(NoAddressAvailable):
            await engine.assign(key("pod-0"))  # a fresh node: the first pod waits
        assert len(pool.plan().new_enis) >= 2, "the targets want more than one ENI"
        account.asked.clear()
        plan = await pool.run_once()
        assert plan.new_enis == (9,) and account.asked["create_eni"] == 1
        await engine.assign(key("pod-0"))
        clock.advance(1.0)
        await pool.run_once()
        assert account.asked["create_eni"] > 1, "the rest in a round of its own"
    finally:
        await engine.close()


async def test_a_throttled_round_pods_wait_for_is_tried_again_when_its_backoff_ends(
    node: tuple[Parts, ThrottledAccount], clock: FakeClock
) -> None:
    parts, account = node
    pool, engine = parts.pool, parts.engine
    await _settle(parts, clock)
    interval_s = 5.0
    assert pool.pace.next_wait_s(interval_s) == interval_s, "a quiet pool waits for its next tick"
    for n in range(9):
        await engine.assign(key(f"pod-{n}"))
    with pytest.raises(NoAddressAvailable):
        await engine.assign(key("pod-9"))
    account.throttling = True
    await pool.run_once()
    left = pool.conditions.backoff_until - clock.now()
    assert 0 < left < interval_s
    assert pool.pace.next_wait_s(interval_s) == left, (
        "tried again when the backoff ends, no ADD asked"
    )
    clock.advance(left)
    account.throttling = False
    assert (await pool.run_once()).new_enis == (9,)
    assert pool.pace.next_wait_s(interval_s) == interval_s, "served: back to the tick"

    account.throttling = True  # a background round that fails waits for the tick as before
    clock.advance(pool.conditions.warm_hold_until - clock.now() + 1.0)
    for n in range(10, 12):
        await engine.assign(key(f"pod-{n}"))
    assert not pool.pace.demand() and pool.plan().new_enis
    await pool.run_once()
    assert pool.conditions.backoff_until > clock.now()
    assert pool.pace.next_wait_s(interval_s) >= interval_s


async def _attempts_in(urgency: CallUrgency) -> int:
    """Attempts a real `Retrier` makes at one call EC2 keeps throttling, made under `urgency`."""
    made = 0

    async def attempt() -> None:
        nonlocal made
        made += 1
        raise AttemptFailed(Throttled("Op", "RequestLimitExceeded"), not_applied=True)

    async def no_sleep(_s: float) -> None:
        return None

    retrier = Retrier(CallLog(), clock=lambda: 0.0, sleep=no_sleep, rng=random.Random(1))
    with pytest.raises(Throttled):
        await retrier.run("Op", attempt, mutating=True, repeatable=True, urgency=urgency)
    return made


async def test_a_long_throttle_episode_paces_waiting_rounds_by_its_length(
    node: tuple[Parts, ThrottledAccount], clock: FakeClock
) -> None:
    """Until the account throttles the node a waiting round retries in the adapter; from the first
    throttle answer on it makes one attempt per call, tried again within the cap, and later in the
    episode within a share of its length."""
    parts, account = node
    pool, engine, pace = parts.pool, parts.engine, parts.pool.pace
    await _settle(parts, clock)
    for n in range(9):
        await engine.assign(key(f"pod-{n}"))
    retried = await _attempts_in(pace.urgency(demand=True))
    assert retried == RetryPolicy().max_attempts, "a waiting round retries in the adapter"
    account.throttling = True
    share_from_s = DEMAND_THROTTLE_CAP_S / DEMAND_EPISODE_SHARE  # the share passes the cap
    began, waits = clock.now(), []
    while clock.now() - began < 2 * share_from_s:
        with pytest.raises(NoAddressAvailable):
            await engine.assign(key("pod-9"))  # the runtime retries the ADD
        assert pace.demand()
        await pool.run_once()
        episode_s = pace.episode_s()
        left = pool.conditions.backoff_until - clock.now()
        assert 0 < left <= max(DEMAND_THROTTLE_CAP_S, DEMAND_EPISODE_SHARE * episode_s)
        waits.append((episode_s, left))
        assert await _attempts_in(pace.urgency(demand=True)) == 1, "one attempt a round"
        clock.advance(left)
    assert waits[0][0] == 0.0, "the episode began at the first throttle answer"
    assert max(w for e, w in waits if e < share_from_s) <= DEMAND_THROTTLE_CAP_S
    assert max(w for e, w in waits if e >= share_from_s) > DEMAND_THROTTLE_CAP_S, (
        "later in the episode, the rounds ask less often"
    )

    account.throttling = False
    clock.advance(EPISODE_GAP_S + 1.0)  # no throttle answer for longer than the gap
    assert pace.episode_s() == 0.0 and pace.demand_cap_s() == DEMAND_THROTTLE_CAP_S
    assert await _attempts_in(pace.urgency(demand=True)) == retried
    assert await _attempts_in(pace.urgency(demand=False)) == 1, "background work: one attempt"
