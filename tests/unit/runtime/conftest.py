"""Fixtures for the CRI adapter: a fake CRI runtime on a real unix socket and a client of it with a short
deadline, both closed by the test's end."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from ipamd.runtime.cri import GrpcCriRuntime
from tests.support.cri_server import FakeCriServer

TIMEOUT_S = 0.3
"""The client's deadline in these tests: long for a unix socket, short for the suite."""


@pytest.fixture
async def fake_cri() -> AsyncIterator[FakeCriServer]:
    async with FakeCriServer(runtime_name="fakecri", runtime_version="1.2.3") as server:
        yield server


@pytest.fixture
async def runtime(fake_cri: FakeCriServer) -> AsyncIterator[GrpcCriRuntime]:
    async with GrpcCriRuntime(fake_cri.endpoint, timeout_s=TIMEOUT_S) as client:
        yield client
