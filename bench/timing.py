"""Timing one awaited call and summarising the samples. No I/O, no engine knowledge."""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Sequence
from typing import TypeVar

T = TypeVar("T")


async def timed_ms(call: Awaitable[T]) -> tuple[float, T]:
    """Await `call`; return the wall time it took in milliseconds, and its result."""
    start = time.perf_counter()
    result = await call
    return (time.perf_counter() - start) * 1000.0, result


def percentile(samples: Sequence[float], q: float) -> float:
    """The `q`-th percentile (0..100), interpolating linearly between the closest ranks."""
    if not samples:
        raise ValueError("no samples")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} is outside 0..100")
    ordered = sorted(samples)
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def p50(samples: Sequence[float]) -> float:
    return percentile(samples, 50.0)


def p99(samples: Sequence[float]) -> float:
    return percentile(samples, 99.0)


def median(samples: Sequence[float]) -> float:
    return statistics.median(samples)
