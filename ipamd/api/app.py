r"""The local HTTP API: thin handlers, each parse → one engine call → serialize.

Routes (JSON in and out; bodies in `ipamd.wire`):

| route (`{one}` = `{container_id}/{ifname}`) | answer |
|---|---|
| `POST /v1/allocations` `{"container_id","ifname","network","pod"?}` | 200 allocation; same key → same |
| `GET /v1/allocations/{one}?network=` | 200 allocation, or 404 `allocation_not_found` |
| `DELETE /v1/allocations/{one}?network=` | 200 `{"released":[...]}`, idempotent, records the intent |
| `POST /v1/allocations/{one}/policy?network=` `{"interfaces"}` | 200 `{}` once the policy agent enforced it |
| `POST /v1/gc` `{"network","valid_attachments":[{"container_id","ifname"}]}` | 200 `{"released":[...]}` |
| `GET /v1/pool` | counts per address state, node-wide and per ENI |
| `GET /v1/allocations` | every allocation and quarantined claim |
| `GET /v1/intents?limit=` | active delete intents, oldest first (default limit 1000) |
| `GET /v1/enis` | ENIs, units and the state of every address |
| `GET /healthz` | 200 while the process serves |
| `GET /readyz` | 200 `{"status":"ready"}` once the daemon says it is ready, else 503 `not_ready` |
| `POST /v1/repair?apply=true\|false` | what repair would change (or did, with `apply=true`) |

An allocation: `{"network","container_id","ifname","ips":[{"address":"10.0.1.23/32","gateway":
"169.254.1.1","eni_id"}],"routes":[{"dst":"0.0.0.0/0","gw":"169.254.1.1"}],"created_at","pod"?}`
(why that gateway: `ipamd.api.views`).

A ready daemon that works less well than it should (strict reverse-path filtering on the primary
interface, say) still answers `/readyz` 200, with `"degraded": [reason, ...]` beside the status.

Every error is `{"code","message","retryable"}` with one of these codes (`ipamd.wire.CODE_*`), from one
middleware:

| status | code | when |
|---|---|---|
| 400 | `bad_request` | not a JSON object; a wrong type, unknown or missing field, bad identifier or query |
| 404 | `not_found` | no such route |
| 404 | `allocation_not_found` | GET of an attachment ipamd does not hold |
| 405 | `method_not_allowed` | the route exists, the method does not (with `Allow`) |
| 409 | `delete_intent` | ADD for a container whose DEL already arrived |
| 409 | `inventory_conflict` | a change contradicts ipamd's inventory (unknown ENI, unit present) |
| 408 | `request_timeout` (retryable) | the body did not arrive within 10 s |
| 413 | `payload_too_large` | body over 16 KiB (GC: 4 MiB) |
| 415 | `unsupported_media_type` | a body that is not `application/json` (UTF-8) |
| 503 | `no_address` (retryable) | the warm pool is empty right now; it grows at once |
| 503 | `max_pods` | the node holds its max pods |
| 503 | `node_full` | every address the node's ENIs can hold is owned by a pod |
| 503 | `datapath_unavailable` (retryable) | the pod's routing could not be set up; the ADD was undone |
| 502 | `network_policy_refused` | the policy agent refused the pod or did not answer; the ADD was undone |
| 503 | `network_policy_unavailable` (retryable) | DEL: the agent could not be told; nothing was released |
| 503 | `runtime_unavailable` (retryable) | repair could not list the runtime's sandboxes |
| 503 | `store_write_failed` (retryable) | the change could not be made durable, so it was not made |
| 503 | `state_unavailable` | the state file is unusable; `ipamctl repair` |
| 503 | `not_ready` (retryable) | `/readyz` before restore and the first EC2 reconcile |
| 500 | `internal` | a bug: logged with its traceback, the message says nothing more |

With network policy enforced (`ipamd.netpolicy.enforcement` says when), ADD's answer carries
`network_policy` (the mode), the plugin calls the policy route once the pod's interfaces exist, and
DEL tells the agent before it releases anything.

ADD is not refused before ready: the engine serves from the restored pool and fails closed on its own;
whether the socket is served before the first reconcile is the composition root's choice.
"""

from __future__ import annotations

import logging
import socket
import struct
from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web

