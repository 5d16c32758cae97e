"""Shared fixtures: an injected clock, a real state file on disk, engines that are always closed, and a
guard that fails any test leaving asyncio tasks behind.

Every hypothesis test and state machine runs on one seed per session, printed in the session's
header and again under each falsified test with the command that replays it exactly:
`--hypothesis-seed=N` (or IPAMD_HYPOTHESIS_SEED=N) if given; 0 under CI (CI set), so CI is
deterministic; otherwise a fresh one, so local runs keep exploring. Failures also print hypothesis's
`@reproduce_failure` blob (for a state machine it decorates the machine's class).
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import AsyncIterator, Generator
from pathlib import Path

import pytest
from hypothesis import settings

from datastore.store import STATE_FILE_NAME
from ipamd.clock import FakeClock
from ipamd.engine.allocator import EngineParams
from tests.support.families import FAMILIES, Family
from tests.support.node import NodeFixture

# The profile hypothesis picked (its `ci` one under CI: no database, no deadline), with the blob of
# every failure printed, and not derandomized, so that the session's seed decides every draw.
settings.register_profile(
    "ipamd",
    settings.get_profile(settings.get_current_profile_name()),
    print_blob=True,
    derandomize=False,
)
settings.load_profile("ipamd")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Fix the session's seed before hypothesis's own plugin reads `--hypothesis-seed`."""
    if config.getoption("hypothesis_seed", None) is None:
        seed = os.environ.get("IPAMD_HYPOTHESIS_SEED") or (
            "0" if os.environ.get("CI") else str(random.SystemRandom().randrange(2**32))
        )
        config.option.hypothesis_seed = seed


def _seed(config: pytest.Config) -> str:
    return str(config.getoption("hypothesis_seed"))


def pytest_report_header(config: pytest.Config) -> str:
    return f"hypothesis seed: {_seed(config)} (replay with --hypothesis-seed={_seed(config)})"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    text = report.longreprtext if report.failed else ""
    if any(
        mark in text for mark in ("Failing test case", "Falsifying example", "@reproduce_failure")
    ):
        report.sections.append(
            (
                "hypothesis: replay this failure exactly",
                f"pytest '{item.nodeid}' --hypothesis-seed={_seed(item.config)}\n"
                "(or with the @reproduce_failure above: on the test, or on a state machine's class)",
            )
        )
    return report


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def state_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / STATE_FILE_NAME


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
    fixture = NodeFixture(state_path, clock, EngineParams())
    yield fixture
    await fixture.close()


@pytest.fixture(params=FAMILIES, ids=[f.name for f in FAMILIES])
def family(request: pytest.FixtureRequest) -> Family:
    """Each address family in turn, for a test of behaviour both share (`tests/support/families.py`)."""
    chosen: Family = request.param
    return chosen
