"""Kinds of setting values: how environment text becomes a typed value and back.

Owns the declaration of a setting (`Setting`, `setting`) and the parsers and checks for counts,
booleans, durations, socket paths, endpoints, listen addresses and ENI tags. Each parser raises
`ValueError("must be ...")` saying what is expected. No I/O, no asyncio.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

SUN_PATH_MAX = 107  # bytes in sockaddr_un.sun_path, less the terminating NUL


def host_literal(host: str) -> str:
    """`host` as it goes before `:port` in an address or a URL: an IPv6 address in brackets
    (RFC 3986's IP-literal), any other host as it is."""
    return f"[{host}]" if ":" in host else host


@dataclass(frozen=True, slots=True)
class HostPort:
    """A TCP listen address; an IPv6 host is kept without brackets."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"{host_literal(self.host)}:{self.port}"


@dataclass(frozen=True, slots=True)
class Kind:
    """How a setting's text becomes a value (`parse`) and back (`show`, which `parse` accepts)."""

    parse: Callable[[str], Any]  # raises ValueError("must be ...") saying what is expected
    show: Callable[[Any], str] = str


_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})  # Go's strconv.ParseBool
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def _parse_bool(text: str) -> bool:
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ValueError("must be a boolean: true/false, True/False, TRUE/FALSE, t/f, T/F or 1/0")


BOOL = Kind(_parse_bool, lambda value: "true" if value else "false")
_INT = re.compile(r"[+-]?[0-9]{1,18}")


def integer(low: int, *, none: str | None = None, hint: str = "") -> Kind:
    """An integer >= `low`; the text `none` (if given) stands for None."""
    expected = f"must be an integer >= {low}{hint}"

    def parse(text: str) -> int | None:
        if text == none:
            return None
        if not _INT.fullmatch(text) or int(text) < low:
            raise ValueError(expected)
        return int(text)

    return Kind(parse, lambda value: str(none) if value is None else str(value))


def bounded(low: int, high: int, *, optional: bool = False) -> Kind:
    """An integer in [`low`, `high`]; if `optional`, empty text is None."""
    expected = f"must be an integer from {low} to {high}"

    def parse(text: str) -> int | None:
        if optional and not text:
            return None
        if not _INT.fullmatch(text) or not low <= int(text) <= high:
            raise ValueError(expected)
        return int(text)

    return Kind(parse, lambda value: "" if value is None else str(value))


def _parse_cidrs(text: str) -> tuple[str, ...]:
    """Comma-separated IPv4 CIDRs (VPC CNI's list form); empty text is an empty list."""
    cidrs: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            cidrs.append(str(ipaddress.IPv4Network(part, strict=False)))
        except ValueError:
            raise ValueError(
                f"must be comma-separated IPv4 CIDRs (10.1.0.0/16,192.168.0.0/24); {part!r} is not"
            ) from None
    return tuple(dict.fromkeys(cidrs))


CIDRS = Kind(_parse_cidrs, ",".join)


def _parse_pod_subnet(text: str) -> str | None:
    """An IPv4 subnet of /16 to /28 outside 10.0.0.0/16 (the embedded VPC's first block); empty: none."""
    if not text:
        return None
    try:
        net = ipaddress.IPv4Network(text)
    except ValueError:
        raise ValueError("must be an IPv4 subnet such as 100.64.0.0/16 (no host bits)") from None
    if not 16 <= net.prefixlen <= 28 or net.overlaps(ipaddress.IPv4Network("10.0.0.0/16")):
        raise ValueError("must be a /16 to /28 outside 10.0.0.0/16, the node's subnet")
    return str(net)


POD_SUBNET = Kind(_parse_pod_subnet, lambda value: value or "")

_DURATION = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?P<unit>ms|s|m|h)?")
_UNIT_SECONDS = {"ms": Decimal("0.001"), "s": Decimal(1), "m": Decimal(60), "h": Decimal(3600)}


def _show_seconds(value: float) -> str:
    text = format(Decimal(repr(value)), "f")  # positional, so that _DURATION accepts it back
    return text.rstrip("0").rstrip(".") if "." in text else text


def _duration(*, positive: bool) -> Kind:
    """Seconds as a float, from `30`, `2.5`, `500ms`, `10s`, `10m` or `1h`."""
    expected = (
        f"must be a duration {'> 0' if positive else '>= 0'}: "
        "seconds (30, 2.5) or a number with unit ms, s, m or h (10m)"
    )

    def parse(text: str) -> float:
        match = _DURATION.fullmatch(text)
        if match is None:
            raise ValueError(expected)
        seconds = float(Decimal(match["number"]) * _UNIT_SECONDS[match["unit"] or "s"])
        if not math.isfinite(seconds) or (positive and seconds == 0):
            raise ValueError(expected)
        return seconds

    return Kind(parse, _show_seconds)


