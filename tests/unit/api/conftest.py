"""The API served on a real unix socket over an engine on a real state file, and a client for it."""

from __future__ import annotations

import io
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from ipamd.api import create_app, serve_unix
from ipamd.api.views import PodRoutes
from ipamd.engine.engine import Engine
from tests.support.node import NodeFixture

GC_GRACE_S = 60.0
NETWORK = "k8s-pod-network"


@dataclass
class ReadyFlag:
    value: bool = False

    def __call__(self) -> bool:
        return self.value


@dataclass
class Answer:
    status: int
    body: dict[str, Any]
    """Decoded JSON: its shape is what the tests assert."""
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Api:
    session: aiohttp.ClientSession
    socket_path: Path
    engine: Engine
    node: NodeFixture
    ready: ReadyFlag
    runner: web.AppRunner

    async def call(
        self,
        method: str,
        path: str,
        *,
        json: object = None,
        data: bytes | io.BytesIO | None = None,
        headers: dict[str, str] | None = None,
    ) -> Answer:
        async with self.session.request(
            method, f"http://ipamd{path}", json=json, data=data, headers=headers
        ) as response:
            body = await response.json(content_type=None) if method != "HEAD" else {}
            assert isinstance(body, dict), body
            return Answer(response.status, body, dict(response.headers))

    async def add(self, container_id: str, ifname: str = "eth0", **extra: object) -> Answer:
        body: dict[str, object] = {
            "container_id": container_id,
            "ifname": ifname,
            "network": NETWORK,
            **extra,
        }
        return await self.call("POST", "/v1/allocations", json=body)

    async def delete(self, container_id: str, ifname: str = "eth0") -> Answer:
        return await self.call(
            "DELETE", f"/v1/allocations/{container_id}/{ifname}?network={NETWORK}"
        )


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A short directory: a unix socket path must fit in 107 bytes, pytest's tmp_path may not."""
    path = Path(tempfile.mkdtemp(prefix="ipamd-api-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def damaged() -> bool:
    """Whether `api` serves an engine on a state file that cannot be trusted (it refuses every
    change): a test that needs one parametrizes this fixture."""
    return False


@pytest.fixture
def pod_routes() -> PodRoutes:
    """How `api` answers pods' routes: an IPv4 node's unless a test overrides this fixture."""
    return PodRoutes()


@pytest.fixture
async def api(
    node: NodeFixture, socket_dir: Path, damaged: bool, pod_routes: PodRoutes
) -> AsyncIterator[Api]:
    engine = await (node.open_damaged() if damaged else node.open())
    ready = ReadyFlag()
    app = create_app(
        engine, ready=ready, gc_grace_s=GC_GRACE_S, clock=node.clock, pod_routes=pod_routes
    )
    socket_path = socket_dir / "run" / "ipamd.sock"
    runner = await serve_unix(app, socket_path)
    try:
        connector = aiohttp.UnixConnector(path=str(socket_path))
        async with aiohttp.ClientSession(connector=connector) as session:
            yield Api(session, socket_path, engine, node, ready, runner)
    finally:
        await runner.cleanup()
