"""What crosses the local socket between the daemon's API and its clients (`ipamd-cni`, `ipamctl`):
paths, error codes, bodies, limits.

Requests are parsed strictly: the exact JSON types, bounded sizes and lengths, no unknown fields, no
duplicate keys. A violation raises `WireError`, which the API answers with 400 `bad_request`.
Responses are parsed by the plugin with the same type checks but ignore fields they do not know,
so a newer daemon may add fields.

Identifier rules:
- container ID: the CNI spec's form (an alphanumeric first character, then alphanumerics, `_`, `.`,
  `-`), at most 256 characters;
- ifname: a Linux interface name: 1-15 bytes (IFNAMSIZ 16 with the NUL), not `.` or `..`, no `/`,
  `:` or whitespace;
- network name: the CNI spec's form for a network configuration's `name`, at most 128 characters.

The plugin imports this module on every pod's ADD and DEL, so it imports only `ipamd.wire.codec`
(which says why and how): the value types are plain classes with `__slots__` on `codec.Value`, since
`dataclasses` would pull in `inspect`.
"""

from __future__ import annotations

from ipamd.wire.codec import (
    Value,
    fields_of,
    number_field,
    response_object,
    string_field,
    text_field,
)
from ipamd.wire.codec import WireError as WireError
from ipamd.wire.codec import dumps as dumps
from ipamd.wire.codec import parse_answer as parse_answer
from ipamd.wire.codec import parse_object as parse_object

CNI_VERSION = "1.1.0"
SUPPORTED_CNI_VERSIONS = ("0.4.0", "1.0.0", "1.1.0")

DEFAULT_SOCKET = "/run/ipamd/ipamd.sock"

PATH_ALLOCATIONS = "/v1/allocations"
PATH_GC = "/v1/gc"
PATH_POOL = "/v1/pool"
PATH_INTENTS = "/v1/intents"
PATH_ENIS = "/v1/enis"
PATH_REPAIR = "/v1/repair"
PATH_HEALTHZ = "/healthz"
PATH_READYZ = "/readyz"

# The `code` of an `ErrorBody`: what clients match on (`ipamd.api.app` says when each is answered).
CODE_BAD_REQUEST = "bad_request"
CODE_NOT_FOUND = "not_found"
CODE_ALLOCATION_NOT_FOUND = "allocation_not_found"
CODE_METHOD_NOT_ALLOWED = "method_not_allowed"
CODE_DELETE_INTENT = "delete_intent"
CODE_INVENTORY_CONFLICT = "inventory_conflict"
CODE_REQUEST_TIMEOUT = "request_timeout"
CODE_PAYLOAD_TOO_LARGE = "payload_too_large"
CODE_UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
CODE_NO_ADDRESS = "no_address"
CODE_MAX_PODS = "max_pods"
CODE_NODE_FULL = "node_full"
CODE_DATAPATH_UNAVAILABLE = "datapath_unavailable"
CODE_RUNTIME_UNAVAILABLE = "runtime_unavailable"
CODE_STORE_WRITE_FAILED = "store_write_failed"
CODE_STATE_UNAVAILABLE = "state_unavailable"
CODE_NOT_READY = "not_ready"
CODE_INTERNAL = "internal"
CODE_NETWORK_POLICY_REFUSED = "network_policy_refused"
CODE_NETWORK_POLICY_UNAVAILABLE = "network_policy_unavailable"

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

_ALNUM = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
_IDENTIFIER_CHARS = _ALNUM | frozenset("_.-")


# -- identifiers -----------------------------------------------------------------------------------


def _is_identifier(value: str) -> bool:
    return value[:1] in _ALNUM and _IDENTIFIER_CHARS.issuperset(value)


def _not_identifier(value: object, field: str, most: int) -> WireError:
    if not isinstance(value, str):
        return WireError(f"{field} must be a string")
    return WireError(
        f"{field} must be 1-{most} characters: a letter or digit, then letters, digits, '_', '.' or '-'"
    )


