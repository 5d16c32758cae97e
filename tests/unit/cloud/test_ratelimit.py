"""Token buckets and the retry rules, on a fake clock: exact and sleep-free."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

import pytest

from cloud.calls import OK, CallLog
from cloud.errors import (
    AddressLimitExceeded,
    CallTimeout,
    CloudError,
    NotFound,
    ServiceUnavailable,
    Throttled,
)
from cloud.ports import CallUrgency
from cloud.ratelimit import (
    AttemptFailed,
    RateLimits,
    Retrier,
    RetryPolicy,
    TokenBucket,
    may_retry,
)
from tests.unit.cloud.conftest import FakeTime

# -- token bucket -------------------------------------------------------------------------------


def _bucket(fake_time: FakeTime, rate: float = 2.0, burst: int = 3) -> TokenBucket:
    return TokenBucket(rate, burst, clock=fake_time.clock, sleep=fake_time.sleep)


async def test_bucket_serves_a_burst_then_paces_at_the_rate(fake_time: FakeTime) -> None:
    bucket = _bucket(fake_time)
    start = fake_time.now
    for _ in range(3):
        await bucket.take()
    assert fake_time.now == start and fake_time.sleeps == []
    for _ in range(4):
        await bucket.take()
    assert fake_time.sleeps == [0.5, 0.5, 0.5, 0.5]
    assert fake_time.now == pytest.approx(start + 2.0)


async def test_bucket_refills_while_idle_up_to_its_burst(fake_time: FakeTime) -> None:
    bucket = _bucket(fake_time)
    for _ in range(3):
        await bucket.take()
    fake_time.now += 0.75
    assert bucket.tokens == pytest.approx(1.5)
    fake_time.now += 100
    assert bucket.tokens == 3.0


def test_concurrent_takers_wait_in_arrival_order(fake_time: FakeTime) -> None:
    bucket = _bucket(fake_time, rate=4.0, burst=1)
    waits = [bucket.reserve() for _ in range(4)]
    assert waits == [0.0, 0.25, 0.5, 0.75]
    assert bucket.tokens == -3.0


def test_try_take_refuses_instead_of_lending_and_refills_with_time(fake_time: FakeTime) -> None:
    bucket = _bucket(fake_time, rate=2.0, burst=3)
    assert [bucket.try_take() for _ in range(4)] == [True, True, True, False]
    assert bucket.tokens == 0.0, "a refusal takes nothing"
    fake_time.now += 0.5  # one token at 2 per second
    assert bucket.try_take() and not bucket.try_take()


def test_drain_empties_but_keeps_debt(fake_time: FakeTime) -> None:
    bucket = _bucket(fake_time)
    bucket.drain()
    assert bucket.tokens == 0.0
    assert bucket.reserve() == 0.5
    bucket.drain()
    assert bucket.tokens == -1.0


async def test_a_cancelled_wait_gives_its_token_back() -> None:
    clock = [0.0]
    gate = asyncio.Event()

    async def blocked_sleep(_: float) -> None:
        await gate.wait()

    bucket = TokenBucket(1.0, 1, clock=lambda: clock[0], sleep=blocked_sleep)
    await bucket.take()
    waiter = asyncio.create_task(bucket.take(), name="bucket-waiter")
    await asyncio.sleep(0)
    assert bucket.tokens == -1.0
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert bucket.tokens == 0.0


@pytest.mark.parametrize(("rate", "burst"), [(0.0, 1), (-1.0, 5), (1.0, 0)])
def test_bucket_rejects_nonsense(rate: float, burst: int) -> None:
    with pytest.raises(ValueError):
        TokenBucket(rate, burst)


def test_default_limits_are_a_fifth_of_ec2s_account_buckets() -> None:
    limits = RateLimits()
    assert (limits.read_burst, limits.read_rate_per_s) == (100 / 5, 20 / 5)
    assert (limits.mutate_burst, limits.mutate_rate_per_s) == (50 / 5, 5 / 5)


# -- what may be retried ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "not_applied", "repeatable", "expected"),
    [
        (Throttled("Op", "RequestLimitExceeded"), True, False, True),
        (ServiceUnavailable("Op", "Unavailable"), True, False, True),
        (ServiceUnavailable("Op", "InternalError"), False, False, False),
        (ServiceUnavailable("Op", "InternalError"), False, True, True),
        (CallTimeout("Op", "ReadTimeoutError"), False, False, False),
        (CallTimeout("Op", "ReadTimeoutError"), False, True, True),
        (CallTimeout("Op", "Timeout"), True, False, True),
        (AddressLimitExceeded("Op", "PrivateIpAddressLimitExceeded"), True, True, False),
        (NotFound("Op", "InvalidNetworkInterfaceID.NotFound"), True, True, False),
    ],
)
def test_may_retry(error: CloudError, not_applied: bool, repeatable: bool, expected: bool) -> None:
    assert may_retry(error, not_applied=not_applied, repeatable=repeatable) is expected


# -- the retry loop -----------------------------------------------------------------------------


def _failing(errors: list[AttemptFailed], answer: str = "done") -> Callable[[], Awaitable[str]]:
    async def attempt() -> str:
        if errors:
            raise errors.pop(0)
        return answer

    return attempt


def _retrier(fake_time: FakeTime, calls: CallLog, **policy: float) -> Retrier:
    return Retrier(
        calls,
        policy=RetryPolicy(**policy),  # type: ignore[arg-type]
        clock=fake_time.clock,
        sleep=fake_time.sleep,
        rng=random.Random(1),
    )


async def test_every_attempt_is_recorded(fake_time: FakeTime, calls: CallLog) -> None:
    retrier = _retrier(fake_time, calls)
    errors = [
        AttemptFailed(Throttled("Op", "RequestLimitExceeded"), not_applied=True),
        AttemptFailed(ServiceUnavailable("Op", "Unavailable"), not_applied=True),
    ]
    assert await retrier.run("Op", _failing(errors), mutating=False, repeatable=True) == "done"
    assert calls.counts == {
        ("Op", "RequestLimitExceeded"): 1,
        ("Op", "Unavailable"): 1,
        ("Op", OK): 1,
    }
    assert calls.retries == 2 and calls.retries_by_operation == {"Op": 2}


async def test_backoff_sleeps_between_attempts(fake_time: FakeTime, calls: CallLog) -> None:
    retrier = _retrier(fake_time, calls, base_s=1.0, cap_s=4.0, max_attempts=4)
    errors = [AttemptFailed(CallTimeout("Op", "Timeout"), not_applied=False) for _ in range(4)]
    with pytest.raises(CallTimeout):
        await retrier.run("Op", _failing(errors), mutating=False, repeatable=True)
    assert len(fake_time.sleeps) == 3, "no sleep after the last attempt"
    for n, slept in enumerate(fake_time.sleeps, start=1):
        assert 0.0 <= slept <= min(4.0, 2.0 ** (n - 1))
    assert calls.count("Op", "Timeout") == 4


async def test_unsafe_mutation_gives_up_on_an_unknown_outcome(
    fake_time: FakeTime, calls: CallLog
) -> None:
    retrier = _retrier(fake_time, calls)
    errors = [AttemptFailed(CallTimeout("Op", "ReadTimeoutError"), not_applied=False)]
    with pytest.raises(CallTimeout):
        await retrier.run("Op", _failing(errors), mutating=True, repeatable=False)
    assert calls.count() == 1 and fake_time.sleeps == []


async def test_throttling_drains_the_bucket_so_the_next_calls_are_paced(
    fake_time: FakeTime, calls: CallLog
) -> None:
    retrier = Retrier(
        calls,
        limits=RateLimits(mutate_rate_per_s=2.0, mutate_burst=10),
        policy=RetryPolicy(base_s=0.0),
        clock=fake_time.clock,
        sleep=fake_time.sleep,
    )
    throttled = [AttemptFailed(Throttled("Op", "RequestLimitExceeded"), not_applied=True)]
    await retrier.run("Op", _failing(throttled), mutating=True, repeatable=False)
    # After the throttle, the retry waited for a token at 2/s instead of using the burst of 10.
    assert fake_time.sleeps == [0.0, 0.5]
    assert retrier.read_bucket.tokens == 20, "reads draw from their own bucket"


async def test_the_original_exception_is_kept_as_the_cause(
    fake_time: FakeTime, calls: CallLog
) -> None:
    retrier = _retrier(fake_time, calls)
    cause = OSError("socket closed")
    failed = AttemptFailed(NotFound("Op", "InvalidNetworkInterfaceID.NotFound"), not_applied=True)
    failed.__cause__ = cause
    with pytest.raises(NotFound) as caught:
        await retrier.run("Op", _failing([failed]), mutating=False, repeatable=True)
    assert caught.value.__cause__ is cause


def test_max_attempts_must_allow_one_attempt(calls: CallLog) -> None:
    with pytest.raises(ValueError):
        Retrier(calls, policy=RetryPolicy(max_attempts=0))


# -- the call log -------------------------------------------------------------------------------


def test_call_log_counts() -> None:
    log = CallLog()
    log.record("DescribeNetworkInterfaces", OK, 0.01, 1)
    log.record("AssignPrivateIpAddresses", "RequestLimitExceeded", 0.02, 1)
    log.record("AssignPrivateIpAddresses", OK, 0.03, 2)
    assert log.count() == 3 and log.count(outcome=OK) == 2
    assert log.count("AssignPrivateIpAddresses") == 2 and log.errors() == 1
    assert log.errors("DescribeNetworkInterfaces") == 0
    assert log.latencies_s["AssignPrivateIpAddresses"] == [0.02, 0.03]
    assert log.retries == 1
    assert log.operations() == {"DescribeNetworkInterfaces", "AssignPrivateIpAddresses"}


async def test_background_calls_are_not_retried_on_a_throttle_but_on_other_errors(
    fake_time: FakeTime, calls: CallLog
) -> None:
    """Background work gives a throttled call up at once (its caller holds off instead); an
    unavailable answer is retried as ever, and in the foreground a throttle is retried too."""
    retrier = _retrier(fake_time, calls)
    background = CallUrgency.BACKGROUND

    def throttled() -> list[AttemptFailed]:
        return [AttemptFailed(Throttled("Op", "RequestLimitExceeded"), not_applied=True)]

    with pytest.raises(Throttled):
        await retrier.run(
            "Op", _failing(throttled()), mutating=True, repeatable=True, urgency=background
        )
    assert calls.count("Op", "RequestLimitExceeded") == 1 and calls.retries == 0
    unavailable = [AttemptFailed(ServiceUnavailable("Op", "Unavailable"), not_applied=True)]
    assert await retrier.run(
        "Op", _failing(unavailable), mutating=True, repeatable=True, urgency=background
    )
    assert calls.retries == 1
    assert await retrier.run("Op", _failing(throttled()), mutating=True, repeatable=True)
    assert calls.count("Op", "RequestLimitExceeded") == 2 and calls.retries == 2
