"""The one jittered backoff: its ceiling doubles up to the cap, its delays stay within
`[floor * ceiling, ceiling]`, spread over that range, and follow the injected random source exactly."""

from __future__ import annotations

import random

import pytest

from cloud.backoff import Backoff, backoff_ceiling_s, backoff_delay_s


def test_the_ceiling_doubles_from_the_base_up_to_the_cap() -> None:
    assert [backoff_ceiling_s(n, 0.25, 3.0) for n in range(1, 7)] == [0.25, 0.5, 1.0, 2.0, 3.0, 3.0]
    assert backoff_ceiling_s(10_000, 0.25, 3.0) == 3.0, "no overflow far past the cap"
    assert backoff_ceiling_s(0, 0.25, 3.0) == 0.25, "an attempt below 1 counts as the first"


def test_full_jitter_spreads_over_the_whole_range_under_the_ceiling() -> None:
    rng = random.Random(42)
    delays = [backoff_delay_s(n, 0.25, 10.0, rng) for n in range(1, 9) for _ in range(50)]
    for i, delay in enumerate(delays):
        assert 0.0 <= delay <= backoff_ceiling_s(i // 50 + 1, 0.25, 10.0)
    assert min(delays[:50]) < 0.05 and max(delays[-50:]) > 5.0, "spread over the whole range"


def test_a_floor_keeps_each_delay_at_least_that_share_of_the_ceiling() -> None:
    rng = random.Random(7)
    for n in range(1, 10):
        ceiling = backoff_ceiling_s(n, 1.0, 30.0)
        delays = [backoff_delay_s(n, 1.0, 30.0, rng, floor=0.5) for _ in range(100)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)


def test_the_delays_are_those_of_the_injected_random_source() -> None:
    first = Backoff(0.25, 10.0, random.Random(42))
    again = Backoff(0.25, 10.0, random.Random(42))
    assert [first.delay_s(n) for n in range(1, 9)] == [again.delay_s(n) for n in range(1, 9)]
    # The same draws the pure function makes: one implementation behind both.
    rng = random.Random(3)
    bound = Backoff(1.0, 60.0, random.Random(3), floor=0.25)
    assert [bound.delay_s(n) for n in range(1, 5)] == [
        backoff_delay_s(n, 1.0, 60.0, rng, floor=0.25) for n in range(1, 5)
    ]
    assert bound.ceiling_s(3) == 4.0


@pytest.mark.parametrize(
    ("base_s", "cap_s", "floor"),
    [(-1.0, 1.0, 0.0), (1.0, -1.0, 0.0), (1.0, 1.0, 1.5), (1.0, 1.0, -0.1)],
)
def test_nonsense_parameters_are_refused(base_s: float, cap_s: float, floor: float) -> None:
    with pytest.raises(ValueError, match="backoff needs"):
        Backoff(base_s, cap_s, floor=floor)
