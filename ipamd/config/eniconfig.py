"""The ENIConfig file: under custom networking, the subnet and security groups of each zone's
secondary ENIs, as an operator mounts them from a ConfigMap (IPAMD_ENI_CONFIG_FILE).

VPC CNI reads ENIConfig resources from the Kubernetes API and picks a node's by a node label or
annotation; ipamd talks to no API server, so it reads the same resources from a file and picks the one
named after the node's zone, what VPC CNI does with `ENI_CONFIG_LABEL_DEF=topology.kubernetes.io/zone`
(docs/operations.md, "Custom networking"). The file is JSON, in either of two shapes:

- what `kubectl get eniconfigs -o json` prints, a list of ENIConfig resources:
  `{"items": [{"metadata": {"name": "us-west-2a"}, "spec": {"subnet": "subnet-...",
  "securityGroups": ["sg-..."]}}]}`;
- a map of ENIConfig name to spec: `{"us-west-2a": {"subnet": "subnet-...", "securityGroups": [...]}}`.

It owns the format and its checks: every problem of a file is found in one pass, each naming the entry,
and raised as one `ValueError` with a line per problem, which `ipamd.config.settings` reports with every other
bad setting. The only I/O is reading the file, once, when `ipamd.config.settings` parses the setting at start.
No asyncio.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

MAX_SECURITY_GROUPS = 16
"""EC2's hard limit of security groups per network interface (the default quota is 5)."""

DEFAULT_ENICONFIG_KEY = "k8s.amazonaws.com/eniConfig"
"""VPC CNI's default ENI_CONFIG_LABEL_DEF and ENI_CONFIG_ANNOTATION_DEF."""
ZONE_LABELS = ("topology.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/zone")
"""The node labels whose value is the node's zone: the only ENI_CONFIG_LABEL_DEF ipamd can follow,
since the zone is all it knows of the node's labels (from EC2, without the Kubernetes API)."""

_SUBNET = re.compile(r"subnet-(?:[0-9a-f]{8}|[0-9a-f]{17})")
_SECURITY_GROUP = re.compile(r"sg-(?:[0-9a-f]{8}|[0-9a-f]{17})")
_NAME = re.compile(r"[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?")
"""A Kubernetes object name (RFC 1123 subdomain), as an ENIConfig's name must be."""
_SPEC_FIELDS = frozenset({"subnet", "securityGroups"})
_ITEM_FIELDS = frozenset({"apiVersion", "kind", "metadata", "spec", "status"})


@dataclass(frozen=True, slots=True)
class EniConfig:
    """One ENIConfig, as VPC CNI names the Kubernetes resource (its name and VPC CNI's
    `ENIConfigSpec`), from the file or from the API: where a node's secondary ENIs go under custom
    networking."""

    name: str
    """The resource's name: by default the zone's, as VPC CNI's `ENI_CONFIG_LABEL_DEF` keys it."""
    subnet_id: str
    security_groups: tuple[str, ...] = ()
    """Empty: the primary ENI's security groups, as VPC CNI does when an ENIConfig names none."""


@dataclass(frozen=True, slots=True)
class EniConfigFile:
    """The file's ENIConfigs, checked, and where they were read from."""

    path: str
    specs: tuple[EniConfig, ...]

    def find(self, name: str) -> EniConfig | None:
        return next((s for s in self.specs if s.name == name), None)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.specs)


