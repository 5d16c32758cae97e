"""What crosses the local socket between the daemon's API and `ipamd-cni`: paths, bodies, limits.

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

The plugin imports this module on every pod's ADD and DEL, so importing it must stay cheap: standard
library C modules only on the import path. The `json` package pulls in `re` (and `enum`,
`functools`, ...), and `dataclasses` pulls in `inspect`; together they cost the plugin several times
a bare interpreter's start. So JSON is read and written with `_json`, the C accelerator that `json`
itself runs on, with the same settings `json.loads` and `json.dumps` use; `json` is imported only
to word the error of a body that is not JSON (or where `_json` is missing). The value types are
plain classes with `__slots__` and the value semantics of frozen dataclasses (`_Value`). Nothing
here may import `re`, `typing`, `enum`, `dataclasses` or `collections` at run time.
"""

from __future__ import annotations

try:
    from _json import encode_basestring_ascii as _encode_string
    from _json import make_encoder as _make_encoder
    from _json import make_scanner as _make_scanner
except ImportError:  # an interpreter without the accelerator: `json` does the work
    _make_encoder = _make_scanner = None  # type: ignore[assignment, misc]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

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

_ALNUM = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
_IDENTIFIER_CHARS = _ALNUM | frozenset("_.-")
_JSON_WHITESPACE = " \t\n\r"
"""What `json` skips around a document (JSON's whitespace; not `str.isspace`'s)."""


class WireError(ValueError):
    """A request that does not have the shape the API accepts; the message names the field."""


# -- JSON ------------------------------------------------------------------------------------------


def _reject_constant(name: str) -> object:
    raise WireError(f"{name} is not valid JSON")


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    obj: dict[str, object] = {}
    for name, value in pairs:
        if name in obj:
            raise WireError(f"duplicate field {name!r}")
        obj[name] = value
    return obj


_FLOAT_CONSTANTS = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


class _Decoding:
    """The settings `_json.make_scanner` reads from a `json.JSONDecoder` (attributes, read once),
    with `json.loads`'s values for those not given; and the scanner made of them."""

    __slots__ = (
        "object_hook",
        "object_pairs_hook",
        "parse_constant",
        "parse_float",
        "parse_int",
        "scan",
        "strict",
    )

    def __init__(
        self,
        object_pairs_hook: Callable[[list[tuple[str, object]]], object] | None,
        parse_constant: Callable[[str], object],
    ) -> None:
        self.strict = True
        self.object_hook = None
        self.object_pairs_hook = object_pairs_hook
        self.parse_float = float
        self.parse_int = int
        self.parse_constant = parse_constant
        self.scan: Callable[[str, int], tuple[object, int]] | None = (
            None if _make_scanner is None else _make_scanner(self)  # type: ignore[arg-type]
        )

    def loads(self, text: str) -> object:
        """`json.loads(text)` with these hooks: the same scanner, the same whitespace rules."""
        if self.scan is not None:
            start = len(text) - len(text.lstrip(_JSON_WHITESPACE))
            try:
                value, end = self.scan(text, start)
            except WireError:
                raise
            except (StopIteration, SystemError, ValueError):
                # Not JSON, or not only JSON. `_json` raises json.decoder's JSONDecodeError, which
                # it looks up in sys.modules: before any `import json` it fails with SystemError.
                # json.loads below parses again and words the error.
                pass
            else:
                if not text[end:].lstrip(_JSON_WHITESPACE):
                    return value
        import json

        try:
            return json.loads(
                text, object_pairs_hook=self.object_pairs_hook, parse_constant=self.parse_constant
            )
        except json.JSONDecodeError as err:
            raise WireError(
                f"body is not JSON: {err.msg} at line {err.lineno} column {err.colno}"
            ) from None
        except ValueError as err:
            # Valid JSON that Python refuses to read: an integer of more than
            # sys.get_int_max_str_digits() digits (CVE-2020-10735's limit).
            raise WireError(f"body holds a value that cannot be read: {err}") from None


_STRICT = _Decoding(_no_duplicates, _reject_constant)
_LENIENT = _Decoding(None, _FLOAT_CONSTANTS.__getitem__)


def _decode(raw: bytes, decoding: _Decoding) -> object:
    try:
        return decoding.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise WireError(f"body is not UTF-8: {err.reason}") from None
    except RecursionError:
        raise WireError("body is nested too deeply") from None


def parse_object(raw: bytes) -> dict[str, object]:
    """A JSON object from UTF-8 bytes: no NaN/Infinity, no duplicate keys, an object at the top."""
    value = _decode(raw, _STRICT)
    if not isinstance(value, dict):
        raise WireError("body must be a JSON object")
    return value


def parse_answer(raw: bytes) -> object:
    """Any JSON value from UTF-8 bytes, read as `json.loads` reads it: the daemon's answers, which
    the response types check field by field."""
    return _decode(raw, _LENIENT)


def _unserializable(obj: object) -> object:
    raise TypeError(f"Object of type {obj.__class__.__name__} is not JSON serializable")


def dumps(obj: object) -> str:
    """Compact JSON, ASCII only: what `json.dumps(obj, separators=(",", ":"))` writes."""
    if _make_encoder is None:
        import json

        return json.dumps(obj, separators=(",", ":"))
    # A fresh encoder per call: its `markers` (the circular-reference check) must start empty.
    encode = _make_encoder({}, _unserializable, _encode_string, None, ":", ",", False, False, True)
    return "".join(encode(obj, 0))


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


# -- identifiers -----------------------------------------------------------------------------------


def _is_identifier(value: str) -> bool:
    return value[:1] in _ALNUM and _IDENTIFIER_CHARS.issuperset(value)


