"""The network-policy agent as ipamd sees it: the port, the facts ipamd tells the agent, and the typed
errors the gRPC edge raises.

Nothing here speaks gRPC: the adapter (`ipamd.netpolicy.agent`) turns every gRPC failure into
`AgentUnavailable` and an answer of `Success=false` into `AgentRefused`, so no grpc type crosses into
the rest of the daemon.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ipamd.errors import IpamdError
from ipamd.model import PodRef
from ipamd.wire import CODE_NETWORK_POLICY_REFUSED, CODE_NETWORK_POLICY_UNAVAILABLE


class AgentError(Exception):
    """The agent did not do what it was asked; `str()` names its answer."""


class AgentRefused(AgentError):
    """The agent answered, with `Success=false`."""


class AgentUnavailable(AgentError):
    """The agent did not answer: its socket is missing, the call timed out, or it failed."""


class NetworkPolicyRefused(IpamdError):
    """ADD's policy call: the agent refused the pod or could not be reached, so the allocation was
    retracted. Through the API: 502 `network_policy_refused`, not retryable (the plugin fails the
    ADD; the runtime's next ADD starts afresh)."""

    code = CODE_NETWORK_POLICY_REFUSED
    status = 502


class NetworkPolicyUnavailable(IpamdError):
    """DEL: the agent could not be told the pod goes away, so nothing was released. Through the API:
    503 `network_policy_unavailable`, retryable (the kubelet retries the DEL)."""

    code = CODE_NETWORK_POLICY_UNAVAILABLE
    status = 503
    retryable = True


class PolicyAgent(Protocol):
    """aws-network-policy-agent's NPBackend. Every call has a deadline."""

    def present(self) -> bool:
        """Whether the agent listens on its socket (with the mode unset, ipamd calls it only then);
        a socket file left by a stopped agent is no agent."""
        ...

    async def enforce(self, pod: PodRef, mode: str, interfaces: int) -> None:
        """EnforceNpToPod: the pod's interfaces exist; attach its policy. Raises `AgentError`."""
        ...

    async def delete(self, pod: PodRef) -> None:
        """DeletePodNp: the pod goes away. Raises `AgentError`."""
        ...


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """What ipamd answers the agent's GetNetworkPolicyConfigs with."""

    network_policy_mode: str
    """"standard" or "strict": the only modes the agent accepts."""
    node_ipv4: str
    """The instance's primary private IPv4 address."""
    instance_id: str
    region: str
    multi_nic_enabled: bool = False
    """ipamd gives every pod one network card's address."""
    node_ipv6: str = ""
    """ipamd is IPv4 only."""
