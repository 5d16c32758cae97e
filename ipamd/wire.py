"""What crosses the local socket between the daemon's API and `ipamd-cni`: paths, bodies, limits.

Standard library only (dataclasses and json), so the plugin stays quick to start. Requests are parsed
strictly: the exact JSON types, bounded sizes and lengths, no unknown fields, no duplicate keys. A
violation raises `WireError`, which the API answers with 400 `bad_request`. Responses are parsed by the
plugin with the same type checks but ignore fields they do not know, so a newer daemon may add fields.

Identifier rules:
- container ID: the CNI spec's form (an alphanumeric first character, then alphanumerics, `_`, `.`,
  `-`), at most 256 characters;
- ifname: a Linux interface name: 1-15 bytes (IFNAMSIZ 16 with the NUL), not `.` or `..`, no `/`, `:`
  or whitespace;
- network name: the CNI spec's form for a network configuration's `name`, at most 128 characters.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

CNI_VERSION = "1.1.0"
SUPPORTED_CNI_VERSIONS = ("0.4.0", "1.0.0", "1.1.0")

DEFAULT_SOCKET = "/run/ipamd/ipamd.sock"

PATH_ALLOCATIONS = "/v1/allocations"
PATH_GC = "/v1/gc"
PATH_POOL = "/v1/pool"
PATH_INTENTS = "/v1/intents"
PATH_ENIS = "/v1/enis"
PATH_HEALTHZ = "/healthz"
PATH_READYZ = "/readyz"

MAX_BODY_BYTES = 16 * 1024
"""Largest request body the API reads, except GC's."""
MAX_GC_BODY_BYTES = 4 * 1024 * 1024
"""GC names every valid attachment of the node; 4 MiB holds MAX_VALID_ATTACHMENTS of the longest."""
MAX_VALID_ATTACHMENTS = 10_000
MAX_CONTAINER_ID = 256
MAX_IFNAME_BYTES = 15
MAX_NETWORK = 128
MAX_POD_FIELD = 253
"""A pod name is a DNS subdomain (253); namespace (63) and UID (36) are shorter."""

_IDENTIFIER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")


class WireError(ValueError):
    """A request that does not have the shape the API accepts; the message names the field."""


# -- strict JSON --------------------------------------------------------------------------------------


def _reject_constant(name: str) -> object:
    raise WireError(f"{name} is not valid JSON")


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    obj: dict[str, object] = {}
    for name, value in pairs:
        if name in obj:
            raise WireError(f"duplicate field {name!r}")
        obj[name] = value
    return obj


def parse_object(raw: bytes) -> dict[str, object]:
    """A JSON object from UTF-8 bytes: no NaN/Infinity, no duplicate keys, an object at the top."""
    try:
        value = json.loads(
            raw.decode("utf-8"),
            object_pairs_hook=_no_duplicates,
            parse_constant=_reject_constant,
        )
    except UnicodeDecodeError as err:
        raise WireError(f"body is not UTF-8: {err.reason}") from None
    except json.JSONDecodeError as err:
        raise WireError(
            f"body is not JSON: {err.msg} at line {err.lineno} column {err.colno}"
        ) from None
    except RecursionError:
        raise WireError("body is nested too deeply") from None
    if not isinstance(value, dict):
        raise WireError("body must be a JSON object")
    return value