from datastore.records import AllocationKey, AllocationRecord
from ipamd.api import views
from ipamd.api.bodies import query, read_json
from ipamd.api.errors import (
    AllocationNotFound,
    MethodNotAllowed,
    NotFound,
    NotReady,
    PayloadTooLarge,
    UnsupportedMediaType,
)
from ipamd.clock import Clock
from ipamd.engine.engine import Engine, PodAddresses
from ipamd.errors import BadRequest, IpamdError
from ipamd.model import PodRef
from ipamd.netpolicy.enforcement import NetworkPolicy
from ipamd.reconcile.leaks import release_invalid_attachments
from ipamd.wire import (
    CODE_BAD_REQUEST,
    CODE_INTERNAL,
    MAX_BODY_BYTES,
    MAX_GC_BODY_BYTES,
    PATH_ALLOCATIONS,
    PATH_ENIS,
    PATH_GC,
    PATH_HEALTHZ,
    PATH_INTENTS,
    PATH_POOL,
    PATH_READYZ,
    PATH_REPAIR,
    AllocateRequest,
    ErrorBody,
    GcRequest,
    WireError,
    check_container_id,
    check_ifname,
    check_network,
    dumps,
)
from ipamd.wire.pod import POLICY_SEGMENT, PolicyRequest

logger = logging.getLogger(__name__)


class EngineOnly:
    """ADD and DEL without host networking: addresses only."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    async def add(self, key: AllocationKey, pod: PodRef | None) -> AllocationRecord:
        return await self._engine.assign(key, pod)

    async def release(self, key: AllocationKey) -> tuple[AllocationRecord, ...]:
        return await self._engine.release(key)


ENGINE = web.AppKey("engine", Engine)
PODS: web.AppKey[PodAddresses] = web.AppKey("pods")
READY: web.AppKey[Callable[[], bool]] = web.AppKey("ready")
DEGRADED: web.AppKey[Callable[[], Sequence[str]]] = web.AppKey("degraded")
GC_GRACE_S = web.AppKey("gc_grace_s", float)
POD_ROUTES = web.AppKey("pod_routes", views.PodRoutes)
POOL_SETTINGS: web.AppKey[Callable[[], dict[str, object]]] = web.AppKey("pool_settings")
Repair = Callable[[bool], Awaitable[dict[str, object]]]
REPAIR: web.AppKey[Repair] = web.AppKey("repair")
CLOCK = web.AppKey("clock", Clock)
NETWORK_POLICY: web.AppKey[NetworkPolicy | None] = web.AppKey("network_policy")
HOST_NETWORK = web.AppKey("host_network", bool)

DEFAULT_INTENTS_LIMIT = 1000
_UCRED = struct.Struct("3i")
"""`struct ucred` of SO_PEERCRED: pid, uid, gid."""
MAX_INTENTS_LIMIT = 100_000

_HTTP_CODES = {
    404: NotFound.code,
    405: MethodNotAllowed.code,
    413: PayloadTooLarge.code,
    415: UnsupportedMediaType.code,
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(body: object, status: int = 200) -> web.Response:
    return web.json_response(body, status=status, dumps=dumps)


def _error(status: int, body: ErrorBody, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(body.to_json(), status=status, dumps=dumps, headers=headers)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The one place a failure becomes an HTTP answer: status and stable `code` from the error type."""
    try:
        return await handler(request)
    except IpamdError as err:
        if err.status >= 500:
            level = logging.INFO if err.retryable else logging.WARNING
            logger.log(level, "api.refused path=%s code=%s error=%s", request.path, err.code, err)
        return _error(err.status, ErrorBody(err.code, str(err), err.retryable))
    except WireError as err:
        return _error(400, ErrorBody(BadRequest.code, str(err)))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = _HTTP_CODES.get(exc.status, CODE_BAD_REQUEST if exc.status < 500 else CODE_INTERNAL)
        allow = exc.headers.get("Allow")
        message = f"{exc.reason}: {request.method} {request.path}"
        if allow:
            message += f" (allowed: {allow})"
        return _error(exc.status, ErrorBody(code, message), {"Allow": allow} if allow else None)
    except Exception:
        logger.exception("api.internal_error method=%s path=%s", request.method, request.path)
        return _error(500, ErrorBody(CODE_INTERNAL, "internal error; see the daemon's log"))


def _key(request: web.Request) -> AllocationKey:
    params = query(request, required=("network",))
    return AllocationKey(
        network=check_network(params["network"]),
        container_id=check_container_id(request.match_info["container_id"]),
        ifname=check_ifname(request.match_info["ifname"]),
    )