def choice(*options: str, optional: bool = False) -> Kind:
    """One of `options`, in any case; if `optional`, also empty text (unset), kept as ""."""
    expected = f"must be one of {', '.join(options)} (any case)"

    def parse(text: str) -> str:
        if optional and not text:
            return ""
        if text.lower() not in options:
            raise ValueError(expected)
        return text.lower()

    return Kind(parse)


def _matching(pattern: str, expected: str, *, optional: bool = False) -> Kind:
    """Text matching `pattern`; if `optional`, empty text is None."""
    regex = re.compile(pattern)

    def parse(text: str) -> str | None:
        if optional and not text:
            return None
        if not regex.fullmatch(text):
            raise ValueError(expected)
        return text

    return Kind(parse, lambda value: value or "")


def _parse_socket_path(text: str) -> str:
    if len(text.encode()) > SUN_PATH_MAX:
        raise ValueError(f"must be a unix socket path of at most {SUN_PATH_MAX} bytes")
    return text


def parse_optional_path(text: str) -> str | None:
    if not text:
        return None
    if not text.startswith("/"):
        raise ValueError("must be an absolute path")
    return text


LOG_LEVEL = choice("debug", "info", "warn", "error", "fatal")
"""VPC CNI's log levels (`AWS_VPC_K8S_CNI_LOGLEVEL`, `AWS_VPC_K8S_PLUGIN_LOG_LEVEL`), in any case;
where VPC CNI takes any other text for debug, ipamd refuses it."""
NO_LOG_FILE = ("stdout", "stderr")


def _parse_log_file(text: str) -> str | None:
    """`AWS_VPC_K8S_CNI_LOG_FILE`: a path, or `stdout` or `stderr` (any case, as VPC CNI reads them)
    for no file: ipamd's log is on its standard error already, which the kubelet keeps."""
    return None if text.lower() in NO_LOG_FILE else text


LOG_FILE = Kind(_parse_log_file, lambda value: "stdout" if value is None else value)


def _parse_plugin_log_file(text: str) -> str:
    """`AWS_VPC_K8S_PLUGIN_LOG_FILE`: a path, or `stderr` (the runtime's log); not `stdout`, which
    carries the plugin's answer (VPC CNI's entrypoint refuses it too)."""
    if text.lower() == "stdout":
        raise ValueError(
            "must be a file path or stderr: the plugin's standard output is its answer to the "
            "runtime"
        )
    return "stderr" if text.lower() == "stderr" else text


PLUGIN_LOG_FILE = Kind(_parse_plugin_log_file)


def parse_endpoint(text: str) -> str | None:
    if not text:
        return None
    try:
        parts = urlsplit(text)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a malformed IPv6 host or port
        valid = False
    if not valid:
        raise ValueError("must be an http:// or https:// URL with a host")
    return text


_HOSTNAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?")


def parse_host_port(text: str) -> HostPort:
    expected = "must be host:port with port 1..65535 (an IPv6 host in brackets: [::1]:61678)"
    host, _, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(expected) from None
    elif not _HOSTNAME.fullmatch(host):
        raise ValueError(expected)
    if not re.fullmatch(r"[0-9]{1,5}", port) or not 1 <= int(port) <= 65535:
        raise ValueError(expected)
    return HostPort(host, int(port))


Tags = tuple[tuple[str, str], ...]


def _tag_problem(key: str, value: object) -> str | None:
    if not isinstance(value, str):
        return f"the value of tag {key!r} must be a string"
    if "k8s.amazonaws.com" in key:
        return f"tag key {key!r} is reserved: keys containing k8s.amazonaws.com are set by ipamd"
    if key.lower().startswith("aws:"):
        return f"tag key {key!r} is reserved: the aws: prefix belongs to AWS"
    if not 1 <= len(key) <= 128 or len(value) > 256:
        return f"tag {key!r} is too long: keys take 1..128 characters, values up to 256"
    return None


def parse_tags(text: str) -> Tags:
    expected = 'must be a JSON object of string keys to string values, like {"team": "net"}'
    try:
        pairs = json.loads(text, object_pairs_hook=tuple)  # objects become pair tuples
    except json.JSONDecodeError:
        raise ValueError(expected) from None
    if not isinstance(pairs, tuple):
        raise ValueError(expected)
    keys = [key for key, _ in pairs]
    for key, value in pairs:
        problem = _tag_problem(key, value)
        if problem is None and keys.count(key) > 1:
            problem = f"tag key {key!r} appears twice"
        if problem is not None:
            raise ValueError(problem)
    return tuple(pairs)


def show_tags(tags: Tags) -> str:
    return json.dumps(dict(tags), separators=(",", ":"), ensure_ascii=False)


