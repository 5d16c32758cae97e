"""What ipamd reads and writes of its own node in the Kubernetes API, with VPC CNI's meanings.

- **Which ENIConfig** (`eniconfig_name`, VPC CNI `pkg/eniconfig/eniconfig.go`,
  `GetNodeSpecificENIConfigName`): the node's label `vpc.amazonaws.com/externalEniConfig`, else its
  annotation ENI_CONFIG_ANNOTATION_DEF, else its label ENI_CONFIG_LABEL_DEF (both by default
  `k8s.amazonaws.com/eniConfig`), else `default`; the ENIConfig of that name
  (`crd.k8s.amazonaws.com/v1alpha1`) gives new ENIs their subnet and security groups.
- **Max pods**: the Node's `status.capacity.pods` when no kubelet config file says it.
- **The startup taint** (`remove_taint`): removed from this node alone, with a JSON patch whose
  `test` op makes it remove exactly the taint read, never another (a taint changed meanwhile fails
  the test, and it is read again).
- **Pod IPs** (`annotate_pod`, ANNOTATE_POD_IP; VPC CNI `pkg/ipamd/ipamd.go`, `AnnotatePod`):
  `vpc.amazonaws.com/pod-ips` set to the pod's first address on ADD, and on DEL set to "" when it
  still names the address released; a pod already gone is no failure.

Every object named here is this node's or one of its pods': nothing cluster-wide is read.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from ipamd.config.eniconfig import DEFAULT_ENICONFIG_KEY, EniConfig
from ipamd.config.kinds import Taint
from ipamd.kube.client import JSON_PATCH, KubeApi, KubeRefused

EXTERNAL_ENICONFIG_LABEL = "vpc.amazonaws.com/externalEniConfig"
DEFAULT_ENICONFIG = "default"
POD_IPS = "vpc.amazonaws.com/pod-ips"
ENICONFIGS = "/apis/crd.k8s.amazonaws.com/v1alpha1/eniconfigs"


def eniconfig_name(node: dict[str, Any], annotation_def: str, label_def: str) -> str:
    """The ENIConfig this node uses, by VPC CNI's order of precedence."""
    meta = node.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    for source, key in (
        (labels, EXTERNAL_ENICONFIG_LABEL),
        (annotations, annotation_def or DEFAULT_ENICONFIG_KEY),
        (labels, label_def or DEFAULT_ENICONFIG_KEY),
    ):
        value = source.get(key)
        if isinstance(value, str):
            return value
    return DEFAULT_ENICONFIG


def parse_eniconfig(name: str, doc: dict[str, Any]) -> EniConfig:
    """What the ENIConfig resource `doc` gives new ENIs; ValueError when it has no subnet."""
    spec = doc.get("spec") or {}
    subnet = spec.get("subnet")
    if not isinstance(subnet, str) or not subnet:
        raise ValueError(f"ENIConfig {name!r} has no spec.subnet")
    groups = tuple(g for g in spec.get("securityGroups") or () if isinstance(g, str))
    return EniConfig(name, subnet, groups)


def capacity_pods(node: dict[str, Any]) -> int | None:
    """The Node's `status.capacity.pods` (None when it has none that is a number)."""
    pods = ((node.get("status") or {}).get("capacity") or {}).get("pods")
    try:
        return int(pods) if pods is not None and int(pods) > 0 else None
    except (TypeError, ValueError):
        return None


class NodeObjects:
    """This node's objects, through `api`."""

    def __init__(self, api: KubeApi, node_name: str) -> None:
        self.api = api
        self.node_name = node_name

    @property
    def _node_path(self) -> str:
        return f"/api/v1/nodes/{quote(self.node_name, safe='')}"

    async def node(self) -> dict[str, Any]:
        return await self.api.get(self._node_path)

    async def eniconfig(self, name: str) -> EniConfig:
        """The ENIConfig `name`; raises `KubeRefused` (404 when there is none) or
        `KubeUnavailable`, and ValueError when it has no subnet."""
        return parse_eniconfig(name, await self.api.get(f"{ENICONFIGS}/{quote(name, safe='')}"))

    async def remove_taint(self, taint: Taint, attempts: int = 3) -> bool:
        """Remove `taint` from this node if it has it; returns whether it was there. Only that
        taint: the patch tests the list entry it removes."""
        for _ in range(attempts):
            node = await self.node()
            taints = (node.get("spec") or {}).get("taints") or []
            at = next((i for i, t in enumerate(taints) if taint.matches(t)), None)
            if at is None:
                return False
            ops = [
                {"op": "test", "path": f"/spec/taints/{at}", "value": taints[at]},
                {"op": "remove", "path": f"/spec/taints/{at}"},
            ]
            try:
                await self.api.patch(self._node_path, ops, JSON_PATCH)
                return True
            except KubeRefused as err:
                if err.status not in (409, 422):
                    raise  # the list changed under the test: read it again
        return False

    async def annotate_pod(self, namespace: str, name: str, address: str) -> None:
        """ADD: `vpc.amazonaws.com/pod-ips` is the pod's first address."""
        await self.api.patch(self._pod_path(namespace, name), _annotation(address))

    async def clear_pod_ips(self, namespace: str, name: str, released: str) -> None:
        """DEL: the annotation becomes "" if it still names the address released; a pod that is
        gone, or names another address (a new ADD's), is left alone."""
        path = self._pod_path(namespace, name)
        try:
            pod = await self.api.get(path)
        except KubeRefused as err:
            if err.status == 404:
                return
            raise
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        if annotations.get(POD_IPS) == released:
            await self.api.patch(path, _annotation(""))

    async def event(self, kind: str, reason: str, action: str, note: str) -> None:
        """An events.k8s.io/v1 Event of `kind` (Warning or Normal) regarding this node, as
        `kubectl describe node` shows them."""
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        body = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"generateName": f"{self.node_name}.", "namespace": "default"},
            "eventTime": now,
            "reportingController": "ipamd",
            "reportingInstance": self.node_name,
            "action": action,
            "reason": reason,
            "type": kind,
            "note": note[:1024],
            "regarding": {"apiVersion": "v1", "kind": "Node", "name": self.node_name},
        }
        await self.api.post("/apis/events.k8s.io/v1/namespaces/default/events", body)

    @staticmethod
    def _pod_path(namespace: str, name: str) -> str:
        return f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"


def _annotation(value: str) -> dict[str, object]:
    return {"metadata": {"annotations": {POD_IPS: value}}}