async def add(request: web.Request) -> web.Response:
    body = AllocateRequest.from_json(await read_json(request, MAX_BODY_BYTES))
    query(request)
    key = AllocationKey(body.network, body.container_id, body.ifname)
    pod = None if body.pod is None else PodRef(body.pod.namespace, body.pod.name, body.pod.uid)
    record = await request.app[PODS].add(key, pod)
    policy = request.app[NETWORK_POLICY]
    logger.info(
        "api.add network=%s container_id=%s ifname=%s addresses=%s",
        key.network,
        key.container_id,
        key.ifname,
        ",".join(record.addresses),
    )
    mode = None if policy is None else policy.mode_for(record)
    return _json(views.allocation(record, request.app[POD_ROUTES], mode).to_json())


async def enforce_policy(request: web.Request) -> web.Response:
    """The pod's interfaces exist: the agent enforces its policy, or the allocation is retracted
    (502 `network_policy_refused`). Nothing to enforce (no agent, mode `none`) is a 200 too."""
    body = PolicyRequest.from_json(await read_json(request, MAX_BODY_BYTES))
    key = _key(request)
    record = request.app[ENGINE].state.allocation(key)
    if record is None:
        raise AllocationNotFound(
            f"no allocation for container {key.container_id} ifname {key.ifname} "
            f"on network {key.network}"
        )
    policy = request.app[NETWORK_POLICY]
    if policy is not None:
        await policy.enforce(record, body.interfaces)
    return _json({})


async def get_allocation(request: web.Request) -> web.Response:
    key = _key(request)
    record = request.app[ENGINE].state.allocation(key)
    if record is None:
        raise AllocationNotFound(
            f"no allocation for container {key.container_id} ifname {key.ifname} "
            f"on network {key.network}"
        )
    return _json(views.allocation(record, request.app[POD_ROUTES]).to_json())


async def delete(request: web.Request) -> web.Response:
    key = _key(request)
    policy = request.app[NETWORK_POLICY]
    if policy is not None:
        await policy.forget(key)  # before the release: else the address could go to a new pod
    released = await request.app[PODS].release(key)
    logger.info(
        "api.del network=%s container_id=%s ifname=%s released=%s",
        key.network,
        key.container_id,
        key.ifname,
        ",".join(a for r in released for a in r.addresses),
    )
    return _json(views.released(released, request.app[POD_ROUTES]))


async def gc(request: web.Request) -> web.Response:
    body = GcRequest.from_json(await read_json(request, MAX_GC_BODY_BYTES))
    query(request)
    app = request.app
    keys = await release_invalid_attachments(
        app[ENGINE],
        body.network,
        [(a.container_id, a.ifname) for a in body.valid_attachments],
        app[GC_GRACE_S],
        app[CLOCK],
    )
    logger.info(
        "api.gc network=%s valid=%d released=%s",
        body.network,
        len(body.valid_attachments),
        ",".join(f"{k.container_id}/{k.ifname}" for k in keys),
    )
    return _json(
        {
            "released": [
                {"network": k.network, "container_id": k.container_id, "ifname": k.ifname}
                for k in keys
            ]
        }
    )


async def pool(request: web.Request) -> web.Response:
    query(request)
    engine = request.app[ENGINE]
    body = views.pool(engine.snapshot(), request.app[HOST_NETWORK])
    body.update(request.app[POOL_SETTINGS]())
    # An unusable state file serves no pool at all: say so rather than show an empty one.
    body["state_unavailable"] = None if engine.unavailable is None else str(engine.unavailable)
    return _json(body)


async def enis(request: web.Request) -> web.Response:
    query(request)
    app = request.app
    return _json(views.enis(app[ENGINE].snapshot(), app[HOST_NETWORK]))


async def allocations(request: web.Request) -> web.Response:
    query(request)
    app = request.app
    return _json(views.allocations(app[ENGINE].state, app[CLOCK].now(), app[POD_ROUTES]))


async def intents(request: web.Request) -> web.Response:
    raw = query(request, optional=("limit",)).get("limit", str(DEFAULT_INTENTS_LIMIT))
    if not (raw.isascii() and raw.isdigit()) or not 0 < int(raw) <= MAX_INTENTS_LIMIT:
        raise BadRequest(f"limit must be an integer from 1 to {MAX_INTENTS_LIMIT}")
    engine = request.app[ENGINE]
    now = request.app[CLOCK].now()
    return _json(views.intents(engine.state, now, engine.settings.intent_ttl_s, int(raw)))