def dumps(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"))


def _fields(
    obj: object, where: str, required: tuple[str, ...], optional: tuple[str, ...] = ()
) -> Mapping[str, object]:
    if not isinstance(obj, dict):
        raise WireError(f"{where} must be a JSON object")
    unknown = sorted(set(obj) - set(required) - set(optional))
    if unknown:
        raise WireError(f"{where}: unknown field(s) {', '.join(map(repr, unknown))}")
    missing = [name for name in required if name not in obj]
    if missing:
        raise WireError(f"{where}: missing field(s) {', '.join(map(repr, missing))}")
    return obj


def _string(obj: Mapping[str, object], name: str, where: str, max_len: int) -> str:
    value = obj.get(name, "")
    if not isinstance(value, str):
        raise WireError(f"{where}.{name} must be a string")
    if len(value) > max_len:
        raise WireError(f"{where}.{name} is longer than {max_len} characters")
    if not value.isprintable():
        raise WireError(f"{where}.{name} holds control characters")
    return value


# -- identifiers ------------------------------------------------------------------------------------


def check_container_id(value: object, field: str = "container_id") -> str:
    if not isinstance(value, str):
        raise WireError(f"{field} must be a string")
    if not 0 < len(value) <= MAX_CONTAINER_ID or not _IDENTIFIER.fullmatch(value):
        raise WireError(
            f"{field} must be 1-{MAX_CONTAINER_ID} characters: a letter or digit, then letters, "
            "digits, '_', '.' or '-'"
        )
    return value


def check_ifname(value: object, field: str = "ifname") -> str:
    if not isinstance(value, str):
        raise WireError(f"{field} must be a string")
    size = len(value.encode("utf-8", "surrogatepass"))
    if not 0 < size <= MAX_IFNAME_BYTES or value in {".", ".."}:
        raise WireError(f"{field} must be 1-{MAX_IFNAME_BYTES} bytes and not '.' or '..'")
    if any(c in "/:" or c.isspace() or not c.isprintable() for c in value):
        raise WireError(f"{field} must not contain '/', ':', whitespace or control characters")
    return value


def check_network(value: object, field: str = "network") -> str:
    if not isinstance(value, str):
        raise WireError(f"{field} must be a string")
    if not 0 < len(value) <= MAX_NETWORK or not _IDENTIFIER.fullmatch(value):
        raise WireError(
            f"{field} must be 1-{MAX_NETWORK} characters: a letter or digit, then letters, digits, "
            "'_', '.' or '-'"
        )
    return value


# -- requests -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PodInfo:
    namespace: str = ""
    name: str = ""
    uid: str = ""

    @classmethod
    def from_json(cls, obj: object, where: str = "pod") -> PodInfo:
        fields = _fields(obj, where, (), ("namespace", "name", "uid"))
        return cls(
            *(_string(fields, n, where, MAX_POD_FIELD) for n in ("namespace", "name", "uid"))
        )

    def to_json(self) -> dict[str, object]:
        return {"namespace": self.namespace, "name": self.name, "uid": self.uid}


@dataclass(frozen=True, slots=True)
class AllocateRequest:
    """ADD: `POST /v1/allocations`."""

    container_id: str
    ifname: str
    network: str
    pod: PodInfo | None = None

    @classmethod
    def from_json(cls, obj: object) -> AllocateRequest:
        fields = _fields(obj, "body", ("container_id", "ifname", "network"), ("pod",))
        pod = fields.get("pod")
        return cls(
            container_id=check_container_id(fields["container_id"]),
            ifname=check_ifname(fields["ifname"]),
            network=check_network(fields["network"]),
            pod=None if pod is None else PodInfo.from_json(pod),
        )

    def to_json(self) -> dict[str, object]:
        body: dict[str, object] = {
            "container_id": self.container_id,
            "ifname": self.ifname,
            "network": self.network,
        }
        if self.pod is not None:
            body["pod"] = self.pod.to_json()
        return body


@dataclass(frozen=True, slots=True)
class Attachment:
    """A CNI attachment the runtime still considers valid: (container ID, ifname)."""

    container_id: str
    ifname: str

    @classmethod
    def from_json(cls, obj: object, where: str) -> Attachment:
        fields = _fields(obj, where, ("container_id", "ifname"))
        return cls(
            check_container_id(fields["container_id"], f"{where}.container_id"),
            check_ifname(fields["ifname"], f"{where}.ifname"),
        )

    def to_json(self) -> dict[str, object]:
        return {"container_id": self.container_id, "ifname": self.ifname}


@dataclass(frozen=True, slots=True)
class GcRequest:
    """CNI GC: `POST /v1/gc`. An empty list is meaningful: nothing of the network is valid."""

    network: str
    valid_attachments: tuple[Attachment, ...]

    @classmethod
    def from_json(cls, obj: object) -> GcRequest:
        fields = _fields(obj, "body", ("network", "valid_attachments"))
        items = fields["valid_attachments"]
        if not isinstance(items, list):
            raise WireError("valid_attachments must be a list")
        if len(items) > MAX_VALID_ATTACHMENTS:
            raise WireError(f"valid_attachments holds more than {MAX_VALID_ATTACHMENTS} entries")
        return cls(
            network=check_network(fields["network"]),
            valid_attachments=tuple(
                Attachment.from_json(item, f"valid_attachments[{i}]")
                for i, item in enumerate(items)
            ),
        )

    def to_json(self) -> dict[str, object]:
        return {
            "network": self.network,
            "valid_attachments": [a.to_json() for a in self.valid_attachments],
        }


# -- responses ---------------------------------------------------------------------------------------


def _text(obj: Mapping[str, object], name: str, where: str) -> str:
    value = obj.get(name)
    if not isinstance(value, str):
        raise WireError(f"{where}.{name} must be a string")
    return value


def _number(obj: Mapping[str, object], name: str, where: str) -> float:
    value = obj.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise WireError(f"{where}.{name} must be a number")
    return float(value)


def _response_object(obj: object, where: str) -> Mapping[str, object]:
    if not isinstance(obj, dict):
        raise WireError(f"{where} must be a JSON object")
    return obj


@dataclass(frozen=True, slots=True)
class IpConfig:
    address: str
    """CIDR notation: the pod's address with its prefix length, `10.0.1.23/32`."""
    gateway: str
    eni_id: str

    @classmethod
    def from_json(cls, obj: object, where: str) -> IpConfig:
        o = _response_object(obj, where)
        return cls(
            _text(o, "address", where),
            _text(o, "gateway", where),
            _text(o, "eni_id", where),
        )

    def to_json(self) -> dict[str, object]:
        return {"address": self.address, "gateway": self.gateway, "eni_id": self.eni_id}


@dataclass(frozen=True, slots=True)
class Route:
    dst: str
    gw: str | None = None

    @classmethod
    def from_json(cls, obj: object, where: str) -> Route:
        o = _response_object(obj, where)
        gw = o.get("gw")
        if gw is not None and not isinstance(gw, str):
            raise WireError(f"{where}.gw must be a string")
        return cls(_text(o, "dst", where), gw)

    def to_json(self) -> dict[str, object]:
        return {"dst": self.dst} if self.gw is None else {"dst": self.dst, "gw": self.gw}


@dataclass(frozen=True, slots=True)
class Allocation:
    """An attachment's addresses: the answer to ADD and to `GET /v1/allocations/{cid}/{ifname}`."""

    network: str
    container_id: str
    ifname: str
    ips: tuple[IpConfig, ...]
    routes: tuple[Route, ...]
    created_at: float
    pod: PodInfo | None = None

    @classmethod
    def from_json(cls, obj: object) -> Allocation:
        o = _response_object(obj, "allocation")
        ips, routes = o.get("ips"), o.get("routes", [])
        if not isinstance(ips, list) or not isinstance(routes, list):
            raise WireError("allocation.ips and allocation.routes must be lists")
        pod = o.get("pod")
        return cls(
            network=_text(o, "network", "allocation"),
            container_id=_text(o, "container_id", "allocation"),
            ifname=_text(o, "ifname", "allocation"),
            ips=tuple(IpConfig.from_json(ip, f"ips[{i}]") for i, ip in enumerate(ips)),
            routes=tuple(Route.from_json(r, f"routes[{i}]") for i, r in enumerate(routes)),
            created_at=_number(o, "created_at", "allocation"),
            pod=None if pod is None else PodInfo(**_pod_strings(pod)),
        )

    def to_json(self) -> dict[str, object]:
        body: dict[str, object] = {
            "network": self.network,
            "container_id": self.container_id,
            "ifname": self.ifname,
            "ips": [ip.to_json() for ip in self.ips],
            "routes": [r.to_json() for r in self.routes],
            "created_at": self.created_at,
        }
        if self.pod is not None:
            body["pod"] = self.pod.to_json()
        return body


def _pod_strings(obj: object) -> dict[str, str]:
    o = _response_object(obj, "allocation.pod")
    return {n: _text(o, n, "allocation.pod") for n in ("namespace", "name", "uid")}


@dataclass(frozen=True, slots=True)
class ErrorBody:
    """Every 4xx and 5xx answer: a stable `code` to match on, a message for people."""

    code: str
    message: str
    retryable: bool = False

    @classmethod
    def from_json(cls, obj: object) -> ErrorBody:
        o = _response_object(obj, "error")
        retryable = o.get("retryable", False)
        return cls(
            _text(o, "code", "error"),
            str(o.get("message", "")),
            retryable if isinstance(retryable, bool) else False,
        )

    def to_json(self) -> dict[str, object]:
        return {"code": self.code, "message": self.message, "retryable": self.retryable}
