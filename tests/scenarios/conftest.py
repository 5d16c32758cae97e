"""The embedded EC2 (moto with ipamd's extension) the scenario modules run on, started once per
module; each test builds a fresh world on it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cloud.embedded.world import EmbeddedEc2


@pytest.fixture(scope="module")
def embedded() -> Iterator[EmbeddedEc2]:
    with EmbeddedEc2() as host:
        yield host
