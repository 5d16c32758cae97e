"""`Imdsv2Client` against the IMDS simulator on a fresh embedded world: what it reads matches EC2, the
token is shared and renewed, and every failure arrives as a `CloudError` after a bounded retry."""

from __future__ import annotations

import asyncio
import random
import socket
from typing import Any

import pytest

from cloud.calls import OK, CallLog
from cloud.embedded.imds_sim import ImdsSimulator
from cloud.embedded.world import EmbeddedEc2, World
from cloud.embedded.world_layout import Layout
from cloud.errors import CallTimeout, NotFound, Rejected, ServiceUnavailable, Throttled
from cloud.imds import OP_GET, OP_TOKEN, Imdsv2Client
from cloud.ports import ImdsInterface
from cloud.ratelimit import RetryPolicy
from tests.unit.cloud.imds.conftest import (
    FakeTime,
    assign_ips,
    assign_prefixes,
    attach_eni,
    ec2_enis,
    make_client,
)


def _as_ec2(
    found: tuple[ImdsInterface, ...],
) -> dict[str, tuple[str, frozenset[str], frozenset[str]]]:
    return {
        eni.eni_id: (eni.local_ipv4s[0], frozenset(eni.local_ipv4s), frozenset(eni.ipv4_prefixes))
        for eni in found
    }


async def test_identity_matches_the_instance(imds: Imdsv2Client, world: World, ec2: Any) -> None:
    identity = await imds.identity()
    assert identity.instance_id == world.instance_id
    assert identity.instance_type == world.instance_type
    assert identity.region == world.region
    assert identity.availability_zone == world.availability_zone
    (eni,) = ec2.describe_network_interfaces(NetworkInterfaceIds=[world.primary_eni_id])[
        "NetworkInterfaces"
    ]
    assert identity.macs == (eni["MacAddress"],)


async def test_interfaces_match_ec2_with_secondaries_prefixes_and_a_second_eni(
    imds: Imdsv2Client, world: World, ec2: Any
) -> None:
    assign_ips(ec2, world.primary_eni_id, 3)
    assign_prefixes(ec2, world.primary_eni_id, 2)
    second = attach_eni(ec2, world, 1)
    assign_ips(ec2, second, 2)
    found = await imds.interfaces()
    assert [(e.eni_id, e.device_number) for e in found] == [(world.primary_eni_id, 0), (second, 1)]
    assert all(e.subnet_id == world.subnet_id for e in found)
    assert _as_ec2(found) == ec2_enis(ec2, world)
    assert len(found[0].local_ipv4s) == 4 and len(found[0].ipv4_prefixes) == 2
    assert found[1].ipv4_prefixes == ()  # IMDS answered 404: read as none
    assert (await imds.identity()).macs == tuple(e.mac for e in found)


async def test_one_token_serves_every_read(
    imds: Imdsv2Client, sim: ImdsSimulator, calls: CallLog
) -> None:
    await imds.identity()
    await imds.interfaces()
    assert sim.count("PUT") == 1
    assert calls.count(OP_TOKEN) == 1 and calls.errors() == 0
    assert calls.count(OP_GET, OK) == sim.count("GET", 200) + sim.count("GET", 404)


async def test_token_is_renewed_a_margin_before_it_expires(
    sim: ImdsSimulator, fake_time: FakeTime, calls: CallLog
) -> None:
    async with make_client(
        sim.base_url, fake_time, calls, token_ttl_s=600, token_refresh_margin_s=60
    ) as imds:
        await imds.identity()
        fake_time.advance(539)
        await imds.identity()
        assert sim.count("PUT") == 1
        fake_time.advance(2)  # 541 s: within the margin, still valid for IMDS
        await imds.identity()
        assert sim.count("PUT") == 2
        fake_time.advance(700)  # long past expiry
        await imds.identity()
        assert sim.count("PUT") == 3
    assert sim.count(status=401) == 0