async def run_repair(request: web.Request) -> web.Response:
    """`ipamctl repair`: a dry run unless `apply=true`; any other value is refused, never taken
    for a dry run (or for an apply). An apply is logged (`api.repair`) with what it changed and who
    asked: the uid and pid of the process at the socket's other end."""
    apply = query(request, optional=("apply",)).get("apply", "false")
    if apply not in ("true", "false"):
        raise BadRequest(f"query parameter 'apply' must be true or false, not {apply!r}")
    answer = await request.app[REPAIR](apply == "true")
    if apply == "true":
        uid, pid = peer_credentials(request)
        logger.info(
            "api.repair applied=%s actions=%s uid=%s pid=%s",
            answer.get("applied"),
            answer.get("actions"),
            uid,
            pid,
        )
    return _json(answer)


def peer_credentials(request: web.Request) -> tuple[int | None, int | None]:
    """(uid, pid) of the process that made `request`, from its unix socket (SO_PEERCRED); (None,
    None) where the kernel does not say."""
    transport = request.transport
    sock = None if transport is None else transport.get_extra_info("socket")
    if sock is None or sock.family != socket.AF_UNIX:
        return None, None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    except (OSError, AttributeError):  # AttributeError: a system without SO_PEERCRED
        return None, None
    pid, uid, _gid = _UCRED.unpack(raw)
    return uid, pid


async def _no_repair(apply: bool) -> dict[str, object]:
    raise NotFound("repair is not served by this daemon")


async def healthz(request: web.Request) -> web.Response:
    query(request)
    return _json({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    query(request)
    unavailable = request.app[ENGINE].unavailable
    if unavailable is not None:
        raise NotReady(f"the state is unavailable: {unavailable}")
    if not request.app[READY]():
        raise NotReady("restore and the first EC2 reconcile have not finished")
    degraded = list(request.app[DEGRADED]())
    return _json({"status": "ready", **({"degraded": degraded} if degraded else {})})


def create_app(
    engine: Engine,
    *,
    ready: Callable[[], bool],
    degraded: Callable[[], Sequence[str]] = tuple,
    gc_grace_s: float,
    clock: Clock,
    pod_routes: views.PodRoutes = views.IPV4_POD_ROUTES,
    pool_settings: Callable[[], dict[str, object]] = dict,
    pods: PodAddresses | None = None,
    repair: Repair = _no_repair,
    network_policy: NetworkPolicy | None = None,
    host_network: bool = False,
) -> web.Application:
    """The API over `engine`. `ready` says whether the daemon has restored its state and finished its
    first EC2 reconcile; `gc_grace_s` spares allocations younger than it from the CNI GC verb;
    `network_policy`: the agent's part in ADD and DEL (None: no agent is ever called);
    `host_network`: whether ipamd sets up each ENI's datapath on the host (IPAMD_HOST_NETWORK), which
    the pool and ENI views report per ENI ("off" without it); `degraded`: what works less than it
    should while ready, one reason each (`/readyz` names them, still 200)."""
    app = web.Application(middlewares=[error_middleware], client_max_size=MAX_GC_BODY_BYTES)
    app[ENGINE] = engine
    app[PODS] = pods or EngineOnly(engine)
    app[REPAIR] = repair
    app[READY] = ready
    app[DEGRADED] = degraded
    app[GC_GRACE_S] = gc_grace_s
    app[POD_ROUTES] = pod_routes
    app[POOL_SETTINGS] = pool_settings
    app[CLOCK] = clock
    app[NETWORK_POLICY] = network_policy
    app[HOST_NETWORK] = host_network
    one = PATH_ALLOCATIONS + "/{container_id}/{ifname}"
    app.router.add_routes(
        [
            web.post(PATH_ALLOCATIONS, add),
            web.get(PATH_ALLOCATIONS, allocations),
            web.get(one, get_allocation),
            web.delete(one, delete),
            web.post(f"{one}/{POLICY_SEGMENT}", enforce_policy),
            web.post(PATH_GC, gc),
            web.get(PATH_POOL, pool),
            web.get(PATH_INTENTS, intents),
            web.get(PATH_ENIS, enis),
            web.get(PATH_HEALTHZ, healthz),
            web.get(PATH_READYZ, readyz),
            web.post(PATH_REPAIR, run_repair),
        ]
    )
    return app
