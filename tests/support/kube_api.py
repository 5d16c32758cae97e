"""The test API server as tests reach it: `KubeApiServer` and `RecordedRequest` (from `bench.kube_api`,
which says what the server serves and its knobs, and where benches reach it too) and its fixtures,
`kube_api` (plain HTTP, in the test's loop), `kube_api_tls` (HTTPS when `cryptography` is
installed, else skipped) and `kube_api_thread` (on its own thread, for a daemon started as a
process). A conftest imports the fixtures its tests use."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from bench.kube_api.recorded import RecordedRequest
from bench.kube_api.server import KubeApiServer
from bench.kube_api.tls import tls_available

__all__ = ["KubeApiServer", "RecordedRequest", "kube_api", "kube_api_thread", "kube_api_tls"]


@pytest.fixture
async def kube_api(tmp_path: Path) -> AsyncIterator[KubeApiServer]:
    async with KubeApiServer(tmp_path / "kube-api") as server:
        yield server


@pytest.fixture
async def kube_api_tls(tmp_path: Path) -> AsyncIterator[KubeApiServer]:
    if not tls_available():
        pytest.skip("cryptography is not installed: no TLS for the test API server")
    async with KubeApiServer(tmp_path / "kube-api", tls=True) as server:
        yield server


@pytest.fixture
def kube_api_thread(tmp_path: Path) -> Iterator[KubeApiServer]:
    with KubeApiServer(tmp_path / "kube-api") as server:
        yield server
