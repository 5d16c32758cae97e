"""Fixtures for the IMDS client and simulator: the embedded EC2 started once per test module (only one
in-process moto host may run at a time), a fresh world per test, one fake monotonic clock shared by the
simulator and the client (tokens expire and lags elapse without sleeping; backoff advances it), and a
simulator and a client that are always closed."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import pytest

from cloud.calls import CallLog
from cloud.embedded.imds_sim import ImdsSimulator
from cloud.embedded.world import EmbeddedEc2, World
from cloud.imds import Imdsv2Client
from cloud.ratelimit import RetryPolicy


class FakeTime:
    """A monotonic clock that moves only when advanced or slept on."""

    def __init__(self) -> None:
        self.now = 5000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


@pytest.fixture(scope="module")
def embedded() -> Iterator[EmbeddedEc2]:
    with EmbeddedEc2() as host:
        yield host


@pytest.fixture
def world(embedded: EmbeddedEc2) -> World:
    return embedded.world(seed=17)


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


@pytest.fixture
async def sim(world: World, fake_time: FakeTime) -> AsyncIterator[ImdsSimulator]:
    async with ImdsSimulator(world, clock=fake_time.clock, rng=random.Random(3)) as simulator:
        yield simulator


@pytest.fixture
def calls() -> CallLog:
    return CallLog()


def make_client(base_url: str, fake_time: FakeTime, calls: CallLog, **options: Any) -> Imdsv2Client:
    """A client on the fake clock: backoff sleeps advance it and never wait."""
    settings: dict[str, Any] = {
        "retry": RetryPolicy(max_attempts=3, base_s=0.05, cap_s=0.5),
        "request_timeout_s": 2.0,
        "recorder": calls,
        "clock": fake_time.clock,
        "sleep": fake_time.sleep,
        "rng": random.Random(5),
    }
    settings.update(options)
    return Imdsv2Client(base_url, **settings)


@pytest.fixture
async def imds(
    sim: ImdsSimulator, fake_time: FakeTime, calls: CallLog
) -> AsyncIterator[Imdsv2Client]:
    async with make_client(sim.base_url, fake_time, calls) as client:
        yield client


@pytest.fixture
def ec2(world: World) -> Any:
    """A boto3 EC2 client on the world (what changes EC2 in these tests)."""
    return world.client()


def assign_ips(ec2: Any, eni_id: str, count: int) -> list[str]:
    """Assign `count` secondary addresses; returns the new ones."""
    answer = ec2.assign_private_ip_addresses(
        NetworkInterfaceId=eni_id, SecondaryPrivateIpAddressCount=count
    )
    return [a["PrivateIpAddress"] for a in answer["AssignedPrivateIpAddresses"]]


def assign_prefixes(ec2: Any, eni_id: str, count: int) -> list[str]:
    answer = ec2.assign_private_ip_addresses(NetworkInterfaceId=eni_id, Ipv4PrefixCount=count)
    return [p["Ipv4Prefix"] for p in answer["AssignedIpv4Prefixes"]]


def unassign(ec2: Any, eni_id: str, ips: Sequence[str] = (), prefixes: Sequence[str] = ()) -> None:
    params: dict[str, Any] = {"NetworkInterfaceId": eni_id}
    if ips:
        params["PrivateIpAddresses"] = list(ips)
    if prefixes:
        params["Ipv4Prefixes"] = list(prefixes)
    ec2.unassign_private_ip_addresses(**params)


def attach_eni(ec2: Any, world: World, device_index: int) -> str:
    made = ec2.create_network_interface(SubnetId=world.subnet_id)["NetworkInterface"]
    eni_id: str = made["NetworkInterfaceId"]
    ec2.attach_network_interface(
        NetworkInterfaceId=eni_id, InstanceId=world.instance_id, DeviceIndex=device_index
    )
    return eni_id


def ec2_enis(ec2: Any, world: World) -> dict[str, tuple[str, frozenset[str], frozenset[str]]]:
    """EC2's view: ENI ID -> (primary address, every address, prefixes)."""
    raw = ec2.describe_network_interfaces(
        Filters=[{"Name": "attachment.instance-id", "Values": [world.instance_id]}]
    )["NetworkInterfaces"]
    return {
        eni["NetworkInterfaceId"]: (
            eni["PrivateIpAddress"],
            frozenset(a["PrivateIpAddress"] for a in eni["PrivateIpAddresses"]),
            frozenset(p["Ipv4Prefix"] for p in eni.get("Ipv4Prefixes", [])),
        )
        for eni in raw
    }
