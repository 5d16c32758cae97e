"""The test API server (`bench.kube_api` says what it serves, its knobs and how to use it): its
lifecycle, in the caller's event loop or on a loop in a thread of its own; its middleware, which
records every request, delays it, answers it with a fault or refuses it by its token; its knobs;
and the seeds and reads of its store.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import tempfile
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler

from bench.kube_api import rest
from bench.kube_api.kinds import ENICONFIGS, EVENTS, EVENTS_V1, NODES, PODS, Key, Kind, Obj
from bench.kube_api.objects import (
    bulk_eniconfigs,
    bulk_pods,
    eniconfig_object,
    node_object,
    pod_object,
)
from bench.kube_api.paths import PUBLIC_PATHS, status_response
from bench.kube_api.recorded import Fault, Match, RecordedRequest
from bench.kube_api.schemas import KUBERNETES_VERSION, Schemas
from bench.kube_api.store import Store
from bench.kube_api.tls import TlsFiles, make_tls_files, tls_available
from bench.vpc.processes import free_port

T = TypeVar("T")


@dataclass(slots=True)
class _Thread:
    thread: threading.Thread
    loop: asyncio.AbstractEventLoop
    stop: asyncio.Event
    error: list[BaseException] = field(default_factory=list)


class KubeApiServer:
    """The server (the module's docstring says what it serves and its knobs).

    `directory` holds the kubeconfig, the token file and the TLS files (a temporary one, removed
    at the end, when None); `tls` serves HTTPS with a CA made now; `token_file` names the token
    in the kubeconfig by file (`tokenFile`) rather than inline, so a process re-reads it after
    `rotate_token()`; `serving=False` starts down; `history_window` is how many changes a watch
    may resume from; `bookmark_interval_s` is how often a watch that allows bookmarks gets one
    (None: only on `send_bookmarks()`); `default_watch_timeout_s` ends a watch that names no
    timeoutSeconds (None: never); `port` 0 picks a free one."""

    def __init__(
        self,
        directory: Path | None = None,
        *,
        tls: bool = False,
        token_file: bool = False,
        serving: bool = True,
        history_window: int = 1000,
        bookmark_interval_s: float | None = 1.0,
        default_watch_timeout_s: float | None = None,
        kubernetes_version: str = KUBERNETES_VERSION,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        if tls and not tls_available():
            raise RuntimeError("TLS needs the cryptography package")
        self._own_directory = directory is None
        self.directory = directory or Path(tempfile.mkdtemp(prefix="kube-api-"))
        self.tls: TlsFiles | None = None
        self._want_tls = tls
        self.host = host
        self.port = port
        self._start_serving = serving
        self.schemas = Schemas(kubernetes_version)
        self.store = Store(history_window, self.schemas.admit)
        self.bookmark_interval_s = bookmark_interval_s
        self.default_watch_timeout_s = default_watch_timeout_s
        self.token = secrets.token_urlsafe(24)
        self._tokens = {self.token}
        self._token_file = token_file
        self.requests: list[RecordedRequest] = []
        self._faults: list[Fault] = []
        self._lock = threading.Lock()
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: _Thread | None = None
        self._wake = asyncio.Event()
        """Set to answer now every request being delayed (`slow`)."""

    # -- where it is --------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"{'https' if self._want_tls else 'http'}://{self.host}:{self.port}"

    @property
    def kubeconfig(self) -> Path:
        return self.directory / "kubeconfig"

    @property
    def token_path(self) -> Path:
        return self.directory / "token"

    @property
    def serving(self) -> bool:
        return self._site is not None

    def client_ssl(self) -> Any:
        """What an aiohttp client passes as `ssl=` to trust this server."""
        return self.tls.client_context() if self.tls is not None else False

    def session(self, *, token: str | None = None) -> aiohttp.ClientSession:
        """A client session that reaches this server with the current (or the given) token."""
        return aiohttp.ClientSession(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token or self.token}"},
            connector=aiohttp.TCPConnector(ssl=self.client_ssl()),
        )

    def _write_credentials(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        user: Obj = (
            {"tokenFile": str(self.token_path)} if self._token_file else {"token": self.token}
        )
        cluster: Obj = {"server": self.url}
        if self.tls is not None:
            cluster["certificate-authority"] = str(self.tls.ca_cert)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": cluster}],
            "users": [{"name": "ipamd", "user": user}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "ipamd"}}],
            "current-context": "test",
        }
        for path, text in (
            (self.token_path, self.token),
            (self.kubeconfig, json.dumps(config, indent=2)),
        ):
            scratch = path.with_name(f".{path.name}.new")
            scratch.write_text(text + "\n", encoding="utf-8")
            os.replace(scratch, path)

    # -- lifecycle ----------------------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        if self._want_tls:
            self.tls = make_tls_files(self.directory / "pki")
        if not self.port:
            self.port = free_port(self.host)
        app = web.Application(middlewares=[self._middleware])
        app.router.add_route("*", "/{tail:.*}", self._route)
        self._runner = web.AppRunner(
            app, handle_signals=False, shutdown_timeout=1.0, access_log=None
        )
        await self._runner.setup()
        self._write_credentials()
        if self._start_serving:
            await self.up()

    async def close(self) -> None:
        self.store.notify(lambda rv: rest.End())
        self._wake_delayed()
        if self._runner is not None:
            await self.down()
            await self._runner.cleanup()
            self._runner = None
        if self._own_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    async def up(self) -> None:
        assert self._runner is not None, "start() first"
        if self._site is None:
            ssl_context = self.tls.server_context() if self.tls is not None else None
            site = web.TCPSite(
                self._runner, self.host, self.port, ssl_context=ssl_context, reuse_address=True
            )
            await site.start()
            self._site = site

    async def down(self) -> None:
        """Stops listening and cuts every open connection (watches included)."""
        if self._site is not None:
            site, self._site = self._site, None
            await site.stop()
        self.store.notify(lambda rv: rest.Drop())
        if self._runner is not None and self._runner.server is not None:
            for connection in self._runner.server.connections:
                if connection.transport is not None:
                    connection.transport.abort()
        await asyncio.sleep(0)

    async def __aenter__(self) -> KubeApiServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __enter__(self) -> KubeApiServer:
        """Serves from a loop in a thread of its own (for a daemon process, or a sync test)."""
        started = threading.Event()
        holder: dict[str, _Thread] = {}

        async def main() -> None:
            state = _Thread(threading.current_thread(), asyncio.get_running_loop(), asyncio.Event())
            holder["state"] = state
            try:
                await self.start()
            except BaseException as err:
                state.error.append(err)
                started.set()
                raise
            started.set()
            try:
                await state.stop.wait()
            finally:
                await self.close()

        thread = threading.Thread(target=lambda: asyncio.run(main()), name="kube-api", daemon=True)
        thread.start()
        started.wait(timeout=30)
        self._thread = holder.get("state")
        if self._thread is None or self._thread.error:
            thread.join(timeout=5)
            raise RuntimeError("the test API server did not start") from (
                self._thread.error[0] if self._thread and self._thread.error else None
            )
        return self

    def __exit__(self, *exc: object) -> None:
        state, self._thread = self._thread, None
        if state is not None:
            state.loop.call_soon_threadsafe(state.stop.set)
            state.thread.join(timeout=30)

    def call(self, coroutine: Coroutine[Any, Any, T], timeout_s: float = 30.0) -> T:
        """Runs a coroutine (an async knob) on the server's loop from another thread."""
        assert self._loop is not None, "not started"
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout_s)

    # -- the middleware: record, delay, faults, authentication ------------------------------------------

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        recorded = RecordedRequest(
            request.method,
            request.path,
            dict(request.query),
            {k.lower(): v for k, v in request.headers.items()},
            await request.read(),
        )
        with self._lock:
            self.requests.append(recorded)
            faults = [f for f in self._faults if f.applies(recorded)]
            delay = sum(f.delay_s for f in faults)
            answer = next((f for f in faults if f.status), None)
            for fault in faults:
                if fault.times is not None and (fault is answer or not fault.status):
                    fault.times -= 1
        if delay:
            wake = self._wake
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), delay)
        refusal = self._fault_response(answer) if answer is not None else self._refusal(recorded)
        response = refusal if refusal is not None else await handler(request)
        recorded.status = response.status
        return response

    @staticmethod
    def _fault_response(fault: Fault) -> web.Response:
        if fault.status == 429:
            return status_response(
                429,
                "TooManyRequests",
                "Too many requests, please try again later.",
                details={"retryAfterSeconds": fault.retry_after_s},
                headers={"Retry-After": str(fault.retry_after_s)},
            )
        reasons = {500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout"}
        return status_response(
            fault.status, reasons.get(fault.status, "InternalError"), "injected by the test"
        )

    def _refusal(self, request: RecordedRequest) -> web.Response | None:
        header = request.headers.get("authorization", "")
        if header:
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "bearer" or token not in self._tokens:
                return status_response(401, "Unauthorized", "Unauthorized")
            return None
        if request.path in PUBLIC_PATHS:
            return None
        return status_response(
            403,
            "Forbidden",
            f'forbidden: User "system:anonymous" cannot {request.method.lower()} path "{request.path}"',
        )

    async def _route(self, request: web.Request) -> web.StreamResponse:
        return await rest.handle(self, request)

    # -- knobs --------------------------------------------------------------------------------------

    def throttle(self, times: int = 1, retry_after_s: int = 1, match: Match | None = None) -> None:
        with self._lock:
            self._faults.append(Fault(429, times, retry_after_s=retry_after_s, match=match))

    def fail(self, times: int = 1, status: int = 503, match: Match | None = None) -> None:
        assert 500 <= status < 600, status
        with self._lock:
            self._faults.append(Fault(status, times, match=match))

    def slow(self, delay_s: float, times: int | None = None, match: Match | None = None) -> None:
        with self._lock:
            self._faults.append(Fault(0, times, delay_s=delay_s, match=match))

    def clear_faults(self) -> None:
        """No more faults; requests still being delayed are answered now."""
        with self._lock:
            self._faults.clear()
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake_delayed)

    def _wake_delayed(self) -> None:
        self._wake.set()
        self._wake = asyncio.Event()

    def drop_watches(self) -> int:
        return self.store.notify(lambda rv: rest.Drop())

    def end_watches(self) -> int:
        return self.store.notify(lambda rv: rest.End())

    def send_bookmarks(self) -> int:
        return self.store.notify(rest.Bookmark)

    def expire_history(self) -> int:
        return self.store.compact()

    def rotate_token(self) -> str:
        token = secrets.token_urlsafe(24)
        self._tokens = {token}
        self.token = token
        self._write_credentials()
        return token

    def watch_count(self, match: Callable[[Kind], bool] | None = None) -> int:
        return self.store.watcher_count(lambda w: match is None or match(w.scope.kind))

    async def wait_for_watches(
        self, count: int = 1, match: Callable[[Kind], bool] | None = None, timeout_s: float = 10.0
    ) -> None:
        async with asyncio.timeout(timeout_s):
            # Watches register on the server's loop, which may run in another thread: polled.
            while self.watch_count(match) < count:  # noqa: ASYNC110
                await asyncio.sleep(0.01)

    def requests_for(self, plural: str, method: str | None = None) -> list[RecordedRequest]:
        with self._lock:
            recorded = list(self.requests)
        return [
            r
            for r in recorded
            if r.kind_plural == plural and (method is None or r.method == method)
        ]

    # -- seeds and reads ------------------------------------------------------------------------------

    def create(self, kind: Kind, obj: Obj, *, validate: bool = True) -> Obj:
        return self.store.create(kind, obj, admit=validate)

    def update(
        self, kind: Kind, key: Key, change: Callable[[Obj], Obj], *, validate: bool = True
    ) -> Obj:
        return self.store.update(kind, key, change, admit=validate)

    def delete(self, kind: Kind, key: Key) -> Obj:
        return self.store.delete(kind, key)

    def add_node(self, name: str, *, validate: bool = True, **fields: Any) -> Obj:
        """`node_object`'s fields: labels, annotations, taints, max_pods, zone, instance_id, ..."""
        return self.create(NODES, node_object(name, **fields), validate=validate)

    def add_pod(
        self, name: str, node: str | None = None, *, validate: bool = True, **fields: Any
    ) -> Obj:
        """`pod_object`'s fields: namespace, host_network, phase, pod_ip, labels, annotations."""
        return self.create(PODS, pod_object(name, node, **fields), validate=validate)

    def bind_pod(self, namespace: str, name: str, node: str) -> Obj:
        """What the scheduler's binding does: spec.nodeName set (a watch by node sees ADDED)."""
        return self.update(PODS, (namespace, name), lambda p: _set(p, ("spec", "nodeName"), node))

    def set_pod_phase(
        self, namespace: str, name: str, phase: str, pod_ip: str | None = None
    ) -> Obj:
        def change(pod: Obj) -> Obj:
            status = dict(pod.get("status") or {}, phase=phase)
            if pod_ip is not None:
                status |= {"podIP": pod_ip, "podIPs": [{"ip": pod_ip}]}
            return dict(pod, status=status)

        return self.update(PODS, (namespace, name), change)

    def delete_pod(self, namespace: str, name: str) -> Obj:
        return self.delete(PODS, (namespace, name))

    def add_eniconfig(
        self,
        name: str,
        subnet: str,
        security_groups: list[str] | None = None,
        *,
        validate: bool = True,
    ) -> Obj:
        return self.create(
            ENICONFIGS, eniconfig_object(name, subnet, security_groups), validate=validate
        )

    def add_bulk(self, pods: int = 100_000, eniconfigs: int = 5_000, *, nodes: int = 1_000) -> None:
        """Issue 39's memory population: `pods` running pods on `nodes` other nodes and `eniconfigs`
        ENIConfigs, generated on demand (their first and last objects validated here)."""
        for bulk in (
            bulk_pods(pods, nodes=nodes) if pods else None,
            bulk_eniconfigs(eniconfigs) if eniconfigs else None,
        ):
            if bulk is not None:
                for index in {0, bulk.count - 1}:
                    self.schemas.admit(bulk.obj(index))
                self.store.add_bulk(bulk)

    def node(self, name: str) -> Obj | None:
        return self.store.get(NODES, ("", name))

    def pod(self, namespace: str, name: str) -> Obj | None:
        return self.store.get(PODS, (namespace, name))

    def eniconfig(self, name: str) -> Obj | None:
        return self.store.get(ENICONFIGS, ("", name))

    def events(self) -> list[Obj]:
        """Every Event posted, core v1 first, then events.k8s.io/v1."""
        return [*self.store.objects(EVENTS), *self.store.objects(EVENTS_V1)]

    def objects(self, kind: Kind) -> list[Obj]:
        return self.store.objects(kind)


def _set(obj: Obj, path: tuple[str, ...], value: Any) -> Obj:
    """A copy of `obj` with the field at `path` set (the maps on the way copied)."""
    if len(path) == 1:
        return dict(obj, **{path[0]: value})
    return dict(obj, **{path[0]: _set(dict(obj.get(path[0]) or {}), path[1:], value)})
