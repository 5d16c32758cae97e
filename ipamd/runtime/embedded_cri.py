"""One CRI v1 RuntimeService on a unix socket, answering from pod sandboxes held in memory: the
container runtime of the benches, the chaos runner and the tests (`CriServer`), and the base of
`ipamd run --embedded`'s (`ipamd.runtime.embedded_runtime.EmbeddedCri`, which keeps its sandboxes in
a record of its own).

It speaks the same generated protocol as `ipamd.runtime.cri`: Version, ListPodSandbox (with CRI's
filter: ID, state, labels) and PodSandboxStatus (the pod's addresses, which repair rebuilds a lost
state file from). A `CriServer` holds the sandboxes its owner adds, stops and removes (`add`, `stop`,
`remove`), and serves the lifecycle calls kubelet makes (RunPodSandbox, StopPodSandbox,
RemovePodSandbox) on the same list.

The server runs in its owner's event loop (grpc.aio). Before it binds, a stale socket (nobody answers
on it) is replaced and a live one or a non-socket refused (`ipamd.unix_socket.clear_stale`).
`close()` stops it and removes the socket, and `start()` serves again on the same path with the
sandboxes kept, like a runtime restart. It can misbehave the ways a runtime does, for the chaos runner
and the tests: `unavailable` answers every call with UNAVAILABLE, `delay_s` answers late (past the
client's deadline). `calls` counts the calls received, per RPC name.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from types import TracebackType
from typing import Literal, Self, cast

import grpc
import grpc.aio

from ipamd.runtime._generated import cri_v1_pb2 as cri
from ipamd.runtime._generated import cri_v1_pb2_grpc as cri_grpc
from ipamd.unix_socket import clear_stale

logger = logging.getLogger(__name__)

_NS_PER_S = 1_000_000_000
_STATES = {"ready": cri.SANDBOX_READY, "notready": cri.SANDBOX_NOTREADY}
_add_servicer: Callable[[object, grpc.aio.Server], None] = (
    cri_grpc.add_RuntimeServiceServicer_to_server
)


def to_ns(seconds: float) -> int:
    """Seconds since the epoch as CRI's nanoseconds, exactly: the client's division gives back the
    same float."""
    return round(Fraction(seconds) * _NS_PER_S)


@dataclass
class CriSandbox:
    """One pod sandbox as the runtime lists it."""

    sandbox_id: str
    created_at_ns: int
    namespace: str = ""
    name: str = ""
    uid: str = ""
    state: int = cri.SANDBOX_READY
    """A `PodSandboxState` value; any other number plays a newer runtime's state."""
    attempt: int = 0
    addresses: tuple[str, ...] = ()
    """The pod addresses its network setup got (PodSandboxStatus: network)."""
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    runtime_handler: str = ""

    def to_message(self) -> cri.PodSandbox:
        return cri.PodSandbox(
            id=self.sandbox_id,
            metadata=cri.PodSandboxMetadata(
                name=self.name, uid=self.uid, namespace=self.namespace, attempt=self.attempt
            ),
            state=cast("cri.PodSandboxState", self.state),
            created_at=self.created_at_ns,
            labels=self.labels,
            annotations=self.annotations,
            runtime_handler=self.runtime_handler,
        )

    def matches(self, wanted: cri.PodSandboxFilter) -> bool:
        """CRI filter semantics: every set field must match (ID exactly, state, every label pair)."""
        if wanted.id and wanted.id != self.sandbox_id:
            return False
        if wanted.HasField("state") and wanted.state.state != self.state:
            return False
        return all(self.labels.get(key) == value for key, value in wanted.label_selector.items())


