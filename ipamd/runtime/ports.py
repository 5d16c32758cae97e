"""The runtime port: the live pod sandboxes, read over CRI. The only evidence ipamd accepts that a pod
is gone; an unreachable runtime proves nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from ipamd.errors import IpamdError
from ipamd.wire import CODE_RUNTIME_UNAVAILABLE


class RuntimeUnavailable(IpamdError):
    """The runtime did not answer (socket missing, timeout, error status): nothing can be concluded.
    Through the API: 503 `runtime_unavailable`, retryable."""

    code = CODE_RUNTIME_UNAVAILABLE
    status = 503
    retryable = True


@dataclass(frozen=True, slots=True)
class Sandbox:
    sandbox_id: str
    """The CRI pod sandbox ID: what the runtime passes to CNI as CNI_CONTAINERID."""
    state: Literal["ready", "notready"]
    created_at: float
    """Seconds since the epoch."""
    namespace: str = ""
    name: str = ""
    uid: str = ""


class RuntimeApi(Protocol):
    async def list_sandboxes(self) -> tuple[Sandbox, ...]:
        """Every sandbox the runtime knows, ready or not (a stopped sandbox still holds its network
        until the runtime's DEL). Raises `RuntimeUnavailable`."""
        ...

    async def version(self) -> str:
        """The runtime's name and version, e.g. `containerd 1.7.24`. Raises `RuntimeUnavailable`."""
        ...


class SandboxAddresses(Protocol):
    async def sandbox_addresses(self, sandbox_id: str) -> tuple[str, ...]:
        """The pod addresses the runtime recorded for a sandbox; what repair rebuilds a lost state
        from. Raises `RuntimeUnavailable`."""
        ...
