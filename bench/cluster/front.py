"""The account's EC2 front: the API budget every node of the cluster draws from, and the count of
every request that reached EC2, by operation and outcome.

EC2 throttles each account and Region with token buckets (EC2 API reference, "Request throttling for
the Amazon EC2 API"): one family for non-mutating actions (Describe*), one for mutating actions. A
request that finds its bucket empty is refused with `RequestLimitExceeded` and EC2 does nothing. The
documented defaults are the `Ec2Budget` defaults: non-mutating 100 tokens refilled at 20/s, mutating
200 tokens refilled at 5/s. Newer revisions of that page describe buckets per API action; with
`per_action=True` each action gets buckets of those sizes of its own instead of sharing its family's
(the stricter, shared model is the default). Buckets refill by the virtual clock.

Each request also has a latency (virtual seconds from request to answer); EC2 acts when the request
arrives. A front made with `metered=False` admits every request until `meter()`, from which on the
buckets apply, full (how a steady run builds its cluster: `bench.cluster.sim.RunSpec.build_unmetered`). The
front knows nothing of ipamd and nothing of moto: `MotoEc2Client` asks it to `admit` a request
before serving it and tells it the outcome.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from cloud.ratelimit import TokenBucket

OK = "ok"
THROTTLED = "RequestLimitExceeded"

NON_MUTATING = frozenset(
    {"DescribeNetworkInterfaces", "DescribeInstances", "DescribeInstanceTypes", "DescribeSubnets"}
)
"""The read-only actions ipamd calls; every other action counts as mutating."""


@dataclass(frozen=True, slots=True)
class Ec2Budget:
    """The account's API budget and the latency of each request (virtual seconds)."""

    describe_capacity: int = 100
    """Non-mutating (Describe*) bucket size: EC2's documented default."""
    describe_refill_per_s: float = 20.0
    """Non-mutating refill rate: EC2's documented default."""
    mutate_capacity: int = 200
    """Mutating bucket size: EC2's documented default."""
    mutate_refill_per_s: float = 5.0
    """Mutating refill rate: EC2's documented default."""
    per_action: bool = False
    """One pair of bucket sizes per API action instead of one bucket per family."""
    throttling: bool = True
    """False: an unlimited account (nothing is ever refused)."""
    describe_latency_s: float = 0.1
    """Request to answer, non-mutating calls."""
    mutate_latency_s: float = 0.3
    """Request to answer, mutating calls."""


class AccountFront:
    """Admits or throttles each request against the account's buckets and counts outcomes."""

    def __init__(
        self, budget: Ec2Budget, now_s: Callable[[], float], *, metered: bool = True
    ) -> None:
        self.budget = budget
        self._now_s = now_s
        self.metered = metered
        """Whether the buckets apply now (`meter`)."""
        self._buckets: dict[str, TokenBucket] = {}
        """EC2's buckets: `TokenBucket.try_take`, which refuses rather than lends."""
        self.calls: Counter[tuple[str, str]] = Counter()
        """Requests that reached EC2, by (operation, outcome): `ok`, `RequestLimitExceeded` or the
        error code EC2 answered with."""
        self.last_latency_s = 0.0
        """The latency of the request admitted last (read by the executor that delivers answers)."""

    @staticmethod
    def mutating(operation: str) -> bool:
        return operation not in NON_MUTATING

    @classmethod
    def bucket_name(cls, budget: Ec2Budget, operation: str) -> str:
        """Which of the account's buckets `operation` draws from."""
        family = "mutating" if cls.mutating(operation) else "non-mutating"
        return f"{family}:{operation}" if budget.per_action else family

    def bucket(self, operation: str) -> TokenBucket:
        name = self.bucket_name(self.budget, operation)
        found = self._buckets.get(name)
        if found is None:
            b = self.budget
            found = (
                TokenBucket(b.mutate_refill_per_s, b.mutate_capacity, clock=self._now_s)
                if self.mutating(operation)
                else TokenBucket(b.describe_refill_per_s, b.describe_capacity, clock=self._now_s)
            )
            self._buckets[name] = found
        return found

    def admit(self, operation: str) -> bool:
        """Whether EC2 takes the request now; a refusal is counted as throttled."""
        mutating = self.mutating(operation)
        self.last_latency_s = (
            self.budget.mutate_latency_s if mutating else self.budget.describe_latency_s
        )
        if not (self.budget.throttling and self.metered) or self.bucket(operation).try_take():
            return True
        self.calls[operation, THROTTLED] += 1
        return False

    def meter(self) -> None:
        """From now on, the budget applies; its buckets start full."""
        self.metered = True
        self._buckets.clear()

    def record(self, operation: str, outcome: str) -> None:
        self.calls[operation, outcome] += 1

    def snapshot(self) -> Counter[tuple[str, str]]:
        return Counter(self.calls)

    def throttled(self, since: Counter[tuple[str, str]] | None = None) -> int:
        return sum(n for (_, outcome), n in self._since(since).items() if outcome == THROTTLED)

    def by_operation(
        self, since: Counter[tuple[str, str]] | None = None, outcome: str | None = None
    ) -> Counter[str]:
        """Requests per operation since the snapshot `since`: every outcome, or only `outcome`."""
        counts: Counter[str] = Counter()
        for (operation, answered), n in self._since(since).items():
            if outcome is None or answered == outcome:
                counts[operation] += n
        return counts

    def _since(self, since: Counter[tuple[str, str]] | None) -> Counter[tuple[str, str]]:
        if since is None:
            return Counter(self.calls)
        return self.calls - since
