"""The CRI adapter: `GrpcCriRuntime` reads the container runtime's pod sandboxes over CRI v1 (gRPC on a
unix socket) and implements `RuntimeApi`.

Owns the gRPC channel, the per-call deadline, and two translations at the edge: CRI messages into
`Sandbox` values, and every gRPC failure into `RuntimeUnavailable`. It decides nothing: which sandbox is
gone is the leak GC's call (`ipamd.reconcile`), and a call that fails proves nothing. It never changes
the runtime (ipamd only reads sandboxes), and no grpc or protobuf type leaves this module.

Decisions:
- The channel is opened lazily by the first call, inside the running event loop (a grpc.aio channel is
  bound to the loop it was created in), never by the constructor.
- Every call carries a deadline (`timeout_s`, 5 s by default) and does not wait for the channel to be
  ready, so a missing socket fails at once instead of hanging until the deadline.
- After any failed call the channel is dropped and the next call dials afresh. A channel whose connect
  failed waits out gRPC's reconnect backoff (1 s doubling up to 2 min), failing every call meanwhile:
  after a containerd restart the leak GC would see the runtime as unreachable for minutes. Dialling a
  unix socket again costs about a millisecond. Channels use a private subchannel pool so that a new one
  does not inherit the old one's backoff.
- A sandbox state this code does not know (a newer runtime) is reported as `notready`: the sandbox
  exists, and existence is what the leak GC needs.

The protobuf and gRPC code is generated into `ipamd/runtime/_generated/` from ipamd's subset of the CRI
v1 API, `ipamd/runtime/proto/cri_v1.proto` (upstream names and field numbers, so wire-compatible with
containerd and CRI-O); regenerate with `ipamd/runtime/proto/generate.sh` (needs grpcio-tools, a dev
dependency) and commit the result.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any, Literal, Self

import grpc
import grpc.aio

from ipamd.runtime._generated import cri_v1_pb2 as cri
from ipamd.runtime._generated import cri_v1_pb2_grpc as cri_grpc
from ipamd.runtime.ports import RuntimeUnavailable, Sandbox

__all__ = ["DEFAULT_TIMEOUT_S", "GrpcCriRuntime", "grpc_target"]

DEFAULT_TIMEOUT_S = 5.0
"""Deadline of one CRI call, connect included. ListPodSandbox answers in well under a millisecond on a
healthy node; a runtime that needs seconds is overloaded, and the leak GC simply tries again later."""

_NS_PER_S = 1_000_000_000
_KUBELET_API_VERSION = "v1"
_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""The kubelet's limit: a listing of hundreds of sandboxes with their labels and annotations exceeds
gRPC's default of 4 MiB."""

_CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
    ("grpc.use_local_subchannel_pool", 1),
)

_runtime_stub: Callable[[grpc.aio.Channel], Any] = cri_grpc.RuntimeServiceStub
"""The generated client stub. The generated gRPC module carries no annotations; the messages do."""

_STATES: dict[int, Literal["ready", "notready"]] = {
    cri.SANDBOX_READY: "ready",
    cri.SANDBOX_NOTREADY: "notready",
}


def grpc_target(endpoint: str) -> str:
    """The gRPC target for a CRI endpoint: a socket path (`/run/containerd/containerd.sock`, as in
    `IPAMD_CRI_SOCKET`) or a unix URL (`unix:///run/containerd/containerd.sock`, as crictl takes it).
    Raises `ValueError` for anything else: CRI runtimes listen on unix sockets only."""
    if endpoint.startswith("unix:"):
        if endpoint in ("unix:", "unix://"):
            raise ValueError(f"CRI endpoint {endpoint!r} names no socket")
        return endpoint
    if not endpoint or "://" in endpoint:
        raise ValueError(f"CRI endpoint {endpoint!r} is neither a socket path nor a unix:// URL")
    return f"unix:{endpoint}"


def _to_sandbox(item: cri.PodSandbox) -> Sandbox:
    return Sandbox(
        sandbox_id=item.id,
        state=_STATES.get(item.state, "notready"),
        created_at=item.created_at / _NS_PER_S,
        namespace=item.metadata.namespace,
        name=item.metadata.name,
        uid=item.metadata.uid,
    )


class GrpcCriRuntime:
    """`RuntimeApi` over CRI v1 on a unix socket. Use as `async with GrpcCriRuntime(path) as runtime:`
    or call `close()`; calls after `close()` raise `RuntimeUnavailable`."""

    def __init__(self, endpoint: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self._target = grpc_target(endpoint)
        self._timeout_s = timeout_s
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None
        self._closed = False

    @property
    def target(self) -> str:
        """The gRPC target, e.g. `unix:///run/containerd/containerd.sock`."""
        return self._target

    async def list_sandboxes(self) -> tuple[Sandbox, ...]:
        """Every pod sandbox the runtime knows, ready or not (ListPodSandbox without a filter).
        Raises `RuntimeUnavailable`."""
        response: cri.ListPodSandboxResponse = await self._call(
            "ListPodSandbox", cri.ListPodSandboxRequest()
        )
        return tuple(_to_sandbox(item) for item in response.items)

    async def sandbox_addresses(self, sandbox_id: str) -> tuple[str, ...]:
        """The pod addresses the runtime recorded for a sandbox (PodSandboxStatus: network.ip and
        additional_ips), empty if it has none. Raises `RuntimeUnavailable`."""
        response: cri.PodSandboxStatusResponse = await self._call(
            "PodSandboxStatus", cri.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id)
        )
        network = response.status.network
        found = (network.ip, *(extra.ip for extra in network.additional_ips))
        return tuple(ip for ip in found if ip)

    async def version(self) -> str:
        """`<runtime_name> <runtime_version>`, e.g. `containerd v1.7.24`. Raises `RuntimeUnavailable`."""
        response: cri.VersionResponse = await self._call(
            "Version", cri.VersionRequest(version=_KUBELET_API_VERSION)
        )
        return " ".join(part for part in (response.runtime_name, response.runtime_version) if part)

    async def close(self) -> None:
        """Closes the channel, letting calls in flight finish within their deadline. Idempotent."""
        self._closed = True
        channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            await channel.close(grace=self._timeout_s)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _call(self, rpc: str, request: object) -> Any:
        if self._closed:
            raise RuntimeUnavailable(f"CRI {rpc} on {self._target}: client closed")
        if self._channel is None or self._stub is None:
            self._channel = grpc.aio.insecure_channel(self._target, options=_CHANNEL_OPTIONS)
            self._stub = _runtime_stub(self._channel)
        channel, stub = self._channel, self._stub
        try:
            return await getattr(stub, rpc)(request, timeout=self._timeout_s)
        except (grpc.RpcError, grpc.aio.BaseError) as err:
            await self._drop(channel)
            raise RuntimeUnavailable(f"CRI {rpc} on {self._target}: {_describe(err)}") from None

    async def _drop(self, failed: grpc.aio.Channel) -> None:
        """Forgets a channel after a failure so that the next call dials afresh; calls still in flight
        on it (their deadlines bound the wait) finish first. Only the first failure closes it."""
        channel = self._channel
        if channel is None or channel is not failed:
            return
        self._channel, self._stub = None, None
        await channel.close(grace=self._timeout_s)


def _describe(err: BaseException) -> str:
    if isinstance(err, grpc.aio.AioRpcError):
        return f"{err.code().name}: {err.details() or 'no details'}"
    return f"{type(err).__name__}: {err}"
