"""When a pod's ADD and DEL involve the network-policy agent, and what a failed call undoes.

NETWORK_POLICY_ENFORCING_MODE decides whether enforcement applies:
- unset: only while an agent listens on its socket (a cluster that never installed the agent loses
  nothing, and one that did gets its pods enforced without a setting; a socket file left by an
  agent that stopped, as aws-node's does when aws-node leaves the node, counts as no agent);
- `none`: never;
- `standard` or `strict`: always, so an unreachable agent fails the pod's ADD rather than leaving
  it running without its policy.
The agent is told `standard` unless `strict` was set: those are the only modes it accepts.

ADD: the allocation's answer carries the mode (`mode_for`) when enforcement applies and the pod is
named; the plugin makes the pod's interface and then asks for the call (`enforce`). If the agent
refuses or cannot be reached, the allocation is retracted through `Engine.retract` (no delete intent,
no cooldown: no pod ever used the address), which undoes it only if it is still the same allocation,
so a DEL of the same key that got there first keeps its release and its intent.

DEL: before anything is released the agent is told the pod goes away (`forget`); if it cannot be
told, nothing is released and the DEL fails retryably, as VPC CNI's kubelet retries it. Releasing
first would hand the address to the next pod while the agent still holds the old pod's state.

It owns no gRPC (the port is `ipamd.netpolicy.ports.PolicyAgent`) and never changes the engine but
through `retract`.
"""

from __future__ import annotations

import logging
from collections import Counter

from datastore.records import AllocationKey, AllocationRecord
from ipamd.engine.engine import Engine
from ipamd.model import PodRef
from ipamd.netpolicy.ports import (
    AgentError,
    AgentRefused,
    NetworkPolicyRefused,
    NetworkPolicyUnavailable,
    PolicyAgent,
)

logger = logging.getLogger(__name__)

STANDARD = "standard"
STRICT = "strict"
NONE = "none"

OK = "ok"
REFUSED = "refused"
UNAVAILABLE = "unavailable"
"""The outcomes of one call to the agent, as `NetworkPolicy.calls` counts them."""


def agent_mode(configured: str) -> str:
    """The mode the agent is told, for enforcement and in GetNetworkPolicyConfigs: `strict` if so
    configured, else `standard` (the agent refuses any other)."""
    return STRICT if configured == STRICT else STANDARD


def _pod(record: AllocationRecord) -> PodRef | None:
    if not record.pod_name or not record.pod_namespace:
        return None  # not a Kubernetes pod (no CNI_ARGS): the agent knows nothing of it
    return PodRef(record.pod_namespace, record.pod_name, record.pod_uid)


class NetworkPolicy:
    """The agent's part in ADD and DEL, under the configured mode."""

    def __init__(self, engine: Engine, agent: PolicyAgent, configured_mode: str) -> None:
        self._engine = engine
        self._agent = agent
        self.configured_mode = configured_mode
        self.mode = agent_mode(configured_mode)
        self.calls: Counter[tuple[str, str]] = Counter()
        """(call, outcome) → calls: `enforce` or `delete`; `ok`, `refused` or `unavailable`."""

    def applies(self) -> bool:
        """Whether pods are enforced now (the mode, and with it unset, an agent on its socket)."""
        if self.configured_mode == NONE:
            return False
        if self.configured_mode == "":
            return self._agent.present()
        return True

    def mode_for(self, record: AllocationRecord) -> str | None:
        """The ADD answer's `network_policy`: the mode when the plugin must ask for the call."""
        return self.mode if _pod(record) is not None and self.applies() else None

    async def enforce(self, record: AllocationRecord, interfaces: int) -> None:
        """The pod's interfaces exist: EnforceNpToPod. Raises `NetworkPolicyRefused` once the
        allocation is retracted (`StoreWriteFailed` if the retraction could not be made durable)."""
        pod = _pod(record)
        if pod is None or not self.applies():
            return
        try:
            await self._agent.enforce(pod, self.mode, interfaces)
        except AgentError as err:
            self.calls["enforce", _outcome(err)] += 1
            retracted = await self._engine.retract(record)
            logger.warning(
                "netpolicy.enforce_failed namespace=%s name=%s container_id=%s retracted=%s "
                "error=%s",
                pod.namespace,
                pod.name,
                record.key.container_id,
                retracted,
                err,
            )
            raise NetworkPolicyRefused(
                f"the network-policy agent did not enforce pod {pod.namespace}/{pod.name}: {err}"
            ) from err
        self.calls["enforce", OK] += 1

    async def forget(self, key: AllocationKey) -> None:
        """Before DEL releases: DeletePodNp for each pod the container's allocations name. Raises
        `NetworkPolicyUnavailable` when the agent could not be told."""
        if not self.applies():
            return
        records = self._engine.state.allocations_of(key.container_id)
        pods = dict.fromkeys(p for r in records if (p := _pod(r)) is not None)
        for pod in pods:
            try:
                await self._agent.delete(pod)
            except AgentError as err:
                self.calls["delete", _outcome(err)] += 1
                logger.warning(
                    "netpolicy.delete_failed namespace=%s name=%s container_id=%s error=%s",
                    pod.namespace,
                    pod.name,
                    key.container_id,
                    err,
                )
                raise NetworkPolicyUnavailable(
                    f"the network-policy agent could not be told pod {pod.namespace}/{pod.name} "
                    f"goes away, so nothing was released: {err}"
                ) from err
            self.calls["delete", OK] += 1


def _outcome(err: AgentError) -> str:
    return REFUSED if isinstance(err, AgentRefused) else UNAVAILABLE
