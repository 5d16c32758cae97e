"""Fixtures for the cloud adapter: the embedded EC2 (moto with our extension) started once for the
package and a fresh world per test, a fake monotonic clock whose sleep advances it, and clients of the
production configuration (`client_config`: botocore's retries off)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from cloud.calls import CallLog
from cloud.ec2 import Boto3Ec2, client_config, make_client
from cloud.embedded.world import EmbeddedEc2
from cloud.ratelimit import RetryPolicy
from tests.unit.cloud.hooks import Scripts

REGION = "us-west-2"


class FakeTime:
    """A monotonic clock that moves only when something sleeps on it."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


@dataclass(frozen=True)
class World:
    """A fresh embedded EC2 world (`cloud.embedded.world`) and a client of the production
    configuration on it."""

    client: Any
    vpc_id: str
    subnet_id: str
    subnet_cidr: str
    instance_id: str
    instance_type: str
    primary_eni_id: str
    security_group_id: str


@pytest.fixture(scope="package")
def embedded() -> Iterator[EmbeddedEc2]:
    """moto with our extension, started once for the package; each world resets it (~50 ms)."""
    with EmbeddedEc2() as host:
        yield host


class Worlds:
    def __init__(self, host: EmbeddedEc2) -> None:
        self._host = host

    def __call__(self, instance_type: str = "m5.large", subnet_cidr: str = "10.0.1.0/24") -> World:
        """A new world (the previous one is wiped)."""
        built = self._host.world(instance_type, REGION, subnet_cidr, seed=11)
        return World(
            client=built.client(config=client_config(timeout_s=5.0)),
            vpc_id=built.vpc_id,
            subnet_id=built.subnet_id,
            subnet_cidr=built.subnet_cidr,
            instance_id=built.instance_id,
            instance_type=built.instance_type,
            primary_eni_id=built.primary_eni_id,
            security_group_id=built.security_group_id,
        )


@pytest.fixture
def worlds(embedded: EmbeddedEc2) -> Worlds:
    return Worlds(embedded)


@pytest.fixture
def world(worlds: Worlds) -> World:
    return worlds()


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


@pytest.fixture
def calls() -> CallLog:
    return CallLog()


@pytest.fixture
def ec2(world: World, calls: CallLog, fake_time: FakeTime) -> Boto3Ec2:
    return adapter(world.client, calls, fake_time)


def adapter(
    client: Any,
    calls: CallLog,
    fake_time: FakeTime,
    *,
    max_attempts: int = 5,
    call_timeout_s: float = 5.0,
    seed: int = 7,
) -> Boto3Ec2:
    """The adapter on a fake clock: backoff and rate-limit waits advance `fake_time`, never sleep."""
    return Boto3Ec2(
        client,
        recorder=calls,
        call_timeout_s=call_timeout_s,
        retry=RetryPolicy(max_attempts=max_attempts),
        clock=fake_time.clock,
        sleep=fake_time.sleep,
        rng=random.Random(seed),
    )


@pytest.fixture(scope="module")
def offline_client() -> Iterator[Any]:
    """A production-configured client with fake credentials, shared by a module (building a client
    costs ~0.5 s); tests answer it with a Stubber or `scripts`, so nothing leaves the process."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ACCESS_KEY_ID", "testing")
        env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        env.delenv("AWS_SESSION_TOKEN", raising=False)
        env.delenv("AWS_PROFILE", raising=False)
        yield make_client(REGION, endpoint_url="https://ec2.invalid")


@pytest.fixture
def scripts() -> Iterator[Scripts]:
    made = Scripts()
    yield made
    made.remove_all()