def read_eni_config_file(path: str) -> EniConfigFile | None:
    """The ENIConfigs of the file at `path` (absolute; empty = none). Raises `ValueError`: one line
    per problem, each naming the entry."""
    if not path:
        return None
    if not path.startswith("/"):
        raise ValueError("must be an absolute path")
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except OSError as err:
        raise ValueError(f"cannot read the ENIConfig file: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise ValueError("cannot read the ENIConfig file: it is not UTF-8 text") from None
    return EniConfigFile(path, parse_eni_configs(text))


_LABEL_KEY = re.compile(
    r"(?:[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)


def parse_label_key(text: str) -> str:
    """ENI_CONFIG_LABEL_DEF and ENI_CONFIG_ANNOTATION_DEF: a label or annotation key (an optional
    DNS-subdomain prefix and `/`, then a name of at most 63 characters)."""
    if not _LABEL_KEY.fullmatch(text):
        raise ValueError("must be a label key: [prefix/]name, like k8s.amazonaws.com/eniConfig")
    return text


def show_eni_config_file(value: EniConfigFile | None) -> str:
    return value.path if value is not None else ""


def parse_eni_configs(text: str) -> tuple[EniConfig, ...]:
    """The ENIConfigs of a file's text, in either shape. Raises `ValueError` listing every problem,
    one a line."""
    try:
        body = json.loads(text, object_pairs_hook=_no_repeated_keys)
    except json.JSONDecodeError as err:
        raise ValueError(
            f"the ENIConfig file is not JSON: {err.msg} at line {err.lineno} column {err.colno}"
        ) from None
    if not isinstance(body, dict):
        raise ValueError(_SHAPES)
    entries = _list_entries(body) if "items" in body else _map_entries(body)
    if not entries:
        raise ValueError(f"the ENIConfig file names no ENIConfig; {_SHAPES}")
    problems: list[str] = []
    specs: list[EniConfig] = []
    names = [name for _, name, _ in entries]
    for where, name, spec in entries:
        found = _entry_problems(name, spec)
        problems += [f"entry {where}: {p}" for p in found]
        if not found:
            specs.append(_spec(name, spec))
    problems += [
        f"ENIConfig {name!r} appears more than once: one per zone"
        for name in dict.fromkeys(n for n in names if isinstance(n, str) and names.count(n) > 1)
    ]
    if problems:
        raise ValueError("\n".join(problems))
    return tuple(specs)


_SHAPES = (
    'must be a JSON object: {"items": [ENIConfig, ...]} (kubectl get eniconfigs -o json) or '
    '{"<zone>": {"subnet": "subnet-...", "securityGroups": ["sg-..."]}, ...}'
)

Entry = tuple[str, object, object]
"""(where in the file, the ENIConfig's name, its spec), as found, not yet checked."""


@dataclass(frozen=True, slots=True)
class _Refused:
    """In place of a spec: why an item of the list is no ENIConfig at all."""

    reason: str


def _no_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refused if it repeats a key (`json` would keep the last one silently)."""
    keys = [key for key, _ in pairs]
    repeated = [key for key in dict.fromkeys(keys) if keys.count(key) > 1]
    if repeated:
        raise ValueError(f"the key {repeated[0]!r} appears twice in one JSON object")
    return dict(pairs)


def _list_entries(body: dict[str, Any]) -> list[Entry]:
    items = body["items"]
    if not isinstance(items, list):
        raise ValueError(f"'items' must be a list of ENIConfig resources; {_SHAPES}")
    entries: list[Entry] = []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            entries.append((f"items[{index}]", None, _Refused("must be an ENIConfig (an object)")))
            continue
        metadata = item.get("metadata")
        name = metadata.get("name") if isinstance(metadata, dict) else None
        where = f"{name!r} (items[{index}])" if isinstance(name, str) else f"items[{index}]"
        spec: object = item.get("spec")
        unknown = sorted(set(item) - _ITEM_FIELDS)
        if item.get("kind", "ENIConfig") != "ENIConfig":
            spec = _Refused(f"is a {item.get('kind')!r}, not an ENIConfig")
        elif unknown:
            spec = _Refused(f"unknown fields {unknown} (an ENIConfig has metadata and spec)")
        entries.append((where, name, spec))
    return entries


def _map_entries(body: dict[str, Any]) -> list[Entry]:
    return [(repr(name), name, spec) for name, spec in body.items()]


def _entry_problems(name: object, spec: object) -> list[str]:
    if isinstance(spec, _Refused):
        return [spec.reason]
    problems: list[str] = []
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        problems.append(
            f"name {name!r} must be the zone it is for, like us-west-2a (a Kubernetes object "
            "name: lower-case letters, digits, '-' and '.')"
        )
    if not isinstance(spec, dict):
        return [*problems, "needs a spec: an object with subnet and securityGroups"]
    unknown = sorted(set(spec) - _SPEC_FIELDS)
    if unknown:
        problems.append(f"unknown fields {unknown} (a spec has subnet and securityGroups)")
    subnet = spec.get("subnet")
    if subnet is None:
        problems.append("needs a subnet: a subnet ID, like subnet-0123456789abcdef0")
    elif not isinstance(subnet, str) or not _SUBNET.fullmatch(subnet):
        problems.append(
            f"subnet {subnet!r} must be a subnet ID: subnet- and 8 or 17 hex digits, like "
            "subnet-0123456789abcdef0"
        )
    return problems + _security_group_problems(_groups(spec))


def _groups(spec: dict[str, Any]) -> object:
    """securityGroups, absent or null (a Go client's empty list) being none."""
    groups = spec.get("securityGroups")
    return [] if groups is None else groups


def _security_group_problems(groups: object) -> list[str]:
    if not isinstance(groups, list):
        return [f"securityGroups {groups!r} must be a list of security group IDs"]
    problems = [
        f"security group {g!r} must be a security group ID: sg- and 8 or 17 hex digits, like "
        "sg-0123456789abcdef0"
        for g in groups
        if not isinstance(g, str) or not _SECURITY_GROUP.fullmatch(g)
    ]
    problems += [
        f"security group {g!r} appears twice"
        for g in dict.fromkeys(g for g in groups if isinstance(g, str) and groups.count(g) > 1)
    ]
    if len(groups) > MAX_SECURITY_GROUPS:
        problems.append(
            f"names {len(groups)} security groups; EC2 allows at most {MAX_SECURITY_GROUPS} on a "
            "network interface"
        )
    return problems


def _spec(name: object, spec: object) -> EniConfig:
    assert isinstance(name, str) and isinstance(spec, dict)  # checked by _entry_problems
    groups = _groups(spec)
    assert isinstance(groups, list)
    return EniConfig(name, spec["subnet"], tuple(groups))
