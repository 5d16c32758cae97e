"""Start-up waits out EC2 errors and a full state disk with backoff, not ready meanwhile, instead of
ending the process (which would only meet the same on restart)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloud.errors import NotFound
from cloud.fakes import FakeEc2
from cloud.ports import CallUrgency, Instance
from ipamd.clock import FakeClock
from ipamd.config.settings import Config
from tests.support.daemons import fake_daemon


async def test_start_retries_a_failing_first_reconcile_with_backoff(tmp_path: Path) -> None:
    clock = FakeClock()
    ec2 = FakeEc2(clock)
    config = Config.from_env({"IPAMD_STATE_DIR": str(tmp_path)})
    daemon = await fake_daemon(config, ec2, clock)
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        assert not daemon.ready, "not ready while start-up waits"
        waits.append(seconds)

    daemon.sleep = sleep
    for _ in range(3):
        ec2.fail_next("describe_enis", after_acting=False)
    try:
        await daemon.start()
        assert daemon.ready
        assert len(waits) == 3, "one wait per failed attempt"
        assert all(0 <= w <= cap for w, cap in zip(waits, (1.0, 2.0, 4.0), strict=True)), (
            "full jitter under a ceiling that doubles"
        )
        assert ec2.calls["describe_enis"] >= 1
    finally:
        await daemon.close()


async def test_building_waits_out_an_instance_read_worth_retrying_one_attempt_a_try(
    tmp_path: Path,
) -> None:
    """Nodes of a cluster starting together meet a throttled account: the instance is read again
    after a full-jitter wait, not by ending the process, and each try is one attempt per call (its
    throttle answers are not retried inside the adapter), so the waits space the tries."""
    clock = FakeClock()
    ec2 = FakeEc2(clock)
    config = Config.from_env({"IPAMD_STATE_DIR": str(tmp_path)})
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    for _ in range(2):
        ec2.fail_next("describe_instance", after_acting=False)
    daemon = await fake_daemon(config, ec2, clock, sleep)
    try:
        assert daemon.instance_id == ec2.instance_id
        assert len(waits) == 2, "one wait per failed try"
        assert all(0 <= w <= cap for w, cap in zip(waits, (1.0, 2.0), strict=True))
        under = ec2.calls_under
        assert under[("describe_instance", CallUrgency.BACKGROUND)] == 3, "each try in background"
        assert under[("describe_instance", CallUrgency.FOREGROUND)] == 0
    finally:
        await daemon.close()


async def test_building_gives_up_at_once_when_ec2_does_not_know_the_instance(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    ec2 = FakeEc2(clock)
    config = Config.from_env({"IPAMD_STATE_DIR": str(tmp_path)})

    async def sleep(seconds: float) -> None:
        raise AssertionError(f"waited {seconds} s for an answer that cannot change")

    async def describe_instance(instance_id: str) -> Instance:
        raise NotFound("DescribeInstances", "InvalidInstanceID.NotFound", instance_id)

    ec2.describe_instance = describe_instance  # type: ignore[method-assign]
    with pytest.raises(NotFound):
        await fake_daemon(config, ec2, clock, sleep)


async def test_start_makes_one_attempt_per_call_in_each_try(tmp_path: Path) -> None:
    clock = FakeClock()
    ec2 = FakeEc2(clock)
    config = Config.from_env({"IPAMD_STATE_DIR": str(tmp_path)})
    daemon = await fake_daemon(config, ec2, clock)
    ec2.calls.clear()
    ec2.calls_under.clear()
    try:
        await daemon.start()
        assert daemon.ready
        background = ec2.calls_under[("describe_enis", CallUrgency.BACKGROUND)]
        assert background == ec2.calls["describe_enis"] >= 1, "every listing in the background"
    finally:
        await daemon.close()
