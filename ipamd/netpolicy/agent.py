"""`GrpcPolicyAgent`: the client of aws-network-policy-agent's NPBackend (gRPC on its unix socket),
implementing `ipamd.netpolicy.ports.PolicyAgent`.

Owns the channel, the per-call deadline and the translation at the edge: every gRPC failure becomes
`AgentUnavailable`, an answer of `Success=false` becomes `AgentRefused`. No grpc or protobuf type
leaves this module. It decides nothing: whether to call is `ipamd.netpolicy.enforcement`'s.

Decisions (as `ipamd.runtime.cri` for the same reasons):
- The channel is opened by the first call, inside the running loop, never by the constructor.
- Every call carries a deadline (`timeout_s`, 3 s by default) and does not wait for the channel to
  be ready, so a missing socket fails at once; the ADD or DEL it serves waits no longer than that.
- After a failed call the channel is dropped and the next call dials afresh, on a private subchannel
  pool: an agent restarted by its DaemonSet answers the next pod, not after gRPC's reconnect backoff.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import grpc
import grpc.aio

from ipamd.model import PodRef
from ipamd.netpolicy._generated import rpc_pb2 as rpc
from ipamd.netpolicy._generated import rpc_pb2_grpc as rpc_grpc
from ipamd.netpolicy.ports import AgentRefused, AgentUnavailable

__all__ = ["DEFAULT_TIMEOUT_S", "GrpcPolicyAgent"]

DEFAULT_TIMEOUT_S = 3.0
"""Deadline of one call to the agent, connect included. The agent answers from memory once its
programs are loaded; VPC CNI's plugin gives the connect 5 s, and the ADD it serves has a budget."""

_CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (("grpc.use_local_subchannel_pool", 1),)

_np_stub: Callable[[grpc.aio.Channel], Any] = rpc_grpc.NPBackendStub
"""The generated client stub. The generated gRPC module carries no annotations; the messages do."""


class GrpcPolicyAgent:
    """`PolicyAgent` over NPBackend on a unix socket path. `close()` when done."""

    def __init__(self, socket_path: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.socket_path = socket_path
        self._target = f"unix:{socket_path}"
        self._timeout_s = timeout_s
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None

    def present(self) -> bool:
        """Whether an agent listens on the socket. A socket file nobody listens on is none: the
        agent removes a stale socket when it starts, not when it stops, so aws-node's agent leaves
        one behind when aws-node leaves the node. One non-blocking connect, closed at once (tens of
        microseconds); a full backlog (EAGAIN) is a listener."""
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.setblocking(False)
            probe.connect(self.socket_path)
        except BlockingIOError:
            return True
        except OSError:
            return False  # no file, not a socket, or nobody listening (ECONNREFUSED)
        finally:
            probe.close()
        return True

    async def enforce(self, pod: PodRef, mode: str, interfaces: int) -> None:
        request = rpc.EnforceNpRequest(
            K8S_POD_NAME=pod.name,
            K8S_POD_NAMESPACE=pod.namespace,
            NETWORK_POLICY_MODE=mode,
            InterfaceCount=interfaces,
        )
        reply: rpc.EnforceNpReply = await self._call("EnforceNpToPod", request)
        if not reply.Success:
            raise AgentRefused(f"EnforceNpToPod on {self._target} answered Success=false")

    async def delete(self, pod: PodRef) -> None:
        request = rpc.DeleteNpRequest(K8S_POD_NAME=pod.name, K8S_POD_NAMESPACE=pod.namespace)
        reply: rpc.DeleteNpReply = await self._call("DeletePodNp", request)
        if not reply.Success:
            raise AgentRefused(f"DeletePodNp on {self._target} answered Success=false")

    async def close(self) -> None:
        """Closes the channel, letting calls in flight finish within their deadline. Idempotent."""
        channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            await channel.close(grace=self._timeout_s)

    async def _call(self, method: str, request: object) -> Any:
        if self._channel is None or self._stub is None:
            self._channel = grpc.aio.insecure_channel(self._target, options=_CHANNEL_OPTIONS)
            self._stub = _np_stub(self._channel)
        channel, stub = self._channel, self._stub
        try:
            return await getattr(stub, method)(request, timeout=self._timeout_s)
        except (grpc.RpcError, grpc.aio.BaseError) as err:
            await self._drop(channel)
            raise AgentUnavailable(f"{method} on {self._target}: {_describe(err)}") from None

    async def _drop(self, failed: grpc.aio.Channel) -> None:
        channel = self._channel
        if channel is None or channel is not failed:
            return  # another call's failure dropped it already
        self._channel, self._stub = None, None
        await channel.close(grace=self._timeout_s)


def _describe(err: BaseException) -> str:
    if isinstance(err, grpc.aio.AioRpcError):
        return f"{err.code().name}: {err.details() or 'no details'}"
    return f"{type(err).__name__}: {err}"