COUNT = integer(0)
SOCKET = Kind(_parse_socket_path)
INTERVAL = _duration(positive=True)
GRACE = _duration(positive=False)
REGION = _matching(
    r"[a-z]+(?:-[a-z]+)*-[0-9]+", "must be an AWS region like us-east-1", optional=True
)
INSTANCE_TYPE = _matching(
    r"[a-z][a-z0-9-]*\.[a-z0-9-]+", "must be an EC2 instance type like m5.large (family.size)"
)


# --- declaring settings ---------------------------------------------------------------------------

SETTING_KEY = "ipamd.setting"


@dataclass(frozen=True, slots=True)
class Setting:
    """One environment variable and the `Config` field it fills."""

    env: str
    kind: Kind
    default: str  # in environment form; "" = unset
    unit: str
    vpc_cni: str  # the VPC CNI equivalent (Markdown)
    doc: str  # meaning (Markdown)
    embedded_default: str | None = None  # default under `ipamd run --embedded`
    group: str = ""  # filled in: the `Config` group that holds it
    field: str = ""  # filled in: the group's field that declares it

    def default_for(self, embedded: bool) -> str:
        if embedded and self.embedded_default is not None:
            return self.embedded_default
        return self.default

    def value_in(self, config: object) -> Any:
        """This setting's value in a `Config`."""
        return getattr(getattr(config, self.group), self.field)


def parse_settings(
    settings: Iterable[Setting], environ: Mapping[str, str], embedded: bool
) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """Each setting parsed from `environ` (unset or empty: its default, `embedded`'s if asked): the
    values by field, the texts they were read from by variable, and one line for each problem of a
    value that does not parse, naming the variable and the value."""
    values: dict[str, Any] = {}
    texts: dict[str, str] = {}
    problems: list[str] = []
    for setting in settings:
        text = environ.get(setting.env) or setting.default_for(embedded)
        texts[setting.env] = text
        try:
            values[setting.field] = setting.kind.parse(text)
        except ValueError as exc:
            # A file's problems come one a line; each line names the variable and value.
            problems += [f"{setting.env}={text!r}: {line}" for line in str(exc).splitlines()]
    return values, texts, problems


_PARSED = object()


def setting(
    env: str,
    kind: Kind,
    default: str,
    unit: str,
    vpc: str,
    doc: str,
    embedded: str | None = None,
    *,
    typed: Any = _PARSED,
) -> Any:
    """A settings group's field declaring one setting (`embedded` is the default under --embedded).
    The default is written once, in environment form; the field's typed default is that text
    parsed, so a group built with keyword arguments and one read from an empty environment agree.
    `typed` replaces it only for a kind that reads a file, which is read at start, never at import."""
    value = kind.parse(default) if typed is _PARSED else typed
    return dataclass_field(
        default=value, metadata={SETTING_KEY: Setting(env, kind, default, unit, vpc, doc, embedded)}
    )


def render_settings_table(settings: Iterable[Setting]) -> str:
    """The Markdown table of `settings` (`ipamd.config.settings.SETTINGS`), as docs/configuration.md
    carries it."""
    rows = [
        ("Variable", "Default", "Unit", "Meaning", "VPC CNI equivalent"),
        ("---",) * 5,
    ]
    for s in settings:
        default = f"`{s.default}`" if s.default else "unset"
        if s.embedded_default is not None:
            default += f" (embedded: `{s.embedded_default}`)"
        rows.append((f"`{s.env}`", default, s.unit, s.doc, s.vpc_cni))
    return "".join("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |\n" for row in rows)


_TAINT = re.compile(
    r"^([A-Za-z0-9][-A-Za-z0-9_./]*)(?:=([^:]*))?:(NoSchedule|PreferNoSchedule|NoExecute)$"
)


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str

    @classmethod
    def parse(cls, text: str) -> Taint:
        """`key[=value]:Effect`, as `kubectl taint` writes it; ValueError otherwise."""
        found = _TAINT.match(text.strip())
        if found is None:
            raise ValueError(
                f"{text!r} is no taint: key[=value]:Effect, Effect one of NoSchedule, "
                "PreferNoSchedule, NoExecute"
            )
        return cls(found.group(1), found.group(2) or "", found.group(3))

    def __str__(self) -> str:
        return f"{self.key}{'=' + self.value if self.value else ''}:{self.effect}"

    def matches(self, taint: object) -> bool:
        return (
            isinstance(taint, dict)
            and taint.get("key") == self.key
            and (taint.get("value") or "") == self.value
            and taint.get("effect") == self.effect
        )


def _node_name(text: str) -> str:
    if text and not re.fullmatch(r"[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?", text):
        raise ValueError("must be a Kubernetes node name (lower-case letters, digits, '-', '.')")
    return text


NODE_NAME = Kind(_node_name)
"""MY_NODE_NAME: a Kubernetes node name (an RFC 1123 subdomain), or "" when unknown."""
TAINT = Kind(lambda text: str(Taint.parse(text)) if text else "")
"""IPAMD_STARTUP_TAINT: `key[=value]:Effect`, or "" for none."""
