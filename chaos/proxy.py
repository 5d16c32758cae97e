"""`Ec2FaultProxy`: an HTTP proxy between the daemon and moto that answers the way a troubled EC2 does.

It owns the fault mode of EC2 as the daemon sees it, switched by the chaos runner at any moment:

- `pass`: every request is forwarded to moto and its answer returned unchanged;
- `throttle`: EC2's throttling answer, HTTP 503 with `RequestLimitExceeded` in EC2's XML error format
  (botocore raises it as a `ClientError` with that code, which `cloud.ec2` maps to `Throttled`);
- `internal`: HTTP 500 `InternalError` (EC2 failed while handling the request);
- `timeout`: the request is forwarded (so EC2 may well act on it) but the answer is held for `hold_s`,
  longer than the daemon's deadline on an EC2 call: the outcome is unknown to the daemon, the hardest
  case for it.

It must not change a request or an answer in `pass` mode, and does not read or change moto's state.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from typing import Final, Literal

import aiohttp
from aiohttp import web

Mode = Literal["pass", "throttle", "internal", "timeout"]

_HOP_BY_HOP: Final = frozenset(
    {
        "host",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "content-length",
        "content-encoding",
        "te",
        "upgrade",
    }
)
_ERRORS: Final[dict[str, tuple[int, str, str]]] = {
    "throttle": (503, "RequestLimitExceeded", "Request limit exceeded."),
    "internal": (500, "InternalError", "An internal error has occurred."),
}


def ec2_error_body(code: str, message: str) -> str:
    """An EC2 (query protocol) error answer, as botocore's ec2 parser reads it."""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error>"
        f"</Errors><RequestID>{uuid.uuid4()}</RequestID></Response>"
    )


class Ec2FaultProxy:
    """Serves on 127.0.0.1 and a free port, in the current event loop, forwarding to `upstream`."""

    def __init__(self, upstream: str, *, hold_s: float = 3.0) -> None:
        self.upstream = upstream.rstrip("/")
        self.mode: Mode = "pass"
        self.hold_s = hold_s
        self.url = ""
        self.forwarded = 0
        """Requests forwarded to moto, in any mode."""
        self.faulted: Counter[str] = Counter()
        """Requests answered with a fault, by mode."""
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> str:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # handler_cancellation: a held answer is dropped when the daemon's client gives up.
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        self._runner = runner
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        host, port = runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self.url

    async def close(self) -> None:
        runner, self._runner = self._runner, None
        session, self._session = self._session, None
        if runner is not None:
            await runner.cleanup()
        if session is not None:
            await session.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        mode = self.mode
        body = await request.read()
        if mode in _ERRORS:
            status, code, message = _ERRORS[mode]
            self.faulted[mode] += 1
            return web.Response(
                status=status, text=ec2_error_body(code, message), content_type="text/xml"
            )
        answer = await self._forward(request, body)
        if mode == "timeout":
            self.faulted[mode] += 1
            await asyncio.sleep(self.hold_s)
        return answer

    async def _forward(self, request: web.Request, body: bytes) -> web.Response:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        url = self.upstream + request.path_qs
        self.forwarded += 1
        async with self._session.request(
            request.method, url, data=body, headers=headers
        ) as upstream:
            payload = await upstream.read()
            kept = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP}
            return web.Response(status=upstream.status, body=payload, headers=kept)
