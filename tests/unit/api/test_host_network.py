"""Whether the pool and ENI views report a datapath per ENI is what the API is told where it is built
(`create_app(host_network=...)`), whatever serves its ADDs and DELs."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from datastore.records import AllocationKey, AllocationRecord
from ipamd.api import create_app, serve_unix
from ipamd.engine.engine import Engine
from ipamd.model import PodRef
from tests.support.node import NodeFixture


class Wrapped:
    """ADD and DEL on the engine, through an object of another type (as aws-node's checkpoint
    keeper wraps them): the type says nothing of the host's network."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def add(self, key: AllocationKey, pod: PodRef | None) -> AllocationRecord:
        return await self.engine.assign(key, pod)

    async def release(self, key: AllocationKey) -> tuple[AllocationRecord, ...]:
        return await self.engine.release(key)


@pytest.mark.parametrize(
    ("host_network", "wrapped", "datapath"),
    [(True, False, "ready"), (False, False, "off"), (True, True, "ready"), (False, True, "off")],
)
async def test_the_views_say_what_the_app_was_told_of_the_host_network(
    node: NodeFixture, socket_dir: Path, host_network: bool, wrapped: bool, datapath: str
) -> None:
    engine = await node.open()
    await node.seed(enis=2, per_eni=2)
    pods = Wrapped(engine) if wrapped else None
    app = create_app(
        engine,
        ready=lambda: True,
        gc_grace_s=60.0,
        clock=node.clock,
        pods=pods,
        host_network=host_network,
    )
    socket_path = socket_dir / "host.sock"
    runner = await serve_unix(app, socket_path)
    try:
        connector = aiohttp.UnixConnector(path=str(socket_path))
        async with aiohttp.ClientSession(connector=connector) as session:
            async with session.get("http://ipamd/v1/enis") as answer:
                enis = (await answer.json())["enis"]
            async with session.get("http://ipamd/v1/pool") as answer:
                pool = (await answer.json())["enis"]
    finally:
        await runner.cleanup()
    assert len(enis) == len(pool) == 2
    assert {e["datapath"] for e in enis} == {e["datapath"] for e in pool} == {datapath}
