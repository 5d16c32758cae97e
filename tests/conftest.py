"""Shared fixtures: an injected clock, a real state file on disk, engines that are always closed, and a
guard that fails any test leaving asyncio tasks behind."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ipamd.clock import FakeClock
from ipamd.engine.allocator import EngineSettings
from tests.support.node import NodeFixture


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def state_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "ipamd.db"


@pytest.fixture(autouse=True)
async def no_leftover_tasks() -> AsyncIterator[None]:
    yield
    current = asyncio.current_task()
    left = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    for task in left:
        task.cancel()
    assert left == [], f"test left tasks running: {left}"


@pytest.fixture
async def node(state_path: Path, clock: FakeClock) -> AsyncIterator[NodeFixture]:
    """A node with a real state file, a faulty-capable store and the invariant check at hand."""
    fixture = NodeFixture(state_path, clock, EngineSettings())
    yield fixture
    await fixture.close()