def check_container_id(value: object, field: str = "container_id") -> str:
    if isinstance(value, str) and 0 < len(value) <= MAX_CONTAINER_ID and _is_identifier(value):
        return value
    raise _not_identifier(value, field, MAX_CONTAINER_ID)


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
    if isinstance(value, str) and 0 < len(value) <= MAX_NETWORK and _is_identifier(value):
        return value
    raise _not_identifier(value, field, MAX_NETWORK)


# -- requests --------------------------------------------------------------------------------------


class PodInfo(Value):
    __slots__ = ("namespace", "name", "uid")  # noqa: RUF023

    namespace: str
    name: str
    uid: str

    def __init__(self, namespace: str = "", name: str = "", uid: str = "") -> None:
        self._init(namespace=namespace, name=name, uid=uid)

    @classmethod
    def from_json(cls, obj: object, where: str = "pod") -> PodInfo:
        fields = fields_of(obj, where, (), ("namespace", "name", "uid"))
        return cls(
            *(string_field(fields, n, where, MAX_POD_FIELD) for n in ("namespace", "name", "uid"))
        )

    def to_json(self) -> dict[str, object]:
        return {"namespace": self.namespace, "name": self.name, "uid": self.uid}


class AllocateRequest(Value):
    """ADD: `POST /v1/allocations`."""

    __slots__ = ("container_id", "ifname", "network", "pod")

    container_id: str
    ifname: str
    network: str
    pod: PodInfo | None

    def __init__(
        self, container_id: str, ifname: str, network: str, pod: PodInfo | None = None
    ) -> None:
        self._init(container_id=container_id, ifname=ifname, network=network, pod=pod)

    @classmethod
    def from_json(cls, obj: object) -> AllocateRequest:
        fields = fields_of(obj, "body", ("container_id", "ifname", "network"), ("pod",))
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


class Attachment(Value):
    """A CNI attachment the runtime still considers valid: (container ID, ifname)."""

    __slots__ = ("container_id", "ifname")

    container_id: str
    ifname: str

    def __init__(self, container_id: str, ifname: str) -> None:
        self._init(container_id=container_id, ifname=ifname)

    @classmethod
    def from_json(cls, obj: object, where: str) -> Attachment:
        fields = fields_of(obj, where, ("container_id", "ifname"))
        return cls(
            check_container_id(fields["container_id"], f"{where}.container_id"),
            check_ifname(fields["ifname"], f"{where}.ifname"),
        )

    def to_json(self) -> dict[str, object]:
        return {"container_id": self.container_id, "ifname": self.ifname}


class GcRequest(Value):
    """CNI GC: `POST /v1/gc`. An empty list is meaningful: nothing of the network is valid."""

    __slots__ = ("network", "valid_attachments")

    network: str
    valid_attachments: tuple[Attachment, ...]

    def __init__(self, network: str, valid_attachments: tuple[Attachment, ...]) -> None:
        self._init(network=network, valid_attachments=valid_attachments)

    @classmethod
    def from_json(cls, obj: object) -> GcRequest:
        fields = fields_of(obj, "body", ("network", "valid_attachments"))
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


# -- responses -------------------------------------------------------------------------------------


class IpConfig(Value):
    __slots__ = ("address", "gateway", "eni_id")  # noqa: RUF023

    address: str
    """CIDR notation: the pod's address with its prefix length, `10.0.1.23/32`."""
    gateway: str
    eni_id: str

    def __init__(self, address: str, gateway: str, eni_id: str) -> None:
        self._init(address=address, gateway=gateway, eni_id=eni_id)

    @classmethod
    def from_json(cls, obj: object, where: str) -> IpConfig:
        o = response_object(obj, where)
        return cls(
            text_field(o, "address", where),
            text_field(o, "gateway", where),
            text_field(o, "eni_id", where),
        )

    def to_json(self) -> dict[str, object]:
        return {"address": self.address, "gateway": self.gateway, "eni_id": self.eni_id}