class CriServer:
    """Serves the sandboxes it holds as CRI on `socket_path`: `await start()`, `await close()`, or
    `async with`."""

    lifecycle = True
    """Whether kubelet's lifecycle calls (Run, Stop, RemovePodSandbox) change the sandboxes."""

    def __init__(
        self,
        socket_path: Path,
        *,
        runtime_name: str = "ipamd-embedded",
        runtime_version: str = "1.0.0",
    ) -> None:
        self.socket_path = socket_path
        self.runtime_name = runtime_name
        self.runtime_version = runtime_version
        self.sandboxes: dict[str, CriSandbox] = {}
        """The sandboxes by ID, in creation order."""
        self.unavailable = False
        """Answer every call with UNAVAILABLE."""
        self.delay_s = 0.0
        """Wait this long before answering any call."""
        self.calls: Counter[str] = Counter()
        """Calls received per RPC name (`ListPodSandbox`, ...), answered or not."""
        self._server: grpc.aio.Server | None = None

    @property
    def endpoint(self) -> str:
        """The socket as a CRI endpoint URL: `unix:///run/.../cri.sock`."""
        return f"unix://{self.socket_path}"

    @property
    def serving(self) -> bool:
        return self._server is not None

    async def start(self) -> None:
        """Serve on the socket (a stale one, nobody answering on it, is replaced). Raises
        `SocketPathError` when the path is taken, or OSError if the socket cannot be made."""
        if self._server is not None:
            raise RuntimeError("the CRI server is already serving")
        clear_stale(self.socket_path)
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        server = grpc.aio.server()
        _add_servicer(_Servicer(self), server)
        if server.add_insecure_port(f"unix:{self.socket_path}") == 0:
            raise OSError(f"cannot listen on {self.socket_path}")
        await server.start()
        self._server = server
        logger.info("cri.serving path=%s runtime=%s", self.socket_path, self.runtime_name)

    async def close(self) -> None:
        """Stop serving (calls in flight are cancelled) and remove the socket; the sandboxes stay.
        Idempotent."""
        server, self._server = self._server, None
        if server is None:
            return
        await server.stop(grace=None)
        # grpc's tasks for the cancelled calls may still be unwinding once `stop` returns (on a
        # busy machine, a loop turn or more later): wait for them, so none outlives it.
        unwinding = [t for t in asyncio.all_tasks() if t.get_name() == "rpc_task" and not t.done()]
        if unwinding:
            await asyncio.wait(unwinding, timeout=5.0)
        self.socket_path.unlink(missing_ok=True)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- the sandboxes -----------------------------------------------------------------------------

    def add(
        self,
        sandbox_id: str,
        namespace: str = "default",
        name: str = "",
        uid: str = "",
        created_at: float | None = None,
        state: Literal["ready", "notready"] = "ready",
        *,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        attempt: int = 0,
        addresses: tuple[str, ...] = (),
    ) -> CriSandbox:
        """A new sandbox; `created_at` in seconds since the epoch, now by default."""
        if sandbox_id in self.sandboxes:
            raise ValueError(f"sandbox {sandbox_id} exists")
        sandbox = CriSandbox(
            sandbox_id=sandbox_id,
            created_at_ns=time.time_ns() if created_at is None else to_ns(created_at),
            namespace=namespace,
            name=name or f"pod-{sandbox_id[:8]}",
            uid=uid or f"uid-{sandbox_id[:8]}",
            state=_STATES[state],
            attempt=attempt,
            addresses=addresses,
            labels=dict(labels or {}),
            annotations=dict(annotations or {}),
        )
        self.sandboxes[sandbox_id] = sandbox
        return sandbox

    def stop(self, sandbox_id: str) -> None:
        """The sandbox turns NOTREADY and stays listed (as after StopPodSandbox). KeyError if unknown."""
        self.sandboxes[sandbox_id].state = cri.SANDBOX_NOTREADY

    def remove(self, sandbox_id: str) -> None:
        """The sandbox is gone (as after RemovePodSandbox). Idempotent."""
        self.sandboxes.pop(sandbox_id, None)

    # -- what the calls are answered from ----------------------------------------------------------

    async def before_answer(self, rpc: str, context: grpc.aio.ServicerContext) -> None:
        """Before each call is answered (`rpc`: its CRI name): counted, delayed or refused."""
        self.calls[rpc] += 1
        if self.delay_s > 0:
            await asyncio.sleep(self.delay_s)
        if self.unavailable:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the runtime is unavailable")

    def listing(self) -> Iterable[CriSandbox] | None:
        """The sandboxes to list; None while there is nothing to list from yet (UNAVAILABLE)."""
        return self.sandboxes.values()

    def status_of(self, sandbox_id: str) -> CriSandbox | None:
        """The sandbox PodSandboxStatus describes; None: NOT_FOUND."""
        return self.sandboxes.get(sandbox_id)

    def _run(self, request: cri.RunPodSandboxRequest) -> str:
        sandbox_id = secrets.token_hex(32)
        metadata = request.config.metadata
        sandbox = self.add(
            sandbox_id,
            metadata.namespace,
            metadata.name,
            metadata.uid,
            labels=request.config.labels,
            annotations=request.config.annotations,
            attempt=metadata.attempt,
        )
        sandbox.runtime_handler = request.runtime_handler
        return sandbox_id


