"""The metrics endpoint on `IPAMD_METRICS_ADDR` (TCP, Prometheus text), the middleware that records the
local API's ADD and DEL requests, and `serve_tcp`, which the metrics and introspection endpoints both
listen with. What is published lives in `ipamd.telemetry.metrics`; this module never imports
prometheus_client.

A listen address that cannot be bound (a port in use, an address not on the host) is `ListenFailed`,
an error `main` reports in one line; no OSError leaves this module. Asked to (`or_free_port`, for an
address nobody set: a second `ipamd run --embedded` on one machine), a port in use is not an error:
the endpoint listens on a free port of the same host instead, and says so in the log.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from ipamd.config.kinds import HostPort
from ipamd.telemetry.metrics import CONTENT_TYPE, Recorders, Sources, build_registry, exposition
from ipamd.wire import PATH_ALLOCATIONS

logger = logging.getLogger(__name__)

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


async def serve_tcp(
    app: web.Application, addr: HostPort, setting: str, *, or_free_port: bool = False
) -> web.AppRunner:
    """Serve `app` on `addr`; raises `ListenFailed` (naming `setting`) if it cannot listen. With
    `or_free_port`, a port in use makes it listen on a free port of the same host instead
    (`listening_on` says which)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        try:
            await web.TCPSite(runner, addr.host, addr.port).start()
        except OSError as err:
            if not (or_free_port and err.errno == errno.EADDRINUSE):
                raise
            await web.TCPSite(runner, addr.host, 0).start()
            logger.warning(
                "telemetry.port_taken %s=%s is in use: listening on %s instead (set %s to choose)",
                setting,
                addr,
                listening_on(runner),
                setting,
            )
    except OSError as err:
        await runner.cleanup()
        # asyncio's own message repeats the address; the errno's text is the news.
        reason = os.strerror(err.errno) if err.errno else str(err)
        raise ListenFailed(setting, addr, reason) from err
    return runner


def listening_on(runner: web.AppRunner) -> HostPort:
    """The address a runner `serve_tcp` started listens on (its port, once a free one was taken)."""
    host, port = runner.addresses[0][:2]
    return HostPort(str(host), int(port))


async def serve_metrics(
    recorders: Recorders, sources: Sources, addr: HostPort, *, or_free_port: bool = False
) -> web.AppRunner:
    registry = build_registry(recorders, sources)

    async def metrics(_: web.Request) -> web.Response:
        # Collected here, on the event loop, not in a thread: the snapshot is then one moment.
        return web.Response(body=exposition(registry), headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return await serve_tcp(app, addr, "IPAMD_METRICS_ADDR", or_free_port=or_free_port)
