"""The test API server's own tests: its fixtures, and a reader of watch streams."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from tests.support.kube_api import kube_api, kube_api_thread, kube_api_tls

__all__ = ["kube_api", "kube_api_thread", "kube_api_tls", "read_events", "read_to_end"]


async def read_events(
    response: aiohttp.ClientResponse, count: int, timeout_s: float = 5.0
) -> list[Any]:
    """The next `count` events of a watch stream."""
    events: list[Any] = []
    async with asyncio.timeout(timeout_s):
        while len(events) < count:
            line = await response.content.readline()
            assert line, f"the stream ended after {events}"
            events.append(json.loads(line))
    return events


async def read_to_end(response: aiohttp.ClientResponse, timeout_s: float = 5.0) -> list[Any]:
    """Every event left until the server ends the stream."""
    async with asyncio.timeout(timeout_s):
        return [json.loads(line) async for line in response.content]
