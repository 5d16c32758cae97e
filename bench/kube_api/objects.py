"""Objects for the test API server (`bench.kube_api.server`) to serve, shaped as a real cluster
serves them and valid against the Kubernetes schemas: a Node, a Pod, an ENIConfig; and the bulk
populations of issue 39's memory test (100,000 pods on other nodes, 5,000 ENIConfigs), generated
from their index (`store.Bulk`), never held.

`taint("key[=value]:Effect")` and `node_object(..., taints=["key:NoSchedule"])` take kubectl's
notation.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from bench.kube_api.kinds import ENICONFIGS, PODS, Key
from bench.kube_api.store import Bulk, timestamp

Obj = dict[str, Any]

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"


def taint(spec: str | Mapping[str, Any]) -> Obj:
    """A Taint from kubectl's `key[=value]:Effect`, or the dict itself."""
    if not isinstance(spec, str):
        return dict(spec)
    match = re.fullmatch(r"([^=:]+)(?:=([^:]*))?:(NoSchedule|PreferNoSchedule|NoExecute)", spec)
    if match is None:
        raise ValueError(f"not a taint (key[=value]:Effect): {spec!r}")
    key, value, effect = match.groups()
    return {"key": key, "effect": effect} | ({"value": value} if value is not None else {})


def node_object(
    name: str,
    *,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    taints: Iterable[str | Mapping[str, Any]] = (),
    max_pods: int | None = 110,
    zone: str = "us-west-2a",
    instance_id: str = "i-0123456789abcdef0",
    instance_type: str = "m5.large",
    internal_ip: str = "10.0.0.10",
    unschedulable: bool = False,
) -> Obj:
    """A Node as the kubelet and the cloud provider leave it; `max_pods` is its
    `status.capacity.pods` (None: the capacity does not say)."""
    spec: Obj = {"providerID": f"aws:///{zone}/{instance_id}"}
    if taints := [taint(t) for t in taints]:
        spec["taints"] = taints
    if unschedulable:
        spec["unschedulable"] = True
    capacity = {"cpu": "2", "memory": "7910Mi", "ephemeral-storage": "20959212Ki"}
    if max_pods is not None:
        capacity["pods"] = str(max_pods)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "node.kubernetes.io/instance-type": instance_type,
                "topology.kubernetes.io/zone": zone,
                **(labels or {}),
            },
            "annotations": dict(annotations or {}),
        },
        "spec": spec,
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "addresses": [
                {"type": "InternalIP", "address": internal_ip},
                {"type": "Hostname", "address": name},
            ],
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady"},
            ],
        },
    }


def pod_object(
    name: str,
    node: str | None = None,
    *,
    namespace: str = "default",
    host_network: bool = False,
    phase: str = "Pending",
    pod_ip: str | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> Obj:
    """A pod, bound to `node` when given (spec.nodeName, as the scheduler's binding leaves it),
    with one container; `pod_ip` is its status.podIP (a host-network pod's is the node's)."""
    spec: Obj = {
        "containers": [{"name": "app", "image": PAUSE_IMAGE}],
        "restartPolicy": "Always",
        "schedulerName": "default-scheduler",
        "serviceAccountName": "default",
    }
    if node is not None:
        spec["nodeName"] = node
    if host_network:
        spec["hostNetwork"] = True
    status: Obj = {"phase": phase}
    if pod_ip is not None:
        status |= {"podIP": pod_ip, "podIPs": [{"ip": pod_ip}]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(labels or {}),
            "annotations": dict(annotations or {}),
        },
        "spec": spec,
        "status": status,
    }


def eniconfig_object(name: str, subnet: str, security_groups: Iterable[str] | None = None) -> Obj:
    """An ENIConfig as VPC CNI's chart makes one (templates/eniconfig.yaml): its name is usually the
    zone, or the value of the node's label or annotation that selects it."""
    spec: Obj = {"subnet": subnet}
    if security_groups is not None:
        spec["securityGroups"] = list(security_groups)
    return {
        "apiVersion": "crd.k8s.amazonaws.com/v1alpha1",
        "kind": "ENIConfig",
        "metadata": {"name": name},
        "spec": spec,
    }


def _stamped(obj: Obj, rv: str, uid: str, created: str) -> Obj:
    obj["metadata"] |= {"resourceVersion": rv, "uid": uid, "creationTimestamp": created}
    return obj


