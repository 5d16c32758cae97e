"""Reading what a client sent, before any handler looks at it: media type, size, query parameters.

A body is read with its own limit per route (ADD's is small, GC's names every attachment of the node),
refused by its declared length before a byte is read, and by its actual length for a chunked upload.
The whole body must arrive within `BODY_TIMEOUT_S`: a client that opens a request and never finishes
it would otherwise hold a connection (and a handler) for ever.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from aiohttp import web

from ipamd.api.errors import PayloadTooLarge, RequestTimeout, UnsupportedMediaType
from ipamd.errors import BadRequest
from ipamd.wire import parse_object

BODY_TIMEOUT_S = 10.0
"""The plugin sends its whole body at once; ten seconds is generous for any client on the node."""


async def read_json(
    request: web.Request, limit: int, timeout_s: float | None = None
) -> dict[str, object]:
    """The body as a JSON object. Raises `UnsupportedMediaType`, `PayloadTooLarge`,
    `RequestTimeout` or `WireError`."""
    if request.content_type != "application/json":
        raise UnsupportedMediaType(
            f"Content-Type must be application/json, not {request.content_type}"
        )
    charset = request.charset
    if charset is not None and charset.lower() not in {"utf-8", "utf8"}:
        raise UnsupportedMediaType(f"JSON bodies are UTF-8, not {charset}")
    declared = request.content_length
    if declared is not None and declared > limit:
        raise PayloadTooLarge(f"body of {declared} bytes exceeds the limit of {limit}")
    timeout_s = BODY_TIMEOUT_S if timeout_s is None else timeout_s
    try:
        async with asyncio.timeout(timeout_s):
            body = await _read_body(request, limit)
    except TimeoutError:
        raise RequestTimeout(f"the request body did not arrive within {timeout_s:g} s") from None
    return parse_object(body)


async def _read_body(request: web.Request, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.readany():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def query(
    request: web.Request, required: tuple[str, ...] = (), optional: tuple[str, ...] = ()
) -> Mapping[str, str]:
    """The query parameters, each at most once, none unknown."""
    params = request.query
    unknown = sorted(set(params) - set(required) - set(optional))
    if unknown:
        raise BadRequest(f"unknown query parameter(s) {', '.join(map(repr, unknown))}")
    for name in set(params):
        if len(params.getall(name)) > 1:
            raise BadRequest(f"query parameter {name!r} is given more than once")
    missing = [name for name in required if name not in params]
    if missing:
        raise BadRequest(f"missing query parameter(s) {', '.join(map(repr, missing))}")
    return {name: params[name] for name in params}
