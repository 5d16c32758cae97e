"""Errors are translated at the edge, by AWS error code, and retried only where that is safe.

Answers come from botocore's Stubber or from botocore event hooks (`tests.unit.cloud.hooks`) on a
client built by `make_client` (botocore's retries off): nothing of the adapter's own logic is mocked.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from botocore.exceptions import (
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)
from botocore.stub import Stubber

from cloud.calls import OK, CallLog
from cloud.ec2 import Boto3Ec2
from cloud.errors import (
    AddressLimitExceeded,
    AttachmentLimitExceeded,
    CallTimeout,
    CloudError,
    InUse,
    NotFound,
    Rejected,
    ServiceUnavailable,
    SubnetExhausted,
    SubnetFragmented,
    Throttled,
)
from tests.unit.cloud.conftest import FakeTime, World, adapter
from tests.unit.cloud.hooks import Scripts, ec2_error, ec2_ok, lost_answer, refusal

URL = "https://ec2.invalid/"


@pytest.mark.parametrize(
    ("code", "status", "expected"),
    [
        ("RequestLimitExceeded", 503, Throttled),
        ("Throttling", 400, Throttled),
        ("ThrottlingException", 400, Throttled),
        ("InternalError", 500, ServiceUnavailable),
        ("Unavailable", 503, ServiceUnavailable),
        ("ServiceUnavailable", 503, ServiceUnavailable),
        ("BadGateway", 502, ServiceUnavailable),
        ("PrivateIpAddressLimitExceeded", 400, AddressLimitExceeded),
        ("AttachmentLimitExceeded", 400, AttachmentLimitExceeded),
        ("InsufficientFreeAddressesInSubnet", 400, SubnetExhausted),
        ("InsufficientCidrBlocks", 400, SubnetFragmented),
        ("InvalidNetworkInterface.InUse", 400, InUse),
        ("InvalidNetworkInterfaceID.NotFound", 400, NotFound),
        ("InvalidAttachmentID.NotFound", 400, NotFound),
        ("InvalidSubnetID.NotFound", 400, NotFound),
        ("InvalidInstanceID.NotFound", 400, NotFound),
        ("InvalidParameterValue", 400, Rejected),
        ("UnauthorizedOperation", 403, Rejected),
    ],
)
async def test_client_error_codes(
    offline_client: Any, fake_time: FakeTime, code: str, status: int, expected: type[CloudError]
) -> None:
    calls = CallLog()
    ec2 = adapter(offline_client, calls, fake_time, max_attempts=1)
    with Stubber(offline_client) as stub:
        stub.add_client_error("describe_subnets", code, "no", http_status_code=status)
        with pytest.raises(CloudError) as caught:
            await ec2.subnet("subnet-1")
    assert type(caught.value) is expected
    assert (caught.value.code, caught.value.operation) == (code, "DescribeSubnets")
    assert calls.counts == {("DescribeSubnets", code): 1}


async def test_message_text_never_decides(offline_client: Any, fake_time: FakeTime) -> None:
    ec2 = adapter(offline_client, CallLog(), fake_time, max_attempts=1)
    with Stubber(offline_client) as stub:
        stub.add_client_error(
            "describe_subnets", "InvalidParameterValue", "RequestLimitExceeded InUse NotFound"
        )
        with pytest.raises(Rejected):
            await ec2.subnet("subnet-1")


async def test_wire_format_error_is_read_by_code(
    offline_client: Any, fake_time: FakeTime, scripts: Scripts
) -> None:
    ec2 = adapter(offline_client, CallLog(), fake_time, max_attempts=1)
    scripts(
        offline_client,
        "DescribeSubnets",
        [ec2_error(503, "RequestLimitExceeded")],
        stage="after-apply",
    )
    with pytest.raises(Throttled) as caught:
        await ec2.subnet("subnet-1")
    assert caught.value.code == "RequestLimitExceeded" and caught.value.retryable


@pytest.mark.parametrize(
    ("exc", "expected", "code"),
    [
        (ReadTimeoutError(endpoint_url=URL), CallTimeout, "ReadTimeoutError"),
        (ConnectTimeoutError(endpoint_url=URL), CallTimeout, "ConnectTimeoutError"),
        (EndpointConnectionError(endpoint_url=URL), ServiceUnavailable, "EndpointConnectionError"),
        (ConnectionClosedError(endpoint_url=URL), ServiceUnavailable, "ConnectionClosedError"),
        (NoCredentialsError(), Rejected, "NoCredentialsError"),
    ],
)
async def test_transport_errors(
    offline_client: Any,
    fake_time: FakeTime,
    scripts: Scripts,
    exc: Exception,
    expected: type[CloudError],
    code: str,
) -> None:
    ec2 = adapter(offline_client, CallLog(), fake_time, max_attempts=1)
    script = scripts(offline_client, "DescribeSubnets", [exc], stage="after-apply")
    with pytest.raises(CloudError) as caught:
        await ec2.subnet("subnet-1")
    assert type(caught.value) is expected and caught.value.code == code
    assert isinstance(caught.value.__cause__, type(exc))  # kept for debugging, never raised
    assert script.requests == 1, "botocore's own retries are off: one request per attempt"


async def test_our_timeout_is_a_call_timeout(
    offline_client: Any, fake_time: FakeTime, scripts: Scripts
) -> None:
    calls = CallLog()
    ec2 = Boto3Ec2(offline_client, recorder=calls, call_timeout_s=0.05, sleep=fake_time.sleep)
    steps = [ec2_error(500, "InternalError")] * 5
    scripts(offline_client, "DescribeSubnets", list(steps), stage="after-apply", delay_s=0.15)
    with pytest.raises(CallTimeout) as caught:
        await ec2.subnet("subnet-1")
    assert caught.value.code == "Timeout"
    assert calls.count("DescribeSubnets", "Timeout") == 5, "a describe is retried on a timeout"


# -- what is retried ----------------------------------------------------------------------------


async def test_describe_retried_after_read_timeout_and_recorded(
    world: World, fake_time: FakeTime, scripts: Scripts
) -> None:
    calls = CallLog()
    ec2 = adapter(world.client, calls, fake_time)
    lost = ReadTimeoutError(endpoint_url=URL)
    scripts(world.client, "DescribeSubnets", [lost], stage="after-apply")
    subnet = await ec2.subnet(world.subnet_id)
    assert subnet.subnet_id == world.subnet_id
    assert calls.counts == {("DescribeSubnets", "ReadTimeoutError"): 1, ("DescribeSubnets", OK): 1}
    assert calls.retries == 1 and len(fake_time.sleeps) == 1


@pytest.mark.parametrize(
    "failure",
    [
        ReadTimeoutError(endpoint_url=URL),
        ConnectionClosedError(endpoint_url=URL),
        lost_answer(500, "InternalError", "AssignPrivateIpAddresses"),
    ],
    ids=["read-timeout", "connection-closed", "internal-error"],
)
async def test_assign_not_retried_when_it_may_have_been_applied(
    world: World, fake_time: FakeTime, scripts: Scripts, failure: Exception
) -> None:
    """EC2 acted, the answer was lost: a retry would assign the count twice. The caller gets the
    error and re-reads; the re-read shows what EC2 did."""
    calls = CallLog()
    ec2 = adapter(world.client, calls, fake_time)
    script = scripts(world.client, "AssignPrivateIpAddresses", [failure], stage="after-apply")
    with pytest.raises((CallTimeout, ServiceUnavailable)):
        await ec2.assign_units(world.primary_eni_id, "ip", 2)
    assert script.requests == 1
    assert calls.count("AssignPrivateIpAddresses") == 1 and calls.retries == 0
    (primary,) = await ec2.describe_enis(world.instance_id)
    assert len(primary.secondary_ips) == 2


@pytest.mark.parametrize(
    "failure",
    [
        refusal(503, "RequestLimitExceeded"),
        refusal(503, "Unavailable"),
        EndpointConnectionError(endpoint_url=URL),
        ConnectTimeoutError(endpoint_url=URL),
    ],
    ids=["throttled", "load-shed", "no-connection", "connect-timeout"],
)
async def test_assign_retried_when_ec2_surely_did_not_act(
    world: World, fake_time: FakeTime, scripts: Scripts, failure: Any
) -> None:
    calls = CallLog()
    ec2 = adapter(world.client, calls, fake_time)
    script = scripts(world.client, "AssignPrivateIpAddresses", [failure, failure])
    new = await ec2.assign_units(world.primary_eni_id, "ip", 2)
    assert len(new) == 2 and script.requests == 3
    assert calls.count("AssignPrivateIpAddresses", OK) == 1 and calls.retries == 2
    (primary,) = await ec2.describe_enis(world.instance_id)
    assert {f"{ip}/32" for ip in primary.secondary_ips} == set(new)


async def test_delete_retried_after_a_lost_answer(
    world: World, ec2: Boto3Ec2, calls: CallLog, scripts: Scripts
) -> None:
    """Repeating a delete that was applied can only say NotFound, which callers read as gone."""
    eni = await ec2.create_eni(world.subnet_id, [], "doomed", {"t": "v"})
    lost = ReadTimeoutError(endpoint_url=URL)
    scripts(world.client, "DeleteNetworkInterface", [lost], stage="after-apply")
    with pytest.raises(NotFound):
        await ec2.delete_eni(eni.eni_id)
    assert calls.counts[("DeleteNetworkInterface", "ReadTimeoutError")] == 1
    assert calls.counts[("DeleteNetworkInterface", "InvalidNetworkInterfaceID.NotFound")] == 1
    assert await ec2.find_enis({"t": "v"}) == ()


async def test_permanent_errors_are_not_retried(offline_client: Any, fake_time: FakeTime) -> None:
    calls = CallLog()
    ec2 = adapter(offline_client, calls, fake_time)
    with Stubber(offline_client) as stub:
        stub.add_client_error("describe_subnets", "InvalidSubnetID.NotFound")
        with pytest.raises(NotFound):
            await ec2.subnet("subnet-1")
    assert calls.count() == 1 and fake_time.sleeps == []


async def test_retries_stop_at_max_attempts(
    offline_client: Any, fake_time: FakeTime, scripts: Scripts
) -> None:
    calls = CallLog()
    ec2 = adapter(offline_client, calls, fake_time, max_attempts=3)
    scripts(offline_client, "DescribeSubnets", [refusal(503, "RequestLimitExceeded")] * 5)
    with pytest.raises(Throttled):
        await ec2.subnet("subnet-1")
    assert calls.counts == {("DescribeSubnets", "RequestLimitExceeded"): 3}
    assert calls.retries == 2


async def test_timeout_waiting_for_a_call_slot_is_retried_even_for_a_mutation(
    offline_client: Any, scripts: Scripts
) -> None:
    """A timed-out request keeps its slot until its thread ends. A call that times out while still
    waiting for a slot never went out, so even an unassign is retried; one that went out is not."""
    calls = CallLog()
    fake_time = FakeTime()
    ec2 = Boto3Ec2(
        offline_client,
        recorder=calls,
        max_concurrent_calls=1,
        call_timeout_s=0.2,
        sleep=fake_time.sleep,
    )
    operation = "UnassignPrivateIpAddresses"
    script = scripts(
        offline_client,
        operation,
        [ec2_ok(operation), ec2_ok(operation)],
        stage="after-apply",
        delay_s=lambda n: 0.5 if n == 0 else 0.0,
    )
    with pytest.raises(CallTimeout):  # sent, then no answer in 0.2 s: not retried
        await ec2.unassign_units("eni-1", "ip", ["10.0.1.20/32"])
    assert calls.count(operation) == 1
    # The first request's thread holds the only slot for ~0.3 s more: this call's first attempt
    # times out before sending, the second gets the slot and succeeds.
    await ec2.unassign_units("eni-1", "ip", ["10.0.1.21/32"])
    assert calls.counts == {(operation, "Timeout"): 2, (operation, OK): 1}
    assert script.requests == 2


async def test_cancelled_call_is_recorded_and_propagates(
    offline_client: Any, fake_time: FakeTime, scripts: Scripts
) -> None:
    calls = CallLog()
    ec2 = adapter(offline_client, calls, fake_time)
    steps = [ec2_error(500, "InternalError")]
    scripts(offline_client, "DescribeSubnets", steps, stage="after-apply", delay_s=0.2)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await ec2.subnet("subnet-1")
    assert calls.counts == {("DescribeSubnets", "Cancelled"): 1}


async def test_attach_leaves_delete_on_termination_to_its_own_call(
    world: World, ec2: Boto3Ec2, scripts: Scripts
) -> None:
    """AttachNetworkInterface starts the attachment with DeleteOnTermination false, as EC2 does;
    a refused ModifyNetworkInterfaceAttribute leaves the ENI attached (the pool manager hands its
    addresses out meanwhile, and the drift sets the flag later), and a later one sets it."""
    eni = await ec2.create_eni(world.subnet_id, [], "pods", {"t": "attach"})
    attachment = await ec2.attach_eni(eni.eni_id, world.instance_id, 1)
    (_, attached) = await ec2.describe_enis(world.instance_id)
    assert (attached.eni_id, attached.delete_on_termination) == (eni.eni_id, False)
    scripts(
        world.client, "ModifyNetworkInterfaceAttribute", [refusal(400, "InvalidParameterValue")]
    )
    with pytest.raises(Rejected):
        await ec2.set_delete_on_termination(eni.eni_id, attachment)
    (_, still) = await ec2.describe_enis(world.instance_id)
    assert (still.eni_id, still.delete_on_termination) == (eni.eni_id, False)
    await ec2.set_delete_on_termination(eni.eni_id, attachment)
    (_, bound) = await ec2.describe_enis(world.instance_id)
    assert bound.delete_on_termination is True
