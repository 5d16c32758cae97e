"""What every EC2 call attempt did: the `CallRecorder` port and `CallLog`, its in-memory implementation.

`cloud.ec2.Boto3Ec2` records one entry per *attempt* (not per logical call), so retries and the errors
that caused them show in the counts. The Prometheus layer reads a `CallLog` (or implements the
Protocol itself); tests read it directly. This module knows nothing of boto3 and does no I/O.
"""

from __future__ import annotations

from collections import Counter
from typing import Protocol

OK = "ok"
"""The outcome of an attempt that succeeded; any other outcome is the error code (`CloudError.code`)."""


class CallRecorder(Protocol):
    def record(self, operation: str, outcome: str, latency_s: float, attempt: int) -> None:
        """One attempt of one EC2 API call.

        `operation` is the EC2 API name (`DescribeNetworkInterfaces`), `outcome` is `"ok"` or the error
        code (`RequestLimitExceeded`, `ReadTimeoutError`, ...), `latency_s` the attempt's own duration
        (not time spent waiting for a rate-limit token or a backoff), `attempt` counts from 1.
        """
        ...


class CallLog:
    """Counts by (operation, outcome), latencies by operation, and how many attempts were retries."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()
        self.latencies_s: dict[str, list[float]] = {}
        self.retries = 0
        """Attempts after the first of their call."""
        self.retries_by_operation: Counter[str] = Counter()

    def record(self, operation: str, outcome: str, latency_s: float, attempt: int) -> None:
        self.counts[operation, outcome] += 1
        self.latencies_s.setdefault(operation, []).append(latency_s)
        if attempt > 1:
            self.retries += 1
            self.retries_by_operation[operation] += 1

    def count(self, operation: str | None = None, outcome: str | None = None) -> int:
        """Attempts matching the operation and outcome given (either may be left out)."""
        return sum(
            n
            for (op, out), n in self.counts.items()
            if (operation is None or op == operation) and (outcome is None or out == outcome)
        )

    def errors(self, operation: str | None = None) -> int:
        """Attempts that did not succeed."""
        return self.count(operation) - self.count(operation, OK)

    def operations(self) -> frozenset[str]:
        return frozenset(op for op, _ in self.counts)
