"""The pool's conditions (`ipamd.pool.conditions`): what a round may do with the policy's plan, each
condition with its deadline, and `Conditions.trim` the one place that cuts the plan down."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cloud.errors import SubnetExhausted
from cloud.fakes import FakeEc2, FakeImds
from ipamd.clock import FakeClock
from ipamd.config.groups import PoolSettings, SubnetSettings
from ipamd.config.settings import Config
from ipamd.node.engine_parts import Parts, describe_node, open_parts
from ipamd.pool.conditions import Conditions
from ipamd.pool.params import PoolParams
from ipamd.runtime.fake import FakeRuntime
from ipamd.sizing.inputs import PoolTargets
from ipamd.sizing.modes import PREFIXES, SECONDARY_IPS
from ipamd.sizing.plan import PoolPlan

PLAN = PoolPlan(
    assign=(("eni-grown", 2),),
    new_enis=(1, 1),
    release_units=("10.0.0.9/32",),
    release_enis=("eni-spare",),
)
"""A plan that grows and shrinks at once, on ENIs and units the engine does not hold."""
GROWTH = replace(PLAN, release_units=(), release_enis=())
SHRINK = replace(PLAN, assign=(), new_enis=())
FULL = SubnetExhausted("AssignPrivateIpAddresses", "InsufficientFreeAddressesInSubnet", "full")
COOLDOWN_S = 120.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def parts(tmp_path: Path, clock: FakeClock) -> AsyncIterator[Parts]:
    fake = FakeEc2(clock)
    parts = await open_parts(
        Config.from_env({"IPAMD_STATE_DIR": str(tmp_path)}),
        await describe_node(fake, fake.instance_id),
        ec2=fake,
        imds=FakeImds(fake),
        runtime=FakeRuntime(clock),
        clock=clock,
    )
    yield parts
    await parts.engine.close()


def _conditions(
    parts: Parts, clock: FakeClock, free: list[int | None] | None = None, **settings: Any
) -> Conditions:
    """Conditions on `parts`' engine; `free` holds the subnets' free addresses as last read."""
    base = PoolParams(
        PoolTargets(),
        SECONDARY_IPS,
        pool=PoolSettings(shrink_interval_s=0.0, release_delay_s=0.0),
        subnets=SubnetSettings(scarcity_threshold=0, exhausted_cooldown_s=COOLDOWN_S),
    )
    reading = free if free is not None else [None]
    return Conditions(parts.engine, replace(base, **settings), clock, lambda: reading[0])


async def test_a_round_pods_wait_for_applies_what_they_need_and_leaves_the_rest(
    parts: Parts, clock: FakeClock
) -> None:
    conditions = _conditions(parts, clock)
    assert conditions.trim(PLAN, clock.now(), demand=True) == replace(GROWTH, new_enis=(1,))
    assert conditions.trim(PLAN, clock.now(), demand=False) == PLAN


async def test_an_exhausted_subnet_pauses_growth_for_its_cooldown(
    parts: Parts, clock: FakeClock
) -> None:
    conditions = _conditions(parts, clock)
    conditions.subnet_exhausted(FULL)
    assert conditions.subnet_exhausted_until == clock.now() + COOLDOWN_S
    assert conditions.trim(PLAN, clock.now(), demand=False) == SHRINK, "shrinking goes on"
    assert conditions.trim(GROWTH, clock.now(), demand=True).is_empty(), "even for waiting pods"
    clock.advance(COOLDOWN_S)
    assert conditions.trim(GROWTH, clock.now(), demand=False) == GROWTH


async def test_with_the_fallback_an_exhausted_subnet_grows_secondary_ips_instead(
    parts: Parts, clock: FakeClock
) -> None:
    conditions = _conditions(parts, clock, strategy=PREFIXES, fallback_strategy=SECONDARY_IPS)
    assert conditions.strategy is PREFIXES
    conditions.subnet_exhausted(FULL)
    assert conditions.strategy is SECONDARY_IPS
    assert conditions.trim(GROWTH, clock.now(), demand=False) == GROWTH, "growth is not paused"
    clock.advance(COOLDOWN_S)
    assert conditions.strategy is PREFIXES


async def test_two_shrinks_are_the_interval_apart(parts: Parts, clock: FakeClock) -> None:
    conditions = _conditions(
        parts, clock, pool=PoolSettings(shrink_interval_s=60.0, release_delay_s=0.0)
    )
    assert conditions.trim(PLAN, clock.now(), demand=False) == PLAN, "the first shrink goes"
    clock.advance(59.0)
    assert conditions.trim(PLAN, clock.now(), demand=False) == GROWTH, "too soon: growth only"
    clock.advance(1.0)
    assert conditions.trim(SHRINK, clock.now(), demand=False) == SHRINK


async def test_what_is_spare_goes_once_it_has_been_so_for_the_delay_without_a_break(
    parts: Parts, clock: FakeClock
) -> None:
    free: list[int | None] = [100]
    conditions = _conditions(
        parts,
        clock,
        free,
        pool=PoolSettings(shrink_interval_s=0.0, release_delay_s=30.0),
        subnets=SubnetSettings(scarcity_threshold=10, exhausted_cooldown_s=COOLDOWN_S),
    )
    assert not conditions.observe_subnets()
    assert conditions.trim(SHRINK, clock.now(), demand=False).is_empty()
    clock.advance(20.0)
    assert conditions.trim(SHRINK, clock.now(), demand=True).is_empty(), "pods wait: a break"
    clock.advance(20.0)
    assert conditions.trim(SHRINK, clock.now(), demand=False).is_empty(), "the delay began again"
    clock.advance(30.0)
    assert conditions.trim(SHRINK, clock.now(), demand=False) == SHRINK
    free[0] = 9
    assert conditions.observe_subnets() and conditions.subnet_free == 9
    fresh = replace(SHRINK, release_units=("10.0.0.10/32",), release_enis=())
    assert conditions.trim(fresh, clock.now(), demand=False) == fresh, "scarce: no delay"


async def test_a_backoff_stops_every_round_and_a_hold_only_background_work(
    parts: Parts, clock: FakeClock
) -> None:
    conditions = _conditions(parts, clock)
    now = clock.now()
    conditions.back_off(now + 5.0)
    conditions.hold(now + 10.0)
    conditions.hold(now + 3.0)
    assert conditions.backing_off(now) and conditions.held(now)
    assert not conditions.backing_off(now + 5.0) and conditions.held(now + 9.9)
    assert not conditions.held(now + 10.0), "the longest hold counts"


async def test_the_pool_reports_its_conditions_in_one_value(parts: Parts) -> None:
    pool = parts.pool
    before = pool.report()
    assert before.strategy is pool.strategy and not before.prefix_fallback
    assert (before.creating_enis, before.releasing, dict(before.errors_by_code)) == (
        False,
        False,
        {},
    )
    pool.conditions.prefixes_refused()
    assert pool.report().prefix_fallback and not before.prefix_fallback, "a value, not a view"
