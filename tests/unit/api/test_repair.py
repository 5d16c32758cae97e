"""`POST /v1/repair` through the API's own route table and error middleware: a dry run unless
`apply=true`, any other value refused, a runtime that cannot be listed a retryable 503."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from ipamd.api import create_app, serve_unix
from ipamd.runtime.ports import RuntimeUnavailable
from tests.support.node import NodeFixture


class Repairs:
    def __init__(self) -> None:
        self.calls: list[bool] = []
        self.runtime_down = False

    async def __call__(self, apply: bool) -> dict[str, object]:
        if self.runtime_down:
            raise RuntimeUnavailable("CRI ListPodSandbox: connection refused")
        self.calls.append(apply)
        return {"applied": apply, "actions": []}


@pytest.fixture
async def served(
    node: NodeFixture, socket_dir: Path
) -> AsyncIterator[tuple[aiohttp.ClientSession, Repairs]]:
    engine = await node.open()
    repairs = Repairs()
    app = create_app(engine, ready=lambda: True, gc_grace_s=60.0, clock=node.clock, repair=repairs)
    runner: web.AppRunner = await serve_unix(app, socket_dir / "repair.sock")
    try:
        connector = aiohttp.UnixConnector(path=str(socket_dir / "repair.sock"))
        async with aiohttp.ClientSession(connector=connector) as session:
            yield session, repairs
    finally:
        await runner.cleanup()


async def _post(session: aiohttp.ClientSession, path: str) -> tuple[int, dict[str, object]]:
    async with session.post(f"http://ipamd{path}") as answer:
        return answer.status, await answer.json()


async def test_repair_is_a_dry_run_unless_apply_is_true(
    served: tuple[aiohttp.ClientSession, Repairs],
) -> None:
    session, repairs = served
    assert await _post(session, "/v1/repair") == (200, {"applied": False, "actions": []})
    assert (await _post(session, "/v1/repair?apply=false"))[0] == 200
    assert (await _post(session, "/v1/repair?apply=true"))[1]["applied"] is True
    assert repairs.calls == [False, False, True]


@pytest.mark.parametrize("value", ["maybe", "TRUE", "1", ""])
async def test_any_other_apply_value_is_refused_and_repairs_nothing(
    served: tuple[aiohttp.ClientSession, Repairs], value: str
) -> None:
    session, repairs = served
    status, body = await _post(session, f"/v1/repair?apply={value}")
    assert status == 400 and body["code"] == "bad_request", body
    assert "apply" in str(body["message"])
    assert repairs.calls == []


async def test_an_unreachable_runtime_is_a_retryable_503_from_the_middleware(
    served: tuple[aiohttp.ClientSession, Repairs],
) -> None:
    session, repairs = served
    repairs.runtime_down = True
    status, body = await _post(session, "/v1/repair?apply=true")
    assert status == 503
    assert body["code"] == "runtime_unavailable" and body["retryable"] is True
    assert "connection refused" in str(body["message"])
