"""The test API server's REST surface (`bench.kube_api.server` owns the server, its knobs and its
middleware; `paths` says where a request goes and words the refusals; this module answers a request
that got through them): verbs, lists, watches and patches, as the real API server serves them.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from bench.kube_api.kinds import (
    ENICONFIGS,
    FieldSelector,
    Kind,
    LabelSelector,
    Obj,
    Scope,
    SelectorError,
)
from bench.kube_api.patch import (
    JSON_PATCH,
    MERGE_PATCH,
    PATCH_TYPES,
    STRATEGIC_MERGE_PATCH,
    PatchError,
    json_patch,
    merge_patch,
    strategic_merge_patch,
)
from bench.kube_api.paths import (
    PUBLIC_PATHS,
    Target,
    discovery,
    not_found,
    parse_target,
    status_body,
    status_response,
)
from bench.kube_api.schemas import Invalid, Schemas
from bench.kube_api.store import BulkAdded, Change, Store, StoreError, Watcher, watch_events


class KubeApiServer(Protocol):
    """What the REST surface reads of the server (`bench.kube_api.server.KubeApiServer`)."""

    @property
    def store(self) -> Store: ...

    @property
    def schemas(self) -> Schemas: ...

    @property
    def default_watch_timeout_s(self) -> float | None: ...

    @property
    def bookmark_interval_s(self) -> float | None: ...


LIST_CHUNK = 500


class End:
    """Told to a watch: finish the stream cleanly (a server-side timeout, the server closing)."""


class Drop:
    """Told to a watch: cut its connection mid-stream, as a proxy or a node reboot does."""


@dataclass(frozen=True, slots=True)
class Bookmark:
    rv: int


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


async def handle(server: KubeApiServer, request: web.Request) -> web.StreamResponse:
    path = request.path
    if path == "/version":
        return web.json_response({"major": "1", "minor": "37", "gitVersion": "v1.37.0-ipamd-test"})
    if path in PUBLIC_PATHS:
        return web.Response(text="ok")
    target = parse_target(path)
    if target is None:
        found = discovery(path) if request.method == "GET" else None
        return web.json_response(found) if found is not None else not_found(path)
    handlers = {
        ("GET", True): _get,
        ("GET", False): _collection,
        ("POST", False): _create,
        ("PATCH", True): _patch,
        ("PUT", True): _replace,
        ("DELETE", True): _delete,
    }
    handler = handlers.get((request.method, bool(target.name)))
    if handler is None:
        return status_response(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    try:
        return await handler(server, request, target)
    except StoreError as err:
        return status_response(
            err.status,
            err.reason,
            err.message,
            details={"name": target.name, "kind": target.kind.plural},
        )
    except Invalid as err:
        details = {"name": err.name, "kind": err.kind, "causes": [c.as_json() for c in err.causes]}
        return status_response(422, "Invalid", str(err), details=details)
    except PatchError as err:
        reason = "BadRequest" if err.status == 400 else "Invalid"
        return status_response(err.status, reason, err.message)
    except SelectorError as err:
        return status_response(400, "BadRequest", str(err))


async def _body(request: web.Request) -> Any:
    try:
        return json.loads(await request.read())
    except ValueError as err:
        raise PatchError(400, f"the body of the request could not be decoded: {err}") from None


def _key(target: Target) -> tuple[str, str]:
    return (target.namespace, target.name)


def _number(request: web.Request, name: str) -> float | None:
    text = request.query.get(name, "")
    try:
        return float(text) if text else None
    except ValueError:
        raise PatchError(400, f"invalid {name}: {text!r}") from None


async def _get(server: KubeApiServer, request: web.Request, target: Target) -> web.StreamResponse:
    if request.query.get("watch", "") in ("1", "true"):  # the older watch of one object by path
        fields = FieldSelector((("metadata.name", target.name, True),))
        return await _watch(server, request, Scope(target.kind, target.namespace, fields))
    obj = server.store.get(target.kind, _key(target))
    if obj is None:
        raise StoreError(404, "NotFound", f'{target.kind.plural} "{target.name}" not found')
    return web.json_response(obj)


async def _create(
    server: KubeApiServer, request: web.Request, target: Target
) -> web.StreamResponse:
    obj = await _body(request)
    if not isinstance(obj, dict):
        raise PatchError(400, "the body of the request must be an object")
    meta = dict(obj.get("metadata") or {})
    if target.kind.namespaced:
        if meta.get("namespace", target.namespace) != target.namespace:
            raise PatchError(
                400,
                "the namespace of the provided object does not match the namespace sent on the request",
            )
        meta["namespace"] = target.namespace
    if (obj.get("apiVersion"), obj.get("kind")) != (target.kind.api_version, target.kind.kind):
        raise PatchError(
            400, f"the API version or kind in the request body does not match {target.kind.plural}"
        )
    stored = server.store.create(target.kind, dict(obj, metadata=meta))
    return web.json_response(stored, status=201)


def _apply_patch(
    server: KubeApiServer, target: Target, content_type: str, patch: Any, current: Obj
) -> Obj:
    if content_type == JSON_PATCH:
        patched = json_patch(current, patch)
    elif content_type == MERGE_PATCH:
        patched = merge_patch(current, patch)
    else:
        patched = strategic_merge_patch(
            current, patch, server.schemas.cursor(target.kind.api_version, target.kind.kind)
        )
    if not isinstance(patched, dict):
        raise PatchError(422, "the patched object is not an object")
    return _with_status(target, patched, current)


def _with_status(target: Target, new: Obj, current: Obj) -> Obj:
    """The main resource keeps the current status, the status subresource takes only the status
    (pods and nodes, as their strategies' PrepareForUpdate do)."""
    if target.subresource == "status":
        new = dict(current, status=new.get("status"))
    elif target.kind.status_subresource:
        new = dict(new, status=current.get("status"))
    if new.get("status") is None:
        new.pop("status", None)
    return new


async def _patch(server: KubeApiServer, request: web.Request, target: Target) -> web.StreamResponse:
    content_type = request.content_type
    if content_type not in PATCH_TYPES or (
        target.kind == ENICONFIGS and content_type == STRATEGIC_MERGE_PATCH
    ):
        accepted = ", ".join(
            PATCH_TYPES if target.kind != ENICONFIGS else (JSON_PATCH, MERGE_PATCH)
        )
        return status_response(
            415,
            "UnsupportedMediaType",
            f"the body of the request was in an unknown format - accepted media types include: {accepted}",
        )
    patch = await _body(request)
    stored = server.store.update(
        target.kind,
        _key(target),
        lambda current: _apply_patch(server, target, content_type, patch, current),
    )
    return web.json_response(stored)


async def _replace(
    server: KubeApiServer, request: web.Request, target: Target
) -> web.StreamResponse:
    obj = await _body(request)
    if not isinstance(obj, dict):
        raise PatchError(400, "the body of the request must be an object")
    stored = server.store.update(
        target.kind, _key(target), lambda current: _with_status(target, obj, current)
    )
    return web.json_response(stored)


async def _delete(
    server: KubeApiServer, request: web.Request, target: Target
) -> web.StreamResponse:
    return web.json_response(server.store.delete(target.kind, _key(target)))


def _scope(request: web.Request, target: Target) -> Scope:
    return Scope(
        target.kind,
        target.namespace,
        FieldSelector.parse(request.query.get("fieldSelector", ""), target.kind),
        LabelSelector.parse(request.query.get("labelSelector", "")),
    )


async def _collection(
    server: KubeApiServer, request: web.Request, target: Target
) -> web.StreamResponse:
    scope = _scope(request, target)
    if request.query.get("watch", "") in ("1", "true"):
        return await _watch(server, request, scope)
    return await _list(server, request, scope)


def _continue_token(rv: int, offset: int) -> str:
    return base64.urlsafe_b64encode(_dumps({"rv": rv, "start": offset})).decode()


def _parse_continue(token: str) -> tuple[int, int]:
    try:
        parsed = json.loads(base64.urlsafe_b64decode(token.encode()))
        return int(parsed["rv"]), int(parsed["start"])
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise PatchError(400, f"invalid continue token: {token!r}") from None


async def _list(server: KubeApiServer, request: web.Request, scope: Scope) -> web.StreamResponse:
    """The list, streamed in chunks (a bulk population is never built whole). `limit` pages it:
    the next page's `continue` token names the list's revision and where to go on; pages after the
    first are read from the store as it is then, and a token older than the history is 410."""
    limit = int(_number(request, "limit") or 0)
    token = request.query.get("continue", "")
    rv, items = server.store.snapshot(scope)
    start = 0
    if token:
        rv, start = _parse_continue(token)
        if rv < server.store.compacted:
            raise StoreError(
                410,
                "Expired",
                "The provided continue parameter is too old to display a consistent list result.",
            )
    meta: Obj = {"resourceVersion": str(rv)}
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    await response.prepare(request)
    await response.write(
        _dumps({"kind": f"{scope.kind.kind}List", "apiVersion": scope.kind.api_version})[:-1]
        + b',"items":['
    )
    written, chunk = 0, []
    for index, obj in enumerate(items):
        if index < start:
            continue
        if limit and written == limit:
            meta["continue"] = _continue_token(rv, index)
            break
        chunk.append(obj if isinstance(obj, bytes) else _dumps(obj))
        written += 1
        if len(chunk) == LIST_CHUNK:
            await response.write((b"," if written > LIST_CHUNK else b"") + b",".join(chunk))
            chunk = []
    if chunk:
        await response.write((b"," if written > len(chunk) else b"") + b",".join(chunk))
    await response.write(b'],"metadata":' + _dumps(meta) + b"}")
    await response.write_eof()
    return response


def _event(event_type: str, obj: Obj | bytes) -> bytes:
    encoded = obj if isinstance(obj, bytes) else _dumps(obj)
    return b'{"type":"' + event_type.encode() + b'","object":' + encoded + b"}\n"


def _bookmark(kind: Kind, rv: int, *, initial_end: bool = False) -> bytes:
    meta: Obj = {"resourceVersion": str(rv)}
    if initial_end:
        meta["annotations"] = {"k8s.io/initial-events-end": "true"}
    return _event("BOOKMARK", {"kind": kind.kind, "apiVersion": kind.api_version, "metadata": meta})


def _since(request: web.Request) -> int | None:
    """The revision a watch starts after; None: from the current state (unset or "0", or
    sendInitialEvents), its objects sent first as ADDED."""
    text = request.query.get("resourceVersion", "")
    if request.query.get("sendInitialEvents") == "true" or text in ("", "0"):
        return None
    if not text.isdigit():
        raise PatchError(400, f"invalid resource version: {text!r}")
    return int(text)


async def _watch(server: KubeApiServer, request: web.Request, scope: Scope) -> web.StreamResponse:
    since = _since(request)
    bookmarks = request.query.get("allowWatchBookmarks") in ("1", "true")
    initial_end = request.query.get("sendInitialEvents") == "true" and bookmarks
    timeout = _number(request, "timeoutSeconds") or server.default_watch_timeout_s
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[object] = asyncio.Queue()
    watcher = Watcher(scope, lambda item: loop.call_soon_threadsafe(queue.put_nowait, item))
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    try:
        snapshot, first = server.store.watch(watcher, since)
    except StoreError as err:  # 410: an ERROR event on a 200 stream, as the watch cache answers
        await response.prepare(request)
        await response.write(_event("ERROR", status_body(err.status, err.reason, err.message)))
        await response.write_eof()
        return response
    try:
        await response.prepare(request)
        for entry in first:
            for event_type, obj in watch_events(entry, scope, since):
                await response.write(_event(event_type, obj))
        if initial_end:
            await response.write(_bookmark(scope.kind, snapshot, initial_end=True))
        if await _stream(server, request, response, watcher, queue, bookmarks, timeout):
            await response.write_eof()
    except (ConnectionError, RuntimeError):
        pass  # the client went away
    finally:
        server.store.unwatch(watcher)
    return response


async def _stream(
    server: KubeApiServer,
    request: web.Request,
    response: web.StreamResponse,
    watcher: Watcher,
    queue: asyncio.Queue[object],
    bookmarks: bool,
    lifetime_s: float | None,
) -> bool:
    """Streams changes until the timeout or an End (True: end cleanly) or a Drop (False)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + lifetime_s if lifetime_s else None
    interval = server.bookmark_interval_s if bookmarks else None
    next_bookmark = loop.time() + interval if interval else None
    while True:
        waits = [t - loop.time() for t in (deadline, next_bookmark) if t is not None]
        try:
            item = await asyncio.wait_for(queue.get(), max(min(waits), 0) if waits else None)
        except TimeoutError:
            if deadline is not None and loop.time() >= deadline:
                return True
            server.store.notify(Bookmark, lambda w: w is watcher)  # in order after the changes
            next_bookmark = loop.time() + interval if interval else None
            continue
        if isinstance(item, End):
            return True
        if isinstance(item, Drop):
            if request.transport is not None:
                request.transport.abort()
            return False
        if isinstance(item, Bookmark):
            if bookmarks:
                await response.write(_bookmark(watcher.scope.kind, item.rv))
            continue
        for event_type, obj in _events(item, watcher.scope):
            await response.write(_event(event_type, obj))


def _events(item: object, scope: Scope) -> Iterator[tuple[str, Obj | bytes]]:
    if isinstance(item, Change | BulkAdded):
        yield from watch_events(item, scope)