def _template(obj: Obj) -> Callable[..., bytes]:
    """The object's JSON with its `@@field@@` strings filled in by keyword (plain strings only)."""
    text = json.dumps(obj, separators=(",", ":")).replace("{", "{{").replace("}", "}}")
    pattern = re.sub(r"@@(\w+)@@", r"{\1}", text)
    return lambda **fields: pattern.format(**fields).encode()


def _pod_address(n: int) -> str:
    """The n-th address of 100.64.0.0/10 (n < 2**22)."""
    return f"100.{64 + (n >> 16)}.{(n >> 8) & 255}.{n & 255}"


def _uid(prefix: int, index: int) -> str:
    return f"{prefix:08x}-0000-4000-8000-{index:012x}"


def bulk_pods(
    count: int = 100_000,
    *,
    nodes: int = 1_000,
    namespaces: int = 100,
    node_prefix: str = "bulk-node-",
) -> Bulk:
    """`count` running pods spread evenly over `nodes` other nodes (`bulk-node-00000`, ...), in
    `namespaces` namespaces (`bulk-000`, ...), named `bulk-pod-000000`, ..., each with an address."""
    per_node = max(1, math.ceil(count / nodes))
    created = timestamp()

    def fields(i: int, rv: int) -> dict[str, str]:
        return {
            "name": f"bulk-pod-{i:06d}",
            "namespace": f"bulk-{i % namespaces:03d}",
            "node": f"{node_prefix}{i // per_node:05d}",
            "ip": _pod_address(i + 1),
            "rv": str(rv),
            "uid": _uid(0xB0B0, i),
        }

    def shaped(f: dict[str, str]) -> Obj:
        pod = pod_object(
            f["name"],
            f["node"],
            namespace=f["namespace"],
            phase="Running",
            pod_ip=f["ip"],
            labels={"app": "bulk"},
        )
        return _stamped(pod, f["rv"], f["uid"], created)

    def build(i: int, rv: int) -> Obj:
        return shaped(fields(i, rv))

    template = _template(shaped({k: f"@@{k}@@" for k in fields(0, 0)}))
    assert json.loads(template(**fields(0, 0))) == build(0, 0)

    def key_of(i: int) -> Key:
        return (f"bulk-{i % namespaces:03d}", f"bulk-pod-{i:06d}")

    def node_range(node: str) -> range:
        number = node.removeprefix(node_prefix)
        if not node.startswith(node_prefix) or not number.isdigit():
            return range(0)
        first = int(number) * per_node
        return range(min(first, count), min(first + per_node, count))

    return Bulk(
        PODS,
        count,
        build,
        lambda i, rv: template(**fields(i, rv)),
        key_of,
        _index_of_name(BULK_POD, count),
        node_range,
    )


def _index_of_name(pattern: re.Pattern[str], count: int) -> Callable[[str], int | None]:
    def index_of_name(name: str) -> int | None:
        match = pattern.fullmatch(name)
        return int(match[1]) if match and int(match[1]) < count else None

    return index_of_name


BULK_POD = re.compile(r"bulk-pod-(\d{6})")
BULK_ENICONFIG = re.compile(r"bulk-eniconfig-(\d{5})")


def bulk_eniconfigs(count: int = 5_000) -> Bulk:
    """`count` ENIConfigs named `bulk-eniconfig-00000`, ..., each with a subnet and a group."""
    created = timestamp()

    def fields(i: int, rv: int) -> dict[str, str]:
        return {
            "name": f"bulk-eniconfig-{i:05d}",
            "id": f"{i:017x}",
            "rv": str(rv),
            "uid": _uid(0xE1C0, i),
        }

    def build(i: int, rv: int) -> Obj:
        f = fields(i, rv)
        obj = eniconfig_object(f["name"], f"subnet-{f['id']}", [f"sg-{f['id']}"])
        return _stamped(obj, f["rv"], f["uid"], created)

    template = _template(
        _stamped(
            eniconfig_object("@@name@@", "subnet-@@id@@", ["sg-@@id@@"]),
            "@@rv@@",
            "@@uid@@",
            created,
        )
    )
    assert json.loads(template(**fields(0, 0))) == build(0, 0)
    return Bulk(
        ENICONFIGS,
        count,
        build,
        lambda i, rv: template(**fields(i, rv)),
        lambda i: ("", f"bulk-eniconfig-{i:05d}"),
        _index_of_name(BULK_ENICONFIG, count),
    )
