"""A fake aws-network-policy-agent: a real gRPC server (`rpc.NPBackend`, VPC CNI's contract) on a unix
socket, recording every request and answering as the test says.

`FakePolicyAgent` runs on the caller's event loop (`async with FakePolicyAgent(path) as agent:`);
`ThreadedPolicyAgent` runs one on a thread of its own, for tests that drive a daemon process and do
not run a loop (integration, end-to-end, chaos). Each answer is one of:
- `ok`: Success=true;
- `refuse`: Success=false (the agent's "could not attach");
- `error`: the call fails with gRPC status UNAVAILABLE.
`on_enforce`, when set, is called with each EnforceNpToPod before it is answered (on the server's
loop): an end-to-end test checks there that the pod's host interface exists; a False answer makes
the reply Success=false. `on_delete` likewise sees each DeletePodNp (what still exists then).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Literal, Self

import grpc
import grpc.aio

from ipamd.netpolicy._generated import rpc_pb2 as rpc
from ipamd.netpolicy._generated import rpc_pb2_grpc as rpc_grpc

Answer = Literal["ok", "refuse", "error"]

_add_servicer: Callable[[object, grpc.aio.Server], None] = rpc_grpc.add_NPBackendServicer_to_server


@dataclass(frozen=True, slots=True)
class EnforceCall:
    name: str
    namespace: str
    mode: str
    interfaces: int


@dataclass(frozen=True, slots=True)
class DeleteCall:
    name: str
    namespace: str


@dataclass
class AgentScript:
    """What the agent answers, and what it was asked (in order)."""

    enforce_answer: Answer = "ok"
    delete_answer: Answer = "ok"
    on_enforce: Callable[[EnforceCall], bool] | None = None
    on_delete: Callable[[DeleteCall], None] | None = None
    enforced: list[EnforceCall] = field(default_factory=list)
    deleted: list[DeleteCall] = field(default_factory=list)


class _Servicer(rpc_grpc.NPBackendServicer):
    def __init__(self, script: AgentScript) -> None:
        self._script = script

    async def EnforceNpToPod(  # noqa: N802
        self, request: rpc.EnforceNpRequest, context: grpc.aio.ServicerContext
    ) -> rpc.EnforceNpReply:
        call = EnforceCall(
            request.K8S_POD_NAME,
            request.K8S_POD_NAMESPACE,
            request.NETWORK_POLICY_MODE,
            request.InterfaceCount,
        )
        self._script.enforced.append(call)
        answer = self._script.enforce_answer
        if answer == "error":
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the fake agent fails this call")
        hook = self._script.on_enforce
        accepted = hook(call) if hook is not None else True
        return rpc.EnforceNpReply(Success=answer == "ok" and accepted)

    async def DeletePodNp(  # noqa: N802
        self, request: rpc.DeleteNpRequest, context: grpc.aio.ServicerContext
    ) -> rpc.DeleteNpReply:
        call = DeleteCall(request.K8S_POD_NAME, request.K8S_POD_NAMESPACE)
        self._script.deleted.append(call)
        answer = self._script.delete_answer
        if answer == "error":
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the fake agent fails this call")
        if self._script.on_delete is not None:
            self._script.on_delete(call)
        return rpc.DeleteNpReply(Success=answer == "ok")


class FakePolicyAgent:
    """NPBackend on `socket_path` (its directory is made), on the running loop."""

    def __init__(self, socket_path: Path, script: AgentScript | None = None) -> None:
        self.socket_path = socket_path
        self.script = script or AgentScript()
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        server = grpc.aio.server()
        _add_servicer(_Servicer(self.script), server)
        if server.add_insecure_port(f"unix:{self.socket_path}") == 0:
            raise OSError(f"cannot listen on {self.socket_path}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        """Stop answering and remove the socket, as an agent that went away."""
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace=None)
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
        await self.stop()


class ThreadedPolicyAgent:
    """A `FakePolicyAgent` on a thread with its own loop: `with ThreadedPolicyAgent(path) as a:`.
    The script's lists are appended to on that thread; read them once the call they record has
    been answered (the daemon's answer comes after the agent's)."""

    def __init__(self, socket_path: Path, script: AgentScript | None = None) -> None:
        self.script = script or AgentScript()
        self.socket_path = socket_path
        self._loop = asyncio.new_event_loop()
        self._agent = FakePolicyAgent(socket_path, self.script)
        self._thread = threading.Thread(target=self._loop.run_forever, name="fake-np-agent")

    def __enter__(self) -> Self:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._agent.start(), self._loop).result(timeout=10)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self._agent.stop(), self._loop).result(timeout=10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()
