"""How often, and how many times, ipamd calls EC2: client-side token buckets, jittered exponential backoff
and the retry loop that uses both. Retries happen here and only here: the botocore client is built with
its own retries off (`cloud.ec2.make_client`), so one throttled call never turns into 3 x 5 requests.

Rate limits. EC2 throttles each account and Region with token buckets, one family for non-mutating
(Describe*) actions and one for mutating actions; its documented defaults are 100 tokens refilled at
20/s for non-mutating actions and 50 tokens refilled at 5/s for mutating ones. Every node of a cluster
draws from those same account buckets, so one node must not be able to empty them: our defaults
(`RateLimits`) are a fifth of EC2's, 20 tokens at 4/s for reads and 10 tokens at 1/s for mutations,
which still lets a node grow an ENI (1 mutation) or add a new one (4: create, attach, set
DeleteOnTermination, assign) without waiting. A `Throttled` answer empties the local bucket, because
EC2 just told us the account's bucket is empty: this node's next calls then go out at the refill
rate instead of in a burst that would be throttled too. The rates are constructor parameters; the
composition root may lower them for large clusters.

Retries. Only errors marked `retryable` (`Throttled`, `ServiceUnavailable`, `CallTimeout`) are retried,
with full-jitter exponential backoff (`cloud.backoff`: sleep uniform(0, min(cap, base x 2^(n-1)))
after attempt n, so a fleet failing together does not retry together), up to
`RetryPolicy.max_attempts` attempts in all.
Whether a retryable error may be retried depends on the call:

- *Repeatable* calls are safe to send twice: every Describe*; CreateNetworkInterface (sent with a
  ClientToken, so EC2 answers a repeat with the same ENI); ModifyNetworkInterfaceAttribute setting
  DeleteOnTermination (setting a value twice is setting it once); DetachNetworkInterface and
  DeleteNetworkInterface (attachment and ENI IDs are never reused, so a repeat of a request that did
  act can only answer NotFound, which callers already read as "gone"). They are retried on any
  retryable error, a timeout included.
- Other mutations are not: AssignPrivateIpAddresses by count, sent again after the first request was
  applied but its answer lost, assigns the count twice; UnassignPrivateIpAddresses sent again could
  remove an address EC2 handed back to a concurrent assign on that ENI in between; a repeated
  AttachNetworkInterface fails on the ENI it just attached. They are retried only when EC2 surely did
  not act (`AttemptFailed.not_applied`): a throttled request (EC2 refuses it before processing), a 503
  load-shedding answer, a connection that was never established, or a timeout while still waiting for
  a free call slot. A read timeout, a connection dropped mid-request, a 500 InternalError or our own
  timeout after the request went out leave the outcome unknown: the error goes to the caller, which
  re-reads the ENI (DescribeNetworkInterfaces) before acting again, since the inventory changes only on
  evidence from EC2.

A call made under `CallUrgency.BACKGROUND` (`cloud.ports`) is not retried on a throttle: no pod waits
on it, and the pool manager holds such work back itself while the account is throttled, so the calls
a waiting pod needs get the tokens. The caller says which policy a call runs under (`Retrier.run`);
nothing here guesses it from where the call came from.

Time is injected (`clock`, `sleep`) and so is the random source, so tests are exact and never sleep.
This module knows nothing of boto3; it sees `CloudError`s only.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from cloud.backoff import Backoff
from cloud.calls import OK, CallRecorder
from cloud.errors import CloudError, Throttled
from cloud.ports import CallUrgency

logger = logging.getLogger(__name__)

T = TypeVar("T")

MonotonicClock = Callable[[], float]
"""Seconds from an arbitrary origin that never goes backwards (`time.monotonic`)."""
Sleep = Callable[[float], Awaitable[None]]
"""`asyncio.sleep`, or a fake that advances a fake clock."""


@dataclass(frozen=True, slots=True)
class RateLimits:
    """Client-side token buckets, per process (see the module docstring for the defaults' origin)."""

    read_rate_per_s: float = 4.0
    """Tokens added per second to the bucket of non-mutating (Describe*) calls."""
    read_burst: int = 20
    """Capacity of the read bucket: how many reads may go out at once after a quiet spell."""
    mutate_rate_per_s: float = 1.0
    """Tokens added per second to the bucket of mutating calls."""
    mutate_burst: int = 10
    """Capacity of the mutation bucket."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int = 5
    """Attempts per call in all, the first included; 1 turns retries off."""
    base_s: float = 0.25
    """Backoff ceiling after the first failed attempt; doubles after each further one."""
    cap_s: float = 10.0
    """Largest backoff ceiling."""


class TokenBucket:
    """A token bucket that lends: `take()` takes a token at once, going into debt when the bucket is
    empty, and sleeps until the debt is repaid. Waiters are therefore served in arrival order, and the
    decision needs no lock (no `await` between reading and updating the balance)."""

    def __init__(
        self,
        rate_per_s: float,
        burst: int,
        *,
        clock: MonotonicClock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError(
                f"token bucket needs rate_per_s > 0 and burst >= 1: {rate_per_s}, {burst}"
            )
        self._rate = rate_per_s
        self._burst = float(burst)
        self._clock = clock
        self._sleep = sleep
        self._tokens = float(burst)
        self._stamp = clock()

    @property
    def tokens(self) -> float:
        """The balance now; negative while callers wait."""
        self._refill()
        return self._tokens

    def reserve(self) -> float:
        """Take a token now; returns the seconds to wait before using it (0 if it was there)."""
        self._refill()
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self._rate

    def try_take(self) -> bool:
        """Take a token if one is there; never lends (how EC2's own buckets refuse a request)."""
        self._refill()
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    async def take(self) -> None:
        wait_s = self.reserve()
        if wait_s <= 0:
            return
        try:
            await self._sleep(wait_s)
        except asyncio.CancelledError:
            self._refill()
            self._tokens = min(self._burst, self._tokens + 1.0)  # unused: give it back
            raise

    def drain(self) -> None:
        """Empty the bucket (keeping any debt): the next calls go out at the refill rate."""
        self._refill()
        self._tokens = min(self._tokens, 0.0)

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._stamp) * self._rate)
        self._stamp = now