async def test_a_401_renews_the_token_once_and_the_read_succeeds(
    imds: Imdsv2Client, sim: ImdsSimulator, world: World, calls: CallLog
) -> None:
    await imds.identity()
    sim.revoke_tokens()  # IMDS restarted and forgot the token
    identity = await imds.identity()
    assert identity.instance_id == world.instance_id
    assert sim.count("PUT") == 2
    assert sim.count("GET", 401) >= 1
    assert calls.count(OP_GET, "Unauthorized") == sim.count("GET", 401)


async def test_a_token_refused_twice_is_rejected(imds: Imdsv2Client, sim: ImdsSimulator) -> None:
    sim.faults.fail_path("*/instance-id", 401)
    with pytest.raises(Rejected) as raised:
        await imds.identity()
    assert raised.value.code == "Unauthorized"
    assert sim.count("PUT") == 2  # the first token, and one renewal


async def test_a_missing_prefix_list_reads_as_empty(
    imds: Imdsv2Client, sim: ImdsSimulator, world: World, ec2: Any, calls: CallLog
) -> None:
    assign_prefixes(ec2, world.primary_eni_id, 1)
    sim.faults.not_found("*/ipv4-prefix")
    (eni,) = await imds.interfaces()
    assert eni.ipv4_prefixes == ()
    assert calls.errors() == 0  # a 404 on an optional list is an answer, not an error


async def test_a_missing_required_path_is_not_found(imds: Imdsv2Client, sim: ImdsSimulator) -> None:
    sim.faults.not_found("*/local-ipv4s")
    with pytest.raises(NotFound) as raised:
        await imds.interfaces()
    assert "local-ipv4s" in str(raised.value)


async def test_5xx_answers_are_retried_with_backoff_then_succeed(
    imds: Imdsv2Client, sim: ImdsSimulator, world: World, calls: CallLog, fake_time: FakeTime
) -> None:
    sim.faults.fail_next(1, 500)  # the token request, twice
    sim.faults.fail_next(1, 503)
    identity = await imds.identity()
    assert identity.instance_id == world.instance_id
    assert [calls.count(OP_TOKEN, c) for c in ("HTTP500", "HTTP503", OK)] == [1, 1, 1]
    sim.faults.fail_next(2, 502)  # two of the concurrent reads
    (eni,) = await imds.interfaces()
    assert eni.eni_id == world.primary_eni_id
    assert calls.count(OP_GET, "HTTP502") == 2
    assert calls.retries == 4
    assert len(fake_time.sleeps) == 4
    assert all(0 <= s <= 0.1 for s in fake_time.sleeps)  # base 0.05 s, doubling per attempt


async def test_errors_after_the_retries_are_spent(
    imds: Imdsv2Client, sim: ImdsSimulator, calls: CallLog, fake_time: FakeTime
) -> None:
    sim.faults.fail_next(3, 503)
    with pytest.raises(ServiceUnavailable) as raised:
        await imds.identity()
    assert raised.value.code == "HTTP503" and raised.value.retryable
    assert calls.count(OP_TOKEN) == 3 and calls.count(OP_GET) == 0
    assert len(fake_time.sleeps) == 2  # between attempts, none after the last
    await imds.identity()  # IMDS is back: the client still works


async def test_throttling_is_retried_then_reported(imds: Imdsv2Client, sim: ImdsSimulator) -> None:
    sim.faults.fail_path("/latest/meta-data/instance-type", 429)
    with pytest.raises(Throttled):
        await imds.identity()
    assert sim.count("GET", 429) == 3


async def test_permanent_refusals_are_not_retried(imds: Imdsv2Client, sim: ImdsSimulator) -> None:
    sim.faults.fail_path("/latest/api/token", 403)
    with pytest.raises(Rejected) as raised:
        await imds.interfaces()
    assert raised.value.code == "Forbidden"
    assert sim.count("PUT") == 1


