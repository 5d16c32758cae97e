"""Fixtures for the contract suite: one embedded EC2 (moto + our extension, in-process) for the
package, and a fresh world per test (~30 ms: the EC2 state is wiped and rebuilt).

Package scope, not session: an in-process `mock_aws` left running would keep intercepting botocore for
every later test, and moto does not reset state for a `mock_aws` nested inside a running one."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from botocore.config import Config

from cloud.embedded.world import EmbeddedEc2, World

NO_RETRIES = Config(retries={"mode": "standard", "total_max_attempts": 1})
"""One attempt per call: the test sees exactly what EC2 (or the fault) answered."""


@pytest.fixture(scope="package")
def embedded_ec2() -> Iterator[EmbeddedEc2]:
    with EmbeddedEc2("in-process") as host:
        yield host


@pytest.fixture
def make_world(embedded_ec2: EmbeddedEc2) -> Callable[..., World]:
    """`make_world(instance_type=..., subnet_cidr=...)`; each call wipes the previous world."""
    return embedded_ec2.world


@pytest.fixture
def world(make_world: Callable[..., World]) -> World:
    """An m5.large in a /16 subnet of us-west-2."""
    return make_world()


@pytest.fixture
def ec2(world: World) -> Any:
    """A client on `world` without retries."""
    return world.client(NO_RETRIES)