class AttemptFailed(Exception):
    """One attempt's translated error, and whether EC2 surely did not act on the request."""

    def __init__(self, error: CloudError, *, not_applied: bool) -> None:
        super().__init__(str(error))
        self.error = error
        self.not_applied = not_applied


def may_retry(error: CloudError, *, not_applied: bool, repeatable: bool) -> bool:
    """Retry a retryable error if sending the call again cannot do anything twice."""
    return error.retryable and (repeatable or not_applied)


class Retrier:
    """Runs one EC2 call: a token from the right bucket before each attempt, every attempt recorded,
    backoff between attempts, retries only where `may_retry` allows."""

    def __init__(
        self,
        recorder: CallRecorder,
        *,
        limits: RateLimits | None = None,
        policy: RetryPolicy | None = None,
        clock: MonotonicClock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        limits = limits or RateLimits()
        self.policy = policy or RetryPolicy()
        if self.policy.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1: {self.policy.max_attempts}")
        self.read_bucket = TokenBucket(
            limits.read_rate_per_s, limits.read_burst, clock=clock, sleep=sleep
        )
        self.mutate_bucket = TokenBucket(
            limits.mutate_rate_per_s, limits.mutate_burst, clock=clock, sleep=sleep
        )
        self._backoff = Backoff(self.policy.base_s, self.policy.cap_s, rng)
        self._recorder = recorder
        self._clock = clock
        self._sleep = sleep

    async def run(
        self,
        operation: str,
        attempt: Callable[[], Awaitable[T]],
        *,
        mutating: bool,
        repeatable: bool,
        urgency: CallUrgency = CallUrgency.FOREGROUND,
    ) -> T:
        """Call `attempt` until it succeeds or may not be retried; raises the last `CloudError`.

        `attempt` raises `AttemptFailed` for a failure; `mutating` picks the token bucket;
        `repeatable` says whether sending the request twice is harmless (module docstring);
        `urgency` whether a throttle answer is retried (only in the foreground).
        """
        bucket = self.mutate_bucket if mutating else self.read_bucket
        for n in itertools.count(1):
            await bucket.take()
            started = self._clock()
            try:
                result = await attempt()
            except AttemptFailed as failed:
                error = failed.error
                self._recorder.record(operation, error.code, self._clock() - started, n)
                if isinstance(error, Throttled):
                    bucket.drain()
                retry = may_retry(error, not_applied=failed.not_applied, repeatable=repeatable)
                if isinstance(error, Throttled) and urgency is CallUrgency.BACKGROUND:
                    retry = False
                if not retry or n >= self.policy.max_attempts:
                    raise error from failed.__cause__
                delay_s = self._backoff.delay_s(n)
                logger.debug(
                    "ec2.retry operation=%s code=%s attempt=%d delay_s=%.3f",
                    operation,
                    error.code,
                    n,
                    delay_s,
                )
                await self._sleep(delay_s)
            except asyncio.CancelledError:
                # The caller gave up (its own deadline): visible in the metrics, then propagated.
                self._recorder.record(operation, "Cancelled", self._clock() - started, n)
                raise
            else:
                self._recorder.record(operation, OK, self._clock() - started, n)
                return result
        raise AssertionError("unreachable")  # pragma: no cover - itertools.count never ends