def check_container_id(value: object, field: str = "container_id") -> str:
    if not isinstance(value, str):
        raise WireError(f"{field} must be a string")
    if not 0 < len(value) <= MAX_CONTAINER_ID or not _is_identifier(value):
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
    if not 0 < len(value) <= MAX_NETWORK or not _is_identifier(value):
        raise WireError(
            f"{field} must be 1-{MAX_NETWORK} characters: a letter or digit, then letters, digits, "
            "'_', '.' or '-'"
        )
    return value


# -- value types -----------------------------------------------------------------------------------


class _Value:
    """What `@dataclass(frozen=True, slots=True)` gave these types, without importing dataclasses:
    the fields are the `__slots__`, equality and hash by class and fields, a repr naming them, no
    assignment after `__init__` (which sets each field by name), copy and pickle. Only the repr
    follows the order of `__slots__`, which lists the fields as the constructor does."""

    __slots__: tuple[str, ...] = ()

    def _init(self, **fields: object) -> None:
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, _Value)
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{self.__class__.__qualname__}({fields})"

    if not TYPE_CHECKING:  # mypy would take a __setattr__ to allow assigning any name

        def __setattr__(self, name: str, value: object) -> None:
            raise AttributeError(f"cannot assign to field {name!r}")

        def __delattr__(self, name: str) -> None:
            raise AttributeError(f"cannot delete field {name!r}")

    def __getstate__(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.__slots__}

    def __setstate__(self, state: dict[str, object]) -> None:
        self._init(**state)


# -- requests --------------------------------------------------------------------------------------


class PodInfo(_Value):
    __slots__ = ("namespace", "name", "uid")  # noqa: RUF023

    namespace: str
    name: str
    uid: str

    def __init__(self, namespace: str = "", name: str = "", uid: str = "") -> None:
        self._init(namespace=namespace, name=name, uid=uid)

    @classmethod
    def from_json(cls, obj: object, where: str = "pod") -> PodInfo:
        fields = _fields(obj, where, (), ("namespace", "name", "uid"))
        return cls(
            *(_string(fields, n, where, MAX_POD_FIELD) for n in ("namespace", "name", "uid"))
        )

    def to_json(self) -> dict[str, object]:
        return {"namespace": self.namespace, "name": self.name, "uid": self.uid}


class AllocateRequest(_Value):
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


class Attachment(_Value):
    """A CNI attachment the runtime still considers valid: (container ID, ifname)."""

    __slots__ = ("container_id", "ifname")

    container_id: str
    ifname: str

    def __init__(self, container_id: str, ifname: str) -> None:
        self._init(container_id=container_id, ifname=ifname)

    @classmethod
    def from_json(cls, obj: object, where: str) -> Attachment:
        fields = _fields(obj, where, ("container_id", "ifname"))
        return cls(
            check_container_id(fields["container_id"], f"{where}.container_id"),
            check_ifname(fields["ifname"], f"{where}.ifname"),
        )

    def to_json(self) -> dict[str, object]:
        return {"container_id": self.container_id, "ifname": self.ifname}


class GcRequest(_Value):
    """CNI GC: `POST /v1/gc`. An empty list is meaningful: nothing of the network is valid."""

    __slots__ = ("network", "valid_attachments")

    network: str
    valid_attachments: tuple[Attachment, ...]

    def __init__(self, network: str, valid_attachments: tuple[Attachment, ...]) -> None:
        self._init(network=network, valid_attachments=valid_attachments)

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


# -- responses -------------------------------------------------------------------------------------


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


class IpConfig(_Value):
    __slots__ = ("address", "gateway", "eni_id")  # noqa: RUF023

    address: str
    """CIDR notation: the pod's address with its prefix length, `10.0.1.23/32`."""
    gateway: str
    eni_id: str

    def __init__(self, address: str, gateway: str, eni_id: str) -> None:
        self._init(address=address, gateway=gateway, eni_id=eni_id)

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


class Route(_Value):
    __slots__ = ("dst", "gw")

    dst: str
    gw: str | None

    def __init__(self, dst: str, gw: str | None = None) -> None:
        self._init(dst=dst, gw=gw)

    @classmethod
    def from_json(cls, obj: object, where: str) -> Route:
        o = _response_object(obj, where)
        gw = o.get("gw")
        if gw is not None and not isinstance(gw, str):
            raise WireError(f"{where}.gw must be a string")
        return cls(_text(o, "dst", where), gw)

    def to_json(self) -> dict[str, object]:
        return {"dst": self.dst} if self.gw is None else {"dst": self.dst, "gw": self.gw}


class Allocation(_Value):
    """An attachment's addresses: the answer to ADD and to `GET /v1/allocations/{cid}/{ifname}`."""

    __slots__ = (  # noqa: RUF023
        "network",
        "container_id",
        "ifname",
        "ips",
        "routes",
        "created_at",
        "pod",
    )

    network: str
    container_id: str
    ifname: str
    ips: tuple[IpConfig, ...]
    routes: tuple[Route, ...]
    created_at: float
    pod: PodInfo | None

    def __init__(
        self,
        network: str,
        container_id: str,
        ifname: str,
        ips: tuple[IpConfig, ...],
        routes: tuple[Route, ...],
        created_at: float,
        pod: PodInfo | None = None,
    ) -> None:
        self._init(
            network=network,
            container_id=container_id,
            ifname=ifname,
            ips=ips,
            routes=routes,
            created_at=created_at,
            pod=pod,
        )

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


class ErrorBody(_Value):
    """Every 4xx and 5xx answer: a stable `code` to match on, a message for people."""

    __slots__ = ("code", "message", "retryable")

    code: str
    message: str
    retryable: bool

    def __init__(self, code: str, message: str, retryable: bool = False) -> None:
        self._init(code=code, message=message, retryable=retryable)

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
