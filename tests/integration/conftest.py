"""What the integration tests share: the daemons a test starts, each killed at its end if the test
left it running."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.embedded_daemon import EmbeddedDaemon


@pytest.fixture
def started() -> Iterator[list[EmbeddedDaemon]]:
    """Every daemon a test starts (append it), killed at the end if the test left it running."""
    daemons: list[EmbeddedDaemon] = []
    yield daemons
    for daemon in daemons:
        daemon.ensure_gone()
