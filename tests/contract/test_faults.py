"""The fault injector does what it promises to the clients it is attached to."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, ConnectTimeoutError, ReadTimeoutError

from cloud.embedded.faults import FaultInjector
from cloud.embedded.world import World
from tests.contract.conftest import NO_RETRIES
from tests.contract.support import all_addresses, error_of


def throttled_share(world: World, seed: int, calls: int) -> tuple[int, FaultInjector]:
    ec2 = world.client(NO_RETRIES)
    faults = FaultInjector(seed=seed)
    faults.attach(ec2)
    faults.throttle("DescribeNetworkInterfaces", rate=0.3, retried=False)
    throttled = 0
    for _ in range(calls):
        try:
            ec2.describe_network_interfaces(NetworkInterfaceIds=[world.primary_eni_id])
        except ClientError as error:
            assert error.response["Error"]["Code"] == "RequestLimitExceeded"
            assert error.response["ResponseMetadata"]["HTTPStatusCode"] == 503
            throttled += 1
    return throttled, faults


def test_throttle_fraction_is_roughly_honoured_and_repeatable(world: World) -> None:
    """EC2 throttles with RequestLimitExceeded and HTTP 503 (EC2 API reference, error codes; "Request
    throttling"). 30 % of 200 calls are throttled, give or take, and the same seed throttles the same
    calls."""
    first, faults = throttled_share(world, seed=11, calls=200)
    again, _ = throttled_share(world, seed=11, calls=200)

    assert 40 <= first <= 80
    assert again == first
    assert faults.injected == {"throttle": first}


def test_faults_only_hit_the_named_operation(world: World, ec2: Any) -> None:
    """A rule for one operation leaves the others alone."""
    faults = FaultInjector()
    faults.attach(ec2)
    faults.server_error("AssignPrivateIpAddresses", code="Unavailable", retried=False)

    ec2.describe_network_interfaces(NetworkInterfaceIds=[world.primary_eni_id])
    with pytest.raises(ClientError) as excinfo:
        ec2.assign_private_ip_addresses(
            NetworkInterfaceId=world.primary_eni_id, SecondaryPrivateIpAddressCount=1
        )
    assert error_of(excinfo)[0] == "Unavailable"
    assert excinfo.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503


def test_a_faulted_attempt_is_not_applied(world: World, ec2: Any) -> None:
    """A throttled request never reached EC2: nothing changed (before-send, retries exhausted)."""
    faults = FaultInjector()
    faults.attach(ec2)
    faults.throttle("AssignPrivateIpAddresses", times=1)

    with pytest.raises(ClientError) as excinfo:
        ec2.assign_private_ip_addresses(
            NetworkInterfaceId=world.primary_eni_id, SecondaryPrivateIpAddressCount=1
        )
    assert error_of(excinfo)[0] == "RequestLimitExceeded"
    assert len(all_addresses(ec2, world.primary_eni_id)) == 1


def test_before_send_faults_go_through_botocore_retries(world: World) -> None:
    """5xx answers and timeouts injected per attempt are retried by botocore's retry handler; the
    call succeeds once the faults are used up, and applies once."""
    ec2 = world.client(Config(retries={"mode": "standard", "total_max_attempts": 4}))
    faults = FaultInjector()
    faults.attach(ec2)
    faults.server_error("AssignPrivateIpAddresses", times=2)
    faults.timeout("AssignPrivateIpAddresses", times=1)

    answer = ec2.assign_private_ip_addresses(
        NetworkInterfaceId=world.primary_eni_id, SecondaryPrivateIpAddressCount=1
    )

    assert answer["ResponseMetadata"]["RetryAttempts"] == 3
    assert len(all_addresses(ec2, world.primary_eni_id)) == 2
    assert faults.injected == {"server_error": 2, "timeout": 1}


def test_partial_failure_is_applied_but_reported_failed(world: World, ec2: Any) -> None:
    """A call EC2 applied whose answer was lost: the caller sees a read timeout (or a 5xx), and a
    Describe shows the change made."""
    faults = FaultInjector()
    faults.attach(ec2)
    faults.partial_failure("AssignPrivateIpAddresses", times=1)
    faults.partial_failure("AssignPrivateIpAddresses", as_timeout=False, times=1)

    with pytest.raises(ReadTimeoutError):
        ec2.assign_private_ip_addresses(
            NetworkInterfaceId=world.primary_eni_id, SecondaryPrivateIpAddressCount=1
        )
    with pytest.raises(ClientError) as excinfo:
        ec2.assign_private_ip_addresses(
            NetworkInterfaceId=world.primary_eni_id, SecondaryPrivateIpAddressCount=1
        )
    assert error_of(excinfo)[0] == "InternalError"

    assert len(all_addresses(ec2, world.primary_eni_id)) == 3
    assert faults.injected == {"partial_failure": 2}


def test_timeouts_and_latency(world: World, ec2: Any) -> None:
    """Connect and read timeouts raise botocore's own exceptions; latency sleeps through the
    injected sleep before the attempt is answered."""
    slept: list[float] = []
    faults = FaultInjector(sleep=slept.append)
    faults.attach(ec2)
    faults.timeout("DescribeSubnets", connect=True, times=1)
    faults.timeout("DescribeSubnets", times=1)
    faults.latency(0.25, "DescribeVpcs", times=2)

    with pytest.raises(ConnectTimeoutError):
        ec2.describe_subnets(SubnetIds=[world.subnet_id])
    with pytest.raises(ReadTimeoutError):
        ec2.describe_subnets(SubnetIds=[world.subnet_id])
    ec2.describe_subnets(SubnetIds=[world.subnet_id])
    for _ in range(3):
        ec2.describe_vpcs(VpcIds=[world.vpc_id])

    assert slept == [0.25, 0.25]
    assert faults.injected == {"timeout": 2, "latency": 2}


def test_detach_removes_the_faults(world: World, ec2: Any) -> None:
    faults = FaultInjector()
    faults.attach(ec2)
    faults.throttle(retried=False)
    faults.detach(ec2)

    ec2.describe_vpcs(VpcIds=[world.vpc_id])
    assert faults.injected == {}
