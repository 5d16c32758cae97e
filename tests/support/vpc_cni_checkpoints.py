"""aws-node's checkpoint (`/var/run/aws-node/ipam.json`) in every shape VPC CNI has written, byte
for byte as its Go code writes it.

Sources (aws/amazon-vpc-cni-k8s, read at each tag):
- `pkg/ipamd/datastore/data_store.go`: `CheckpointData`, `CheckpointEntry`, `IPAMKey`,
  `IPAMMetadata` (field order, JSON names, `omitempty`), and `backfillNetworkName` /
  `backfillNetworkIface` (`_migrated-from-cri` / `unknown`, the key of pods found through CRI).
- `pkg/ipamd/datastore/checkpoint.go`: `JSONFile.Checkpoint` writes with `json.NewEncoder(f).Encode`,
  so compact JSON and one trailing newline.

The shapes:
- v1.7.0, v1.8.0: the key, then `ipv4` (no `omitempty`); nothing else.
- v1.10.0: `ipv4` and `ipv6`, both `omitempty` (an IPv6 node's entries have no `ipv4`).
- v1.12.0: `allocationTimestamp` (int64 ns, always written) and `metadata` with `k8sPodNamespace`
  and `k8sPodName` (both `omitempty`, so `{}` for a pod without them).
- v1.20.0: `metadata` gains `interfacesCount` (`omitempty`).

A CRI-migrated entry as a real node wrote it is the file posted in aws/amazon-vpc-cni-k8s PR #1958
("record pod metadata and allocationTime in IP allocation state file"): v1.12 shape, key
`_migrated-from-cri`/`unknown`, 64-hex container IDs, metadata without `interfacesCount`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

VERSION = "vpc-cni-ipam/1"
BACKFILL_NETWORK = "_migrated-from-cri"
BACKFILL_IFNAME = "unknown"


@dataclass(frozen=True)
class Shape:
    tag: str
    v6_field: bool
    """`ipv6` exists and both address fields are `omitempty` (v1.10 on)."""
    stamp_and_metadata: bool
    """`allocationTimestamp` and `metadata` exist (v1.12 on)."""
    interfaces_count: bool
    """`metadata.interfacesCount` exists (v1.20 on)."""


SHAPES = (
    Shape("v1.7.0", False, False, False),
    Shape("v1.8.0", False, False, False),
    Shape("v1.10.0", True, False, False),
    Shape("v1.12.0", True, True, False),
    Shape("v1.20.0", True, True, True),
)


@dataclass(frozen=True)
class Pod:
    container_id: str
    address: str
    namespace: str = ""
    name: str = ""
    stamp_ns: int = 0
    migrated: bool = False
    """Found through CRI at aws-node's first start (the `_migrated-from-cri` key)."""


def entry(shape: Shape, pod: Pod) -> dict[str, object]:
    """One `CheckpointEntry` as Go's encoder writes it at `shape`'s tag, fields in struct order."""
    out: dict[str, object] = {
        "networkName": BACKFILL_NETWORK if pod.migrated else "aws-cni",
        "containerID": pod.container_id,
        "ifName": BACKFILL_IFNAME if pod.migrated else "eth0",
    }
    v6 = ":" in pod.address
    if not shape.v6_field:
        out["ipv4"] = pod.address
    else:
        if not v6:
            out["ipv4"] = pod.address
        if v6:
            out["ipv6"] = pod.address
    if shape.stamp_and_metadata:
        out["allocationTimestamp"] = pod.stamp_ns
        meta: dict[str, object] = {}
        if pod.namespace:
            meta["k8sPodNamespace"] = pod.namespace
        if pod.name:
            meta["k8sPodName"] = pod.name
        if shape.interfaces_count and not pod.migrated:
            meta["interfacesCount"] = 1  # the CNI ADD sets it; a CRI-found pod has none
        out["metadata"] = meta
    return out


def render(shape: Shape, pods: list[Pod]) -> bytes:
    """The whole file: `Encode` of `CheckpointData` (a nil slice is `null`), newline-terminated."""
    doc = {"version": VERSION, "allocations": [entry(shape, p) for p in pods] or None}
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"


PR_1958_FILE = (
    b'{"version":"vpc-cni-ipam/1","allocations":['
    b'{"networkName":"_migrated-from-cri","containerID":'
    b'"75ebe0da8b3f1e5ee3faab89e538fb32af7c038fd0cd0ebf39dee8e459d1788e","ifName":"unknown",'
    b'"ipv4":"192.168.12.15","allocationTimestamp":1647904840550836685,'
    b'"metadata":{"k8sPodNamespace":"kube-system","k8sPodName":"coredns-85d5b4454c-l9pwn"}},'
    b'{"networkName":"_migrated-from-cri","containerID":'
    b'"b26913f3b6009fc8e554ae62f6c43e27c8414af04cc6b708c1d8f416386f6bcc","ifName":"unknown",'
    b'"ipv4":"192.168.16.112","allocationTimestamp":1647904840496172364,'
    b'"metadata":{"k8sPodNamespace":"kube-system",'
    b'"k8sPodName":"aws-load-balancer-controller-588487d8fc-fcn4m"}}]}'
)
"""The first two entries of the file posted in PR #1958, as posted."""
