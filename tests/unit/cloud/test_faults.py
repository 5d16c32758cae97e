"""Under injected faults (`cloud.embedded.faults.FaultInjector`, seeded) every call the adapter may
retry eventually succeeds, the call log shows each retry, and nothing is done twice."""

from __future__ import annotations

import random

import pytest

from cloud.calls import OK, CallLog
from cloud.ec2 import Boto3Ec2
from cloud.embedded.faults import FaultInjector
from cloud.errors import CallTimeout, Throttled
from cloud.ports import CallUrgency
from cloud.ratelimit import RetryPolicy
from tests.unit.cloud.conftest import FakeTime, World


def _adapter(world: World, calls: CallLog, fake_time: FakeTime, attempts: int) -> Boto3Ec2:
    return Boto3Ec2(
        world.client,
        recorder=calls,
        retry=RetryPolicy(max_attempts=attempts),
        clock=fake_time.clock,
        sleep=fake_time.sleep,
        rng=random.Random(3),
    )


async def test_every_describe_succeeds_under_30_percent_throttling(
    world: World, calls: CallLog, fake_time: FakeTime
) -> None:
    faults = FaultInjector(seed=30)
    faults.throttle(rate=0.3)
    faults.attach(world.client)
    try:
        ec2 = _adapter(world, calls, fake_time, attempts=10)
        for _ in range(40):
            (primary,) = await ec2.describe_enis(world.instance_id)
            assert primary.eni_id == world.primary_eni_id
            assert (await ec2.subnet(world.subnet_id)).subnet_id == world.subnet_id
    finally:
        faults.detach(world.client)
    throttled = faults.injected["throttle"]
    assert 10 < throttled < 50, "about 30 % of ~115 attempts"
    assert calls.count(outcome=OK) == 80
    assert calls.count(outcome="RequestLimitExceeded") == throttled == calls.retries
    assert calls.retries_by_operation.keys() == {"DescribeNetworkInterfaces", "DescribeSubnets"}
    assert fake_time.sleeps, "backoff and pacing waited on the (fake) clock"


async def test_throttled_assigns_are_retried_and_applied_once(
    world: World, calls: CallLog, fake_time: FakeTime
) -> None:
    faults = FaultInjector(seed=7)
    faults.throttle("AssignPrivateIpAddresses", "CreateNetworkInterface", rate=0.3)
    faults.attach(world.client)
    try:
        ec2 = _adapter(world, calls, fake_time, attempts=10)
        eni = await ec2.create_eni(world.subnet_id, [], "pods", {"k": "v"})
        await ec2.attach_eni(eni.eni_id, world.instance_id, 1)
        got = [c for _ in range(4) for c in await ec2.assign_units(eni.eni_id, "ip", 2)]
    finally:
        faults.detach(world.client)
    assert faults.injected["throttle"] > 0
    assert calls.count("AssignPrivateIpAddresses", OK) == 4
    assert len(got) == len(set(got)) == 8
    enis = await ec2.describe_enis(world.instance_id)
    assert {f"{ip}/32" for ip in enis[1].secondary_ips} == set(got)
    assert len(await ec2.find_enis({"k": "v"})) == 1, "no duplicate ENI"


async def test_partial_failure_of_an_assign_is_not_retried(
    world: World, calls: CallLog, fake_time: FakeTime
) -> None:
    """EC2 applied it and the answer was lost: the caller gets CallTimeout and re-reads."""
    faults = FaultInjector(seed=1)
    faults.partial_failure("AssignPrivateIpAddresses", times=1)
    faults.attach(world.client)
    try:
        ec2 = _adapter(world, calls, fake_time, attempts=5)
        with pytest.raises(CallTimeout):
            await ec2.assign_units(world.primary_eni_id, "ip", 3)
    finally:
        faults.detach(world.client)
    assert calls.count("AssignPrivateIpAddresses") == 1
    (primary,) = await ec2.describe_enis(world.instance_id)
    assert len(primary.secondary_ips) == 3, "applied once, visible to the re-read"


async def test_a_background_view_gives_a_throttled_call_up_that_the_adapter_retries(
    world: World, calls: CallLog, fake_time: FakeTime
) -> None:
    """`with_urgency`: the same adapter, its throttled calls tried once; other calls' answers (the
    limits cache) and the call log are the adapter's own."""
    faults = FaultInjector(seed=1)
    faults.throttle("DescribeSubnets")
    faults.attach(world.client)
    try:
        ec2 = _adapter(world, calls, fake_time, attempts=3)
        background = ec2.with_urgency(CallUrgency.BACKGROUND)
        with pytest.raises(Throttled):
            await background.subnet(world.subnet_id)
        assert calls.count("DescribeSubnets", "RequestLimitExceeded") == 1, "one attempt"
        with pytest.raises(Throttled):
            await ec2.subnet(world.subnet_id)
        assert calls.count("DescribeSubnets", "RequestLimitExceeded") == 4, "the adapter retried"
        foreground = background.with_urgency(CallUrgency.FOREGROUND)
        with pytest.raises(Throttled):
            await foreground.subnet(world.subnet_id)
        assert calls.count("DescribeSubnets", "RequestLimitExceeded") == 7
    finally:
        faults.detach(world.client)
    limits = await background.instance_limits(world.instance_type)
    assert await ec2.instance_limits(world.instance_type) == limits
    assert calls.count("DescribeInstanceTypes") == 1, "one cache for the adapter and its views"
