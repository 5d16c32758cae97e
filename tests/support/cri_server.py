"""`FakeCriServer`: a real gRPC CRI v1 server on a unix socket, the runtime double of the tests.

It speaks the same generated protocol as `ipamd.runtime.cri` (Version, ListPodSandbox with its filter,
RunPodSandbox, StopPodSandbox, RemovePodSandbox) from an in-memory list of sandboxes that the test
controls directly (`add`, `stop`, `remove`, `hide`) or over gRPC, like kubelet would. Knobs make it
misbehave the ways a runtime does: `unavailable` answers every call with UNAVAILABLE, `delay_s` answers
late (past the client's deadline), `hide(id, listings)` leaves a sandbox out of the next listings (a
sandbox the runtime does not list yet, S14). `calls` counts the calls received, per RPC name.

It runs in the test's event loop (grpc.aio, no thread pool) on a socket in a private temp directory
with a short path (unix socket paths are limited to 107 bytes, pytest's tmp_path can be longer).
`shutdown()` and `start()` restart it on the same path with its sandboxes kept, like a runtime restart.

What each scenario replays, and which tests prove it: docs/failure-scenarios.md.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self, cast

import grpc
import grpc.aio

from ipamd.runtime._generated import cri_v1_pb2 as cri
from ipamd.runtime._generated import cri_v1_pb2_grpc as cri_grpc

_NS_PER_S = 1_000_000_000
_STATES = {"ready": cri.SANDBOX_READY, "notready": cri.SANDBOX_NOTREADY}

# The generated gRPC module carries no annotations (the messages do): typed names for what we use.
runtime_stub: Callable[[grpc.aio.Channel], Any] = cri_grpc.RuntimeServiceStub
"""A CRI client stub on a channel, for tests that drive the double the way kubelet or crictl would."""
_add_servicer: Callable[[object, grpc.aio.Server], None] = (
    cri_grpc.add_RuntimeServiceServicer_to_server
)


@dataclass
class FakeSandbox:
    """One sandbox as the fake runtime holds it."""

    sandbox_id: str
    namespace: str
    name: str
    uid: str
    created_at_ns: int
    state: int
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
        """CRI filter semantics: every set field must match (id exactly, state, every label pair)."""
        if wanted.id and wanted.id != self.sandbox_id:
            return False
        if wanted.HasField("state") and wanted.state.state != self.state:
            return False
        return all(self.labels.get(key) == value for key, value in wanted.label_selector.items())


class FakeCriServer:
    """A CRI runtime double serving a test-controlled list of sandboxes over a unix socket."""

    def __init__(
        self,
        socket_path: str | Path | None = None,
        *,
        runtime_name: str = "fakecri",
        runtime_version: str = "1.0.0",
    ) -> None:
        self._path = Path(socket_path) if socket_path is not None else None
        self._owned_dir: Path | None = None
        self._server: grpc.aio.Server | None = None
        self.runtime_name = runtime_name
        self.runtime_version = runtime_version
        self.sandboxes: dict[str, FakeSandbox] = {}
        """The sandboxes by ID, in creation order."""
        self.unavailable = False
        """Answer every call with UNAVAILABLE."""
        self.delay_s = 0.0
        """Wait this long before answering any call."""
        self.calls: Counter[str] = Counter()
        """Calls received per RPC name (`ListPodSandbox`, ...), answered or not."""
        self._hidden: dict[str, int] = {}

    # Lifecycle.

    @property
    def socket_path(self) -> Path:
        if self._path is None:
            raise RuntimeError("FakeCriServer has no socket before start()")
        return self._path

    @property
    def endpoint(self) -> str:
        """The socket as a CRI endpoint URL: `unix:///tmp/.../cri.sock`."""
        return f"unix://{self.socket_path}"

    @property
    def serving(self) -> bool:
        return self._server is not None

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("FakeCriServer already started")
        if self._path is None:
            self._owned_dir = Path(tempfile.mkdtemp(prefix="ipamd-cri-"))
            self._path = self._owned_dir / "cri.sock"
        server = grpc.aio.server()
        _add_servicer(_Servicer(self), server)
        server.add_insecure_port(f"unix:{self._path}")
        await server.start()
        self._server = server

    async def shutdown(self) -> None:
        """Stops serving (calls in flight are cancelled) and removes the socket; the sandboxes stay."""
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace=None)
            # grpc's tasks for the cancelled calls may still be unwinding once `stop` returns (on
            # a busy machine, a loop turn or more later): wait for them, so none outlives it.
            unwinding = [
                t for t in asyncio.all_tasks() if t.get_name() == "rpc_task" and not t.done()
            ]
            if unwinding:
                await asyncio.wait(unwinding, timeout=5.0)
        if self._path is not None:
            self._path.unlink(missing_ok=True)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.shutdown()
        if self._owned_dir is not None:
            shutil.rmtree(self._owned_dir, ignore_errors=True)

    # The test's controls.

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
    ) -> FakeSandbox:
        """Adds a sandbox; `created_at` in seconds since the epoch, now by default."""
        if sandbox_id in self.sandboxes:
            raise ValueError(f"sandbox {sandbox_id} exists")
        # Exact, so that the client's ns -> s division gives back the same float.
        created_ns = (
            time.time_ns() if created_at is None else round(Fraction(created_at) * _NS_PER_S)
        )
        sandbox = FakeSandbox(
            sandbox_id=sandbox_id,
            namespace=namespace,
            name=name or f"pod-{sandbox_id[:8]}",
            uid=uid or f"uid-{sandbox_id[:8]}",
            created_at_ns=created_ns,
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
        self._hidden.pop(sandbox_id, None)

    def hide(self, sandbox_id: str, listings: int = 1) -> None:
        """Leaves the sandbox out of the next `listings` answered ListPodSandbox calls."""
        if listings > 0:
            self._hidden[sandbox_id] = listings

    # What the servicer does.

    async def _answer(self, context: grpc.aio.ServicerContext, rpc: str) -> None:
        self.calls[rpc] += 1
        if self.delay_s > 0:
            await asyncio.sleep(self.delay_s)
        if self.unavailable:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "fake runtime unavailable")

    def _listing(self, wanted: cri.PodSandboxFilter) -> list[cri.PodSandbox]:
        items = [
            sandbox.to_message()
            for sandbox in self.sandboxes.values()
            if sandbox.sandbox_id not in self._hidden and sandbox.matches(wanted)
        ]
        for sandbox_id, left in list(self._hidden.items()):
            if left <= 1:
                del self._hidden[sandbox_id]
            else:
                self._hidden[sandbox_id] = left - 1
        return items

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
    """The gRPC face of a `FakeCriServer`; method names are CRI's."""

    def __init__(self, fake: FakeCriServer) -> None:
        self._fake = fake

    async def Version(  # noqa: N802
        self, request: cri.VersionRequest, context: grpc.aio.ServicerContext
    ) -> cri.VersionResponse:
        await self._fake._answer(context, "Version")
        return cri.VersionResponse(
            version="0.1.0",
            runtime_name=self._fake.runtime_name,
            runtime_version=self._fake.runtime_version,
            runtime_api_version="v1",
        )

    async def ListPodSandbox(  # noqa: N802
        self, request: cri.ListPodSandboxRequest, context: grpc.aio.ServicerContext
    ) -> cri.ListPodSandboxResponse:
        await self._fake._answer(context, "ListPodSandbox")
        return cri.ListPodSandboxResponse(items=self._fake._listing(request.filter))

    async def PodSandboxStatus(  # noqa: N802
        self, request: cri.PodSandboxStatusRequest, context: grpc.aio.ServicerContext
    ) -> cri.PodSandboxStatusResponse:
        await self._fake._answer(context, "PodSandboxStatus")
        sandbox = self._fake.sandboxes.get(request.pod_sandbox_id)
        if sandbox is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"sandbox {request.pod_sandbox_id}")
        assert sandbox is not None
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
        await self._fake._answer(context, "RunPodSandbox")
        return cri.RunPodSandboxResponse(pod_sandbox_id=self._fake._run(request))

    async def StopPodSandbox(  # noqa: N802
        self, request: cri.StopPodSandboxRequest, context: grpc.aio.ServicerContext
    ) -> cri.StopPodSandboxResponse:
        await self._fake._answer(context, "StopPodSandbox")
        if request.pod_sandbox_id not in self._fake.sandboxes:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"sandbox {request.pod_sandbox_id}")
        self._fake.stop(request.pod_sandbox_id)
        return cri.StopPodSandboxResponse()

    async def RemovePodSandbox(  # noqa: N802
        self, request: cri.RemovePodSandboxRequest, context: grpc.aio.ServicerContext
    ) -> cri.RemovePodSandboxResponse:
        await self._fake._answer(context, "RemovePodSandbox")
        self._fake.remove(request.pod_sandbox_id)
        return cri.RemovePodSandboxResponse()
