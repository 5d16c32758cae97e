"""A Kubernetes API server for tests: a real HTTP(S) server on 127.0.0.1 that ipamd's client talks to
as to the real one (issue 39), in the test's own event loop or, for a daemon started as a process,
on a loop in a thread of its own.

Why not KMock (PyPI `kmock`, 0.8, tried): it keeps objects and streams watches, but serves no
resourceVersion (objects have none; a list answers `"..."`), ignores `resourceVersion` on a watch
(every watch replays all objects as ADDED), sends no bookmarks and no 410, ignores `timeoutSeconds`,
`fieldSelector` and `labelSelector` (a list by `spec.nodeName` answers every node's pods), merges
every PATCH as a plain dict merge whatever its content type (no strategic merge; a failed JSON
patch `test` is a 500, not 422), validates nothing, knows no bearer token, and has no TLS. Each of
those is what ipamd's client must be tested against, so this server is built on aiohttp instead.

Use::

    async with KubeApiServer(tmp_path / "kube") as api:        # in the test's loop
        api.add_node("ip-10-0-0-10", max_pods=29, taints=["ipamd.k8s.aws/agent-not-ready:NoSchedule"])
        api.add_pod("web-1", node="ip-10-0-0-10")
        ... KUBECONFIG=api.kubeconfig ...

    with KubeApiServer(tmp_path / "kube", tls=True) as api:    # on its own thread: for a process
        daemon = start_daemon(env={"KUBECONFIG": str(api.kubeconfig)})

The fixtures `kube_api` (plain HTTP), `kube_api_tls` (HTTPS when `cryptography` is installed, else
skipped) and `kube_api_thread` (on its own thread) are defined here; a conftest imports the ones
its tests use. `api.kubeconfig` is a kubeconfig file (JSON, which is YAML) naming the server, its
CA (`certificate-authority`) when TLS, and the bearer token (`token`, or `tokenFile` with
`token_file=True`).

What it serves, as the real server does (kube_http.py, kube_store.py, kube_patch.py):
- Nodes, pods (`/api/v1/namespaces/<ns>/pods` and all namespaces' `/api/v1/pods`), core and
  events.k8s.io/v1 Events, and ENIConfigs (`crd.k8s.amazonaws.com/v1alpha1`, cluster-scoped):
  GET, list, watch, POST, PATCH, PUT, DELETE; the `status` subresource of pods and nodes (a patch
  of the main resource keeps the status, as their strategies do).
- One cluster-wide revision: every object has `metadata.resourceVersion` (a string), `uid` and
  `creationTimestamp`; a list carries the revision it was taken at; `limit`/`continue` page it.
- `fieldSelector` (metadata.name and .namespace on every kind; spec.nodeName, spec.hostNetwork,
  status.phase, ... on pods; spec.unschedulable on nodes; an unsupported field is 400) and
  `labelSelector` (equality, existence, in/notin) on lists and watches.
- Watches (`watch=1`): newline-delimited `{"type", "object"}` events from `resourceVersion` on
  (unset or "0": the current objects first, as ADDED); an object that starts or stops matching
  the selector is ADDED or DELETED; `allowWatchBookmarks=true` gets a BOOKMARK every
  `bookmark_interval_s` and on `send_bookmarks()`; `sendInitialEvents=true` ends the initial
  ADDED with the `k8s.io/initial-events-end` bookmark; `timeoutSeconds` ends the stream cleanly.
  A resourceVersion older than the last `history_window` changes gets an ERROR event with a
  Status 410 (Expired) and the end of the stream.
- PATCH as merge, strategic merge and JSON patch (kube_patch.py says how each treats the taints).
  A refused patch answers the real server's Status: 409 on a resourceVersion precondition, 422
  on a failed JSON patch op, 415 on another content type.
- Admission (kube_schemas.py): every object created, patched or replaced is validated against
  the Kubernetes schemas kubernetes-validate ships (strict: an unknown field is an error) or,
  for an ENIConfig, against VPC CNI's CRD (pruned first); an invalid one is 422 Invalid with
  each cause. The seed helpers validate too (`validate=False` to store a bad object on purpose).
- Authentication: `Authorization: Bearer <token>`; a wrong token is 401, none is 403 but for
  /version, /healthz, /livez and /readyz.

Seeds (sync, thread-safe; each returns the stored object): `add_node`, `add_pod`, `bind_pod`
(what the scheduler's binding does), `set_pod_phase`, `delete_pod`, `add_eniconfig`, and for any
kind of kube_store.py `create(kind, obj)`, `update(kind, key, change)`, `delete(kind, key)`;
`add_bulk(pods=100_000, eniconfigs=5_000)` adds issue 39's memory population cheaply (generated
from an index on demand, kube_objects.py). Reads: `node(name)`, `pod(ns, name)`,
`eniconfig(name)`, `events()`, `objects(kind)`.

Knobs (sync, thread-safe unless marked async):
- `throttle(times, retry_after_s=1, match=None)`: the next `times` matching requests get 429
  with `Retry-After` (and `details.retryAfterSeconds`).
- `fail(times, status=503, match=None)`: the next `times` matching requests get a 5xx Status.
- `slow(delay_s, times=None, match=None)`: matching requests wait before being answered (all of
  them until `clear_faults()` when `times` is None).
- `clear_faults()`.
- `drop_watches()`: cuts every open watch's connection mid-stream; `end_watches()` ends them
  cleanly; both answer how many. `send_bookmarks()` sends a BOOKMARK on every open watch that
  allows them.
- `expire_history()`: a compaction at the current revision: every older resourceVersion becomes
  too old (a watch or a `continue` from one gets 410); `history_window` (constructor) is how many
  changes are kept.
- `await down()` / `await up()`: stop serving (the port refuses connections, open ones are cut) and
  serve again on the same port; `KubeApiServer(serving=False)` starts down (the kubeconfig is
  written with its port all the same).
- `rotate_token()`: a new token; the old one gets 401 from then on; the token file and the
  kubeconfig are rewritten.
- `await wait_for_watches(n, match=None)`: until n watches are open; `watch_count(match)`
  (their `match` is a predicate on the watched `Kind`).
- The faults' `match` is a predicate on a `RecordedRequest` (`is_watch`, `kind_plural`,
  `method`, `path`, `field_selector`); faults apply in the order they were added, and a delay
  adds to a status fault.
- `call(coroutine)` runs an async knob from another thread (for `kube_api_thread`).

A request is recorded, then delayed, then answered by a fault, else refused by authentication,
else served. Every request is recorded, in order, in `requests` (`RecordedRequest`: method, path, query,
headers with lower-case names, body, and the status answered), faults and refusals included;
`requests_for(plural, method=None)` filters them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import socket
import tempfile
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
from aiohttp import web
from aiohttp.typedefs import Handler

from tests.support import kube_http
from tests.support.kube_objects import (
    bulk_eniconfigs,
    bulk_pods,
    eniconfig_object,
    node_object,
    pod_object,
)
from tests.support.kube_schemas import KUBERNETES_VERSION, Schemas
from tests.support.kube_store import (
    ENICONFIGS,
    EVENTS,
    EVENTS_V1,
    NODES,
    PODS,
    Key,
    Kind,
    Obj,
    Store,
)
from tests.support.kube_tls import TlsFiles, make_tls_files, tls_available

T = TypeVar("T")


@dataclass(slots=True)
class RecordedRequest:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    """Lower-case names."""
    body: bytes
    status: int | None = None
    """What was answered (None while a watch still streams)."""

    @property
    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    @property
    def is_watch(self) -> bool:
        return self.query.get("watch", "") in ("1", "true")

    @property
    def field_selector(self) -> str:
        return self.query.get("fieldSelector", "")

    @property
    def kind_plural(self) -> str:
        target = kube_http.parse_target(self.path)
        return target.kind.plural if target is not None else ""


Match = Callable[[RecordedRequest], bool]


@dataclass(slots=True)
class Fault:
    status: int
    times: int | None
    retry_after_s: int = 0
    delay_s: float = 0.0
    match: Match | None = None

    def applies(self, request: RecordedRequest) -> bool:
        return (self.times is None or self.times > 0) and (
            self.match is None or self.match(request)
        )


@dataclass(slots=True)
class _Thread:
    thread: threading.Thread
    loop: asyncio.AbstractEventLoop
    stop: asyncio.Event
    error: list[BaseException] = field(default_factory=list)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


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
        self.store.notify(lambda rv: kube_http.End())
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
        self.store.notify(lambda rv: kube_http.Drop())
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
            return kube_http.status_response(
                429,
                "TooManyRequests",
                "Too many requests, please try again later.",
                details={"retryAfterSeconds": fault.retry_after_s},
                headers={"Retry-After": str(fault.retry_after_s)},
            )
        reasons = {500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout"}
        return kube_http.status_response(
            fault.status, reasons.get(fault.status, "InternalError"), "injected by the test"
        )

    def _refusal(self, request: RecordedRequest) -> web.Response | None:
        header = request.headers.get("authorization", "")
        if header:
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "bearer" or token not in self._tokens:
                return kube_http.status_response(401, "Unauthorized", "Unauthorized")
            return None
        if request.path in kube_http.PUBLIC_PATHS:
            return None
        return kube_http.status_response(
            403,
            "Forbidden",
            f'forbidden: User "system:anonymous" cannot {request.method.lower()} path "{request.path}"',
        )

    async def _route(self, request: web.Request) -> web.StreamResponse:
        return await kube_http.handle(self, request)

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
        return self.store.notify(lambda rv: kube_http.Drop())

    def end_watches(self) -> int:
        return self.store.notify(lambda rv: kube_http.End())

    def send_bookmarks(self) -> int:
        return self.store.notify(kube_http.Bookmark)

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


# -- fixtures -----------------------------------------------------------------------------------------


@pytest.fixture
async def kube_api(tmp_path: Path) -> AsyncIterator[KubeApiServer]:
    async with KubeApiServer(tmp_path / "kube-api") as server:
        yield server


@pytest.fixture
async def kube_api_tls(tmp_path: Path) -> AsyncIterator[KubeApiServer]:
    if not tls_available():
        pytest.skip("cryptography is not installed: no TLS for the test API server")
    async with KubeApiServer(tmp_path / "kube-api", tls=True) as server:
        yield server


@pytest.fixture
def kube_api_thread(tmp_path: Path) -> Iterator[KubeApiServer]:
    with KubeApiServer(tmp_path / "kube-api") as server:
        yield server
