"""The metrics endpoint on `IPAMD_METRICS_ADDR` (TCP, Prometheus text) and the ADD/DEL latency
middleware for the local API. Rendering lives in `ipamd.metrics`."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from ipamd.config_kinds import HostPort
from ipamd.metrics import Recorders, Sources, render

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def latency_middleware(recorders: Recorders) -> Middleware:
    @web.middleware
    async def timed(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        try:
            return await handler(request)
        finally:
            elapsed = time.perf_counter() - started
            if request.path.startswith("/v1/allocations"):
                if request.method == "POST":
                    recorders.add_latency.observe(elapsed)
                elif request.method == "DELETE":
                    recorders.del_latency.observe(elapsed)

    return timed


async def serve_metrics(recorders: Recorders, sources: Sources, addr: HostPort) -> web.AppRunner:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=render(recorders, sources), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, addr.host, addr.port).start()
    return runner
