"""`EmbeddedCri`: the container runtime of `ipamd run --embedded`, a CRI v1 server on a unix socket.

On a laptop there is no containerd, so without this the runtime leak GC and `ipamctl repair` could
never be tried. Its pod sandboxes are whatever `source` lists — `ipamd.main` passes the allocations
ipamd holds, one sandbox per container ID — less every sandbox ID written in the *gone file* (one ID a
line, e.g. `echo demo-1a2b >> .run/state/embedded-cri-gone`): a pod that disappeared behind ipamd's
back, whose DEL never came. Two listings later, and once older than IPAMD_LEAK_GRACE, leak GC
releases it; `ipamctl repair` shows it at once.

It answers Version, ListPodSandbox (with CRI's filter) and PodSandboxStatus (the pod's addresses,
which repair rebuilds a lost state file from); every other RPC is UNIMPLEMENTED. Until `source` is set
every call answers UNAVAILABLE, which proves nothing to ipamd. It never writes the gone file and never
changes ipamd's state: it only reads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import grpc
import grpc.aio

from ipamd.runtime._generated import cri_v1_pb2 as cri
from ipamd.runtime._generated import cri_v1_pb2_grpc as cri_grpc
from ipamd.wire.unix_socket import SocketInUse, is_stale

logger = logging.getLogger(__name__)

_NS_PER_S = 1_000_000_000
_add_servicer: Callable[[object, grpc.aio.Server], None] = (
    cri_grpc.add_RuntimeServiceServicer_to_server
)


class CriSocketBusy(Exception):
    """The socket path is taken: another process answers on it, or it is not a socket."""


@dataclass(frozen=True, slots=True)
class LiveSandbox:
    """One pod sandbox as the embedded runtime lists it."""

    sandbox_id: str
    created_at: float
    """Seconds since the epoch."""
    namespace: str = ""
    name: str = ""
    uid: str = ""
    addresses: tuple[str, ...] = ()


SandboxSource = Callable[[], Iterable[LiveSandbox]]


class EmbeddedCri:
    """Serves `source()` less the gone file as CRI; start with `await start()`, stop with `close()`."""

    def __init__(self, socket_path: Path, gone_file: Path) -> None:
        self.socket_path = socket_path
        self.gone_file = gone_file
        self.source: SandboxSource | None = None
        """Set once the daemon is built; until then every call answers UNAVAILABLE."""
        self._server: grpc.aio.Server | None = None

    @property
    def endpoint(self) -> str:
        return f"unix://{self.socket_path}"

    async def start(self) -> None:
        """Serve on the socket (a stale one, nobody answering on it, is replaced). Raises
        `CriSocketBusy`, or OSError if the socket cannot be made."""
        try:
            if is_stale(self.socket_path):
                self.socket_path.unlink(missing_ok=True)
        except SocketInUse as err:
            raise CriSocketBusy(str(err)) from err
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        server = grpc.aio.server()
        _add_servicer(_Servicer(self), server)
        if server.add_insecure_port(f"unix:{self.socket_path}") == 0:
            raise OSError(f"cannot listen on {self.socket_path}")
        await server.start()
        self._server = server
        logger.info("embedded.cri_serving path=%s gone_file=%s", self.socket_path, self.gone_file)

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace=None)
            self.socket_path.unlink(missing_ok=True)

    def gone(self) -> frozenset[str]:
        """The sandbox IDs in the gone file (none if it is missing or unreadable)."""
        try:
            text = self.gone_file.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return frozenset()
        return frozenset(line.strip() for line in text.splitlines() if line.strip())

    def listing(self) -> list[LiveSandbox] | None:
        """The live sandboxes, or None while there is no source yet."""
        if self.source is None:
            return None
        gone = self.gone()
        return [s for s in self.source() if s.sandbox_id not in gone]


def _message(sandbox: LiveSandbox) -> cri.PodSandbox:
    return cri.PodSandbox(
        id=sandbox.sandbox_id,
        metadata=cri.PodSandboxMetadata(
            name=sandbox.name, uid=sandbox.uid, namespace=sandbox.namespace
        ),
        state=cri.SANDBOX_READY,
        created_at=int(sandbox.created_at * _NS_PER_S),
    )


def _matches(sandbox: LiveSandbox, wanted: cri.PodSandboxFilter) -> bool:
    """CRI filter semantics: a set ID must match; every sandbox here is READY and has no labels."""
    if wanted.id and wanted.id != sandbox.sandbox_id:
        return False
    if wanted.HasField("state") and wanted.state.state != cri.SANDBOX_READY:
        return False
    return not wanted.label_selector


class _Servicer(cri_grpc.RuntimeServiceServicer):
    """The gRPC face of an `EmbeddedCri`; method names are CRI's."""

    def __init__(self, runtime: EmbeddedCri) -> None:
        self._runtime = runtime

    async def _listing(self, context: grpc.aio.ServicerContext) -> list[LiveSandbox]:
        listing = self._runtime.listing()
        if listing is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the embedded runtime is starting")
        return cast("list[LiveSandbox]", listing)

    async def Version(  # noqa: N802
        self, request: cri.VersionRequest, context: grpc.aio.ServicerContext
    ) -> cri.VersionResponse:
        return cri.VersionResponse(
            version="0.1.0",
            runtime_name="ipamd-embedded",
            runtime_version="1.0.0",
            runtime_api_version="v1",
        )

    async def ListPodSandbox(  # noqa: N802
        self, request: cri.ListPodSandboxRequest, context: grpc.aio.ServicerContext
    ) -> cri.ListPodSandboxResponse:
        items = [_message(s) for s in await self._listing(context) if _matches(s, request.filter)]
        return cri.ListPodSandboxResponse(items=items)

    async def PodSandboxStatus(  # noqa: N802
        self, request: cri.PodSandboxStatusRequest, context: grpc.aio.ServicerContext
    ) -> cri.PodSandboxStatusResponse:
        wanted = request.pod_sandbox_id
        found = next((s for s in await self._listing(context) if s.sandbox_id == wanted), None)
        if found is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"sandbox {wanted}")
        sandbox = cast("LiveSandbox", found)
        first, *extra = (*sandbox.addresses, "")
        network = cri.PodSandboxNetworkStatus(
            ip=first, additional_ips=[cri.PodIP(ip=ip) for ip in extra if ip]
        )
        status = cri.PodSandboxStatus(
            id=sandbox.sandbox_id,
            state=cri.SANDBOX_READY,
            created_at=int(sandbox.created_at * _NS_PER_S),
            network=network,
        )
        return cri.PodSandboxStatusResponse(status=status)
