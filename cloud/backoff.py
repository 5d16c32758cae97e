"""Jittered exponential backoff, written once for every retry loop of ipamd: EC2 and IMDS calls
(`cloud.ratelimit`, `cloud.imds`), the pool manager's failed ticks, the daemon's start-up and the
datapath's wait for an ENI's link.

The ceiling after failed attempt n (counting from 1) is `min(cap_s, base_s * 2**(n - 1))`; the delay
is drawn uniformly from `[floor * ceiling, ceiling]`. `floor=0` is full jitter, the default: a fleet
of nodes failing together does not retry together. A wait with a floor (`floor=0.5`) keeps at least
half the ceiling between two attempts. Pure: the randomness is the caller's `random.Random`.
"""

from __future__ import annotations

import random

_MAX_DOUBLINGS = 62
"""Far past any cap: keeps `2**n` a float that cannot overflow."""


def backoff_ceiling_s(attempt: int, base_s: float, cap_s: float) -> float:
    """The largest delay after failed attempt `attempt` (counting from 1)."""
    return min(cap_s, base_s * 2.0 ** min(max(attempt - 1, 0), _MAX_DOUBLINGS))


def backoff_delay_s(
    attempt: int, base_s: float, cap_s: float, rng: random.Random, *, floor: float = 0.0
) -> float:
    """The delay after failed attempt `attempt`: uniform in `[floor * ceiling, ceiling]`."""
    ceiling = backoff_ceiling_s(attempt, base_s, cap_s)
    return rng.uniform(floor * ceiling, ceiling)


class Backoff:
    """`backoff_delay_s` with its parameters and randomness bound, for a retry loop to hold."""

    def __init__(
        self,
        base_s: float,
        cap_s: float,
        rng: random.Random | None = None,
        *,
        floor: float = 0.0,
    ) -> None:
        if base_s < 0 or cap_s < 0:
            raise ValueError(f"backoff needs base_s >= 0 and cap_s >= 0: {base_s}, {cap_s}")
        if not 0.0 <= floor <= 1.0:
            raise ValueError(f"backoff needs 0 <= floor <= 1: {floor}")
        self._base_s = base_s
        self._cap_s = cap_s
        self._floor = floor
        self._rng = rng or random.Random()

    def ceiling_s(self, attempt: int) -> float:
        """The largest delay after failed attempt `attempt` (counting from 1)."""
        return backoff_ceiling_s(attempt, self._base_s, self._cap_s)

    def delay_s(self, attempt: int) -> float:
        return backoff_delay_s(attempt, self._base_s, self._cap_s, self._rng, floor=self._floor)
