"""The metrics endpoint on `IPAMD_METRICS_ADDR` (TCP, Prometheus text), the middleware that records the
local API's ADD and DEL requests, and `serve_tcp`, which the metrics and introspection endpoints both
listen with. What is published lives in `ipamd.telemetry.metrics`; this module never imports
prometheus_client.

A listen address that cannot be bound (a port in use, an address not on the host) is `ListenFailed`,
an error `main` reports in one line; no OSError leaves this module.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from ipamd.config.kinds import HostPort
from ipamd.telemetry.metrics import CONTENT_TYPE, Recorders, Sources, build_registry, exposition
from ipamd.wire import PATH_ALLOCATIONS

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ListenFailed(Exception):
    """A TCP endpoint could not listen on its address."""

    def __init__(self, setting: str, addr: HostPort, reason: str) -> None:
        self.setting = setting
        self.addr = addr
        super().__init__(f"cannot listen on {addr} ({setting}): {reason}")


def latency_middleware(recorders: Recorders) -> Middleware:
    """Every ADD and DEL the API answers: counted, timed, and an ADD refused for want of an address
    noted. It must sit inside the API's error middleware, to see the domain error raised."""

    @web.middleware
    async def timed(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        error: BaseException | None = None
        try:
            return await handler(request)
        except BaseException as exc:
            error = exc
            raise
        finally:
            elapsed = time.perf_counter() - started
            if request.path.startswith(PATH_ALLOCATIONS):
                if request.method == "POST":
                    recorders.add_done(elapsed, error)
                elif request.method == "DELETE":
                    recorders.del_done(elapsed)

    return timed


async def serve_tcp(app: web.Application, addr: HostPort, setting: str) -> web.AppRunner:
    """Serve `app` on `addr`; raises `ListenFailed` (naming `setting`) if it cannot listen."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, addr.host, addr.port).start()
    except OSError as err:
        await runner.cleanup()
        # asyncio's own message repeats the address; the errno's text is the news.
        reason = os.strerror(err.errno) if err.errno else str(err)
        raise ListenFailed(setting, addr, reason) from err
    return runner


async def serve_metrics(recorders: Recorders, sources: Sources, addr: HostPort) -> web.AppRunner:
    registry = build_registry(recorders, sources)

    async def metrics(_: web.Request) -> web.Response:
        # Collected here, on the event loop, not in a thread: the snapshot is then one moment.
        return web.Response(body=exposition(registry), headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return await serve_tcp(app, addr, "IPAMD_METRICS_ADDR")