class Route(Value):
    __slots__ = ("dst", "gw")

    dst: str
    gw: str | None

    def __init__(self, dst: str, gw: str | None = None) -> None:
        self._init(dst=dst, gw=gw)

    @classmethod
    def from_json(cls, obj: object, where: str) -> Route:
        o = response_object(obj, where)
        gw = o.get("gw")
        if gw is not None and not isinstance(gw, str):
            raise WireError(f"{where}.gw must be a string")
        return cls(text_field(o, "dst", where), gw)

    def to_json(self) -> dict[str, object]:
        return {"dst": self.dst} if self.gw is None else {"dst": self.dst, "gw": self.gw}


class Allocation(Value):
    """An attachment's addresses: the answer to ADD and to `GET /v1/allocations/{cid}/{ifname}`."""

    __slots__ = (  # noqa: RUF023
        "network",
        "container_id",
        "ifname",
        "ips",
        "routes",
        "created_at",
        "pod",
        "network_policy",
    )

    network: str
    container_id: str
    ifname: str
    ips: tuple[IpConfig, ...]
    routes: tuple[Route, ...]
    created_at: float
    pod: PodInfo | None
    network_policy: str | None
    """ADD's answer: the mode when the plugin must then ask for the policy call (`ipamd.wire.pod`)."""

    def __init__(
        self,
        network: str,
        container_id: str,
        ifname: str,
        ips: tuple[IpConfig, ...],
        routes: tuple[Route, ...],
        created_at: float,
        pod: PodInfo | None = None,
        network_policy: str | None = None,
    ) -> None:
        self._init(
            network=network,
            container_id=container_id,
            ifname=ifname,
            ips=ips,
            routes=routes,
            created_at=created_at,
            pod=pod,
            network_policy=network_policy,
        )

    @classmethod
    def from_json(cls, obj: object) -> Allocation:
        o = response_object(obj, "allocation")
        ips, routes = o.get("ips"), o.get("routes", [])
        if not isinstance(ips, list) or not isinstance(routes, list):
            raise WireError("allocation.ips and allocation.routes must be lists")
        pod, policy = o.get("pod"), o.get("network_policy")
        return cls(
            network=text_field(o, "network", "allocation"),
            container_id=text_field(o, "container_id", "allocation"),
            ifname=text_field(o, "ifname", "allocation"),
            ips=tuple(IpConfig.from_json(ip, f"ips[{i}]") for i, ip in enumerate(ips)),
            routes=tuple(Route.from_json(r, f"routes[{i}]") for i, r in enumerate(routes)),
            created_at=number_field(o, "created_at", "allocation"),
            pod=None if pod is None else PodInfo(**_pod_strings(pod)),
            network_policy=policy if isinstance(policy, str) and policy else None,
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
        if self.network_policy is not None:
            body["network_policy"] = self.network_policy
        return body


def _pod_strings(obj: object) -> dict[str, str]:
    o = response_object(obj, "allocation.pod")
    return {n: text_field(o, n, "allocation.pod") for n in ("namespace", "name", "uid")}


class ErrorBody(Value):
    """Every 4xx and 5xx answer: a stable `code` to match on, a message for people."""

    __slots__ = ("code", "message", "retryable")

    code: str
    message: str
    retryable: bool

    def __init__(self, code: str, message: str, retryable: bool = False) -> None:
        self._init(code=code, message=message, retryable=retryable)

    @classmethod
    def from_json(cls, obj: object) -> ErrorBody:
        o = response_object(obj, "error")
        retryable = o.get("retryable", False)
        return cls(
            text_field(o, "code", "error"),
            str(o.get("message", "")),
            retryable if isinstance(retryable, bool) else False,
        )

    def to_json(self) -> dict[str, object]:
        return {"code": self.code, "message": self.message, "retryable": self.retryable}