async def test_slow_answers_time_out(
    sim: ImdsSimulator, fake_time: FakeTime, calls: CallLog
) -> None:
    sim.faults.delay_s = 5.0
    retry = RetryPolicy(max_attempts=2, base_s=0.01, cap_s=0.01)
    async with make_client(
        sim.base_url, fake_time, calls, request_timeout_s=0.05, retry=retry
    ) as imds:
        with pytest.raises(CallTimeout) as raised:
            await imds.identity()
    assert raised.value.operation == OP_TOKEN and raised.value.retryable
    assert calls.count(OP_TOKEN, "Timeout") == 2


async def test_a_refused_connection_is_service_unavailable(
    fake_time: FakeTime, calls: CallLog
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with make_client(f"http://127.0.0.1:{port}", fake_time, calls) as imds:
        with pytest.raises(ServiceUnavailable) as raised:
            await imds.interfaces()
    assert raised.value.code.startswith("Client")
    assert calls.count(OP_TOKEN) == 3


async def test_random_5xx_within_the_retry_budget_go_unnoticed(
    sim: ImdsSimulator, world: World, ec2: Any, fake_time: FakeTime, calls: CallLog
) -> None:
    assign_ips(ec2, world.primary_eni_id, 5)
    sim.faults.fail_fraction(0.2)
    async with make_client(
        sim.base_url, fake_time, calls, retry=RetryPolicy(max_attempts=6, base_s=0.01)
    ) as imds:
        for _ in range(5):
            assert _as_ec2(await imds.interfaces()) == ec2_enis(ec2, world)
    assert sim.count(status=503) > 0 and calls.retries == sim.count(status=503)


async def test_concurrent_readers_share_one_token_request(
    imds: Imdsv2Client, sim: ImdsSimulator, world: World, ec2: Any
) -> None:
    attach_eni(ec2, world, 1)
    attach_eni(ec2, world, 2)
    found = await imds.interfaces()
    assert [e.device_number for e in found] == [0, 1, 2]
    assert sim.count("PUT") == 1


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="token_ttl_s"):
        Imdsv2Client(token_ttl_s=21601)
    with pytest.raises(ValueError, match="token_refresh_margin_s"):
        Imdsv2Client(token_ttl_s=60, token_refresh_margin_s=60)
    with pytest.raises(ValueError):
        Imdsv2Client(request_timeout_s=0)


async def test_a_closed_client_refuses_to_read(sim: ImdsSimulator, calls: CallLog) -> None:
    imds = Imdsv2Client(sim.base_url, recorder=calls)
    await imds.identity()
    await imds.close()
    await imds.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        await imds.identity()


async def test_a_caller_giving_up_cancels_every_read(
    imds: Imdsv2Client, sim: ImdsSimulator, world: World, ec2: Any
) -> None:
    attach_eni(ec2, world, 1)
    await imds.identity()
    sim.faults.delay_s = 5.0
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await imds.interfaces()
    # The autouse `no_leftover_tasks` fixture fails the test if any read is still running.


async def test_ipv6_prefixes_are_read_only_by_a_client_asked_to(
    embedded: EmbeddedEc2, fake_time: FakeTime
) -> None:
    """IPv6 mode's client reads each ENI's /80s; IPv4's never asks for them (one GET per ENI less)."""
    world = embedded.world(seed=17, layout=Layout(ipv6=True))
    answer = world.client().assign_ipv6_addresses(
        NetworkInterfaceId=world.primary_eni_id, Ipv6PrefixCount=1
    )
    v6_calls, v4_calls = CallLog(), CallLog()
    async with ImdsSimulator(world, clock=fake_time.clock, rng=random.Random(3)) as sim:
        async with make_client(sim.base_url, fake_time, v6_calls, ipv6_prefixes=True) as v6:
            (with_prefixes,) = await v6.interfaces()
        async with make_client(sim.base_url, fake_time, v4_calls) as v4:
            (without,) = await v4.interfaces()

    assert with_prefixes.ipv6_prefixes == tuple(answer["AssignedIpv6Prefixes"])
    assert without.ipv6_prefixes == ()
    assert v6_calls.count(OP_GET) == v4_calls.count(OP_GET) + 1