class _Servicer(cri_grpc.RuntimeServiceServicer):
    """The gRPC face of a `CriServer`; method names are CRI's."""

    def __init__(self, runtime: CriServer) -> None:
        self._runtime = runtime

    async def _listing(self, context: grpc.aio.ServicerContext) -> list[CriSandbox]:
        listing = self._runtime.listing()
        if listing is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the runtime is starting")
        return list(cast("Iterable[CriSandbox]", listing))

    async def _lifecycle(self, rpc: str, context: grpc.aio.ServicerContext) -> None:
        await self._runtime.before_answer(rpc, context)
        if not self._runtime.lifecycle:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{rpc} is not served here")

    async def Version(  # noqa: N802
        self, request: cri.VersionRequest, context: grpc.aio.ServicerContext
    ) -> cri.VersionResponse:
        await self._runtime.before_answer("Version", context)
        return cri.VersionResponse(
            version="0.1.0",
            runtime_name=self._runtime.runtime_name,
            runtime_version=self._runtime.runtime_version,
            runtime_api_version="v1",
        )

    async def ListPodSandbox(  # noqa: N802
        self, request: cri.ListPodSandboxRequest, context: grpc.aio.ServicerContext
    ) -> cri.ListPodSandboxResponse:
        await self._runtime.before_answer("ListPodSandbox", context)
        wanted = request.filter
        items = [s.to_message() for s in await self._listing(context) if s.matches(wanted)]
        return cri.ListPodSandboxResponse(items=items)

    async def PodSandboxStatus(  # noqa: N802
        self, request: cri.PodSandboxStatusRequest, context: grpc.aio.ServicerContext
    ) -> cri.PodSandboxStatusResponse:
        await self._runtime.before_answer("PodSandboxStatus", context)
        wanted = request.pod_sandbox_id
        found = self._runtime.status_of(wanted)
        if found is None:
            await self._listing(context)  # UNAVAILABLE while there is nothing to list from
            await context.abort(grpc.StatusCode.NOT_FOUND, f"sandbox {wanted}")
        sandbox = cast("CriSandbox", found)
        first, *extra = (*sandbox.addresses, "")
        network = cri.PodSandboxNetworkStatus(
            ip=first, additional_ips=[cri.PodIP(ip=ip) for ip in extra if ip]
        )
        status = cri.PodSandboxStatus(
            id=sandbox.sandbox_id,
            state=cast("cri.PodSandboxState", sandbox.state),
            created_at=sandbox.created_at_ns,
            network=network,
        )
        return cri.PodSandboxStatusResponse(status=status)

    async def RunPodSandbox(  # noqa: N802
        self, request: cri.RunPodSandboxRequest, context: grpc.aio.ServicerContext
    ) -> cri.RunPodSandboxResponse:
        await self._lifecycle("RunPodSandbox", context)
        return cri.RunPodSandboxResponse(pod_sandbox_id=self._runtime._run(request))

    async def StopPodSandbox(  # noqa: N802
        self, request: cri.StopPodSandboxRequest, context: grpc.aio.ServicerContext
    ) -> cri.StopPodSandboxResponse:
        await self._lifecycle("StopPodSandbox", context)
        if request.pod_sandbox_id not in self._runtime.sandboxes:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"sandbox {request.pod_sandbox_id}")
        self._runtime.stop(request.pod_sandbox_id)
        return cri.StopPodSandboxResponse()

    async def RemovePodSandbox(  # noqa: N802
        self, request: cri.RemovePodSandboxRequest, context: grpc.aio.ServicerContext
    ) -> cri.RemovePodSandboxResponse:
        await self._lifecycle("RemovePodSandbox", context)
        self._runtime.remove(request.pod_sandbox_id)
        return cri.RemovePodSandboxResponse()
