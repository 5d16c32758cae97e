"""A decoder of aws-node's checkpoint with Go's `encoding/json` rules, into VPC CNI's own struct types
(aws/amazon-vpc-cni-k8s v1.23.1, `pkg/ipamd/datastore/data_store.go`: `CheckpointData`,
`CheckpointEntry`, `IPAMKey`, `IPAMMetadata`), so a test can tell whether aws-node, rolled back onto
a node, would read the file ipamd wrote.

The rules that matter here, as Go applies them when unmarshalling into a struct:
- a member sets the field whose JSON name equals it case-insensitively; the last one wins; members
  with no field are ignored;
- a string field takes a JSON string or `null` (left as ""); anything else is an error;
- an int64 field takes an integer literal within int64 (no fraction, no exponent), or `null`;
- a slice takes an array or `null`; a struct takes an object or `null`;
- any error fails the whole `Decode`, and aws-node then restores no pod at all.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

INT64 = (-(2**63), 2**63 - 1)


class GoDecodeError(ValueError):
    pass


class _Obj(list[tuple[str, object]]):
    pass


class _Float(float):
    """A number literal with a fraction or an exponent: never an integer to Go."""


@dataclass
class GoEntry:
    network_name: str = ""
    container_id: str = ""
    if_name: str = ""
    ipv4: str = ""
    ipv6: str = ""
    allocation_timestamp: int = 0
    namespace: str = ""
    name: str = ""
    interfaces_count: int = 0


@dataclass
class GoCheckpoint:
    version: str = ""
    allocations: list[GoEntry] = field(default_factory=list)


def _fields(obj: object, where: str) -> dict[str, object]:
    if obj is None:
        return {}
    if not isinstance(obj, _Obj):
        raise GoDecodeError(f"{where}: cannot unmarshal {type(obj).__name__} into a struct")
    out: dict[str, object] = {}
    for name, value in obj:
        out[name.casefold()] = value  # case-insensitive, the last one wins
    return out


def _string(value: object, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise GoDecodeError(f"{where}: cannot unmarshal {type(value).__name__} into string")
    return value


def _int64(value: object, where: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):  # a `_Float` is no int
        raise GoDecodeError(f"{where}: cannot unmarshal {value!r} into int64")
    if not INT64[0] <= value <= INT64[1]:
        raise GoDecodeError(f"{where}: {value} overflows int64")
    return value


def decode(raw: bytes) -> GoCheckpoint:
    """`json.NewDecoder(f).Decode(&data)` of aws-node's `CheckpointData`; raises `GoDecodeError`."""
    try:
        text = raw.decode("utf-8", errors="replace")  # Go replaces invalid UTF-8, never fails
        doc, _ = json.JSONDecoder(
            object_pairs_hook=_Obj, parse_float=_Float, parse_constant=_no_constant
        ).raw_decode(text.lstrip(" \t\r\n"))
    except ValueError as err:
        raise GoDecodeError(f"syntax: {err}") from None
    top = _fields(doc, "CheckpointData")
    out = GoCheckpoint(version=_string(top.get("version"), "version"))
    items = top.get("allocations")
    if items is not None and (not isinstance(items, list) or isinstance(items, _Obj)):
        raise GoDecodeError("allocations: not an array")
    for i, item in enumerate(items or []):
        f = _fields(item, f"allocations[{i}]")
        meta = _fields(f.get("metadata"), f"allocations[{i}].metadata")
        out.allocations.append(
            GoEntry(
                network_name=_string(f.get("networkname"), "networkName"),
                container_id=_string(f.get("containerid"), "containerID"),
                if_name=_string(f.get("ifname"), "ifName"),
                ipv4=_string(f.get("ipv4"), "ipv4"),
                ipv6=_string(f.get("ipv6"), "ipv6"),
                allocation_timestamp=_int64(f.get("allocationtimestamp"), "allocationTimestamp"),
                namespace=_string(meta.get("k8spodnamespace"), "k8sPodNamespace"),
                name=_string(meta.get("k8spodname"), "k8sPodName"),
                interfaces_count=_int64(meta.get("interfacescount"), "interfacesCount"),
            )
        )
    return out


def _no_constant(name: str) -> object:
    raise ValueError(f"invalid character in {name}")
