"""What the runtime handed the plugin: the CNI_* environment and the network configuration on stdin.

Parsed once, up front, into an `Invocation`; anything wrong becomes a `CniError` with the spec's code:

| problem | CNI code |
|---|---|
| stdin is not a JSON object | 6 failed to decode content |
| `cniVersion` not 0.4.0, 1.0.0 or 1.1.0; GC or STATUS on a config older than 1.1.0 | 1 incompatible version |
| a field in the `ipam` section other than `type` and `socket` | 2 unsupported field |
| bad `name`, `ipam`, `ipam.socket`, CHECK's `prevResult` or GC's `cni.dev/valid-attachments` | 7 |
| interface mode: a bad `vethPrefix` (over 4 characters, `eth`, `lo`, `vlan`) or `mtu` (576-9001) | 7 |
| interface mode: a `v4Egress` block that is not an object or lacks or spoils a key | 7 |
| CNI_COMMAND, CNI_CONTAINERID, CNI_IFNAME, CNI_NETNS or CNI_ARGS missing or invalid | 4 invalid env |

CNI_ARGS follows the CNI conventions: `K=V;K=V`; the keys read are K8S_POD_NAMESPACE, K8S_POD_NAME,
K8S_POD_UID and K8S_POD_INFRA_CONTAINER_ID; any other key is refused unless `IgnoreUnknown=1` (which
kubelet and containerd always pass). Only ADD insists on valid CNI_ARGS: a DEL must not fail on what
it does not need, so DEL and CHECK of the interface plugin read the pod's name from it only when it
parses (the host veth's name; `ipamd.cni.pod_plugin` says what it falls back to). CNI_NETNS is
required for ADD and CHECK, as the spec says; the IPAM plugin does not use it. CNI_PATH is read for
the interface plugin's IPv4 egress, which executes host-local from it (`ipamd.cni.egress`).

Two modes, told apart by the conf's own `type`: `ipamd-cni` is the interface plugin (it makes the
pod's veth: `vethPrefix`, default `eni`, `mtu`, default 9001, and the optional `v4Egress` block
are read; `NetConf.interface`),
anything else (`ptp`, ...) chains ipamd-cni as its IPAM plugin (`NetConf.interface` is None).

The daemon's socket: the `ipam` section's `socket`, else the `IPAMD_SOCKET` environment variable (for
a runtime that cannot template the config, and for tests), else `/run/ipamd/ipamd.sock`.

The plugin's log, VPC CNI's two keys of the plugin's conf (in either mode: the conf's top level is
what the runtime hands the plugin): `pluginLogFile`, a path or `stderr` (no key: no log), and
`pluginLogLevel` (`ipamd.cni.logfile.PluginLog`). They are read before anything is checked, so that
a conf refused for another reason still names the log the refusal goes to, and a value of the wrong
type only means no log: the log never fails a command.
"""

from __future__ import annotations

from ipamd.wire import (
    CNI_VERSION,
    DEFAULT_SOCKET,
    SUPPORTED_CNI_VERSIONS,
    Attachment,
    PodInfo,
    WireError,
    check_container_id,
    check_ifname,
    check_network,
    parse_object,
)

# Imported for every pod's ADD and DEL: `typing`, `collections.abc` and `dataclasses` would cost
# more than the rest of the plugin; the annotations are never evaluated.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

ERR_INCOMPATIBLE_VERSION = 1
ERR_UNSUPPORTED_FIELD = 2
ERR_UNKNOWN_CONTAINER = 3
ERR_INVALID_ENV = 4
ERR_IO = 5
ERR_DECODE = 6
ERR_INVALID_CONFIG = 7
ERR_TRY_AGAIN = 11
ERR_NOT_AVAILABLE = 50

COMMANDS = ("ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION")
_SINCE_1_1 = ("GC", "STATUS")
_PER_CONTAINER = ("ADD", "DEL", "CHECK")
_IPAM_FIELDS = ("type", "socket")
_ARGS = ("IgnoreUnknown", "K8S_POD_NAMESPACE", "K8S_POD_NAME", "K8S_POD_UID")
_ARG_INFRA = "K8S_POD_INFRA_CONTAINER_ID"
PLUGIN_TYPE = "ipamd-cni"
MIN_MTU = 576
MAX_MTU = 9001
"""VPC CNI's bounds for a pod's MTU (POD_MTU): IPv4's minimum datagram, a VPC's jumbo frame."""
DEFAULT_MTU = 9001


class CniError(Exception):
    """A failure the plugin reports as CNI error JSON: `code`, `msg`, `details`."""

    def __init__(self, code: int, msg: str, details: str = "") -> None:
        super().__init__(msg)
        self.code = code
        self.msg = msg
        self.details = details
        self.version: str | None = None
        """The config's cniVersion once known: the error is answered in it."""
        self.log = ("", "")
        """The config's `pluginLogFile` and `pluginLogLevel` once it is decoded."""


class V4Egress:
    """The conf's `v4Egress` block, checked: the pod's interface, the subnet and its gateway,
    host-local's dataDir."""

    __slots__ = ("data_dir", "gateway", "ifname", "subnet")

    def __init__(self, ifname: str, subnet: str, gateway: str, data_dir: str) -> None:
        self.ifname = ifname
        self.subnet = subnet
        self.gateway = gateway
        self.data_dir = data_dir


class InterfaceConf:
    """The interface plugin's own settings: the host veth's name prefix, the pod's MTU and, when
    the conf has the block, the IPv4 egress of an IPv6 pod."""

    __slots__ = ("mtu", "v4_egress", "veth_prefix")

    def __init__(self, veth_prefix: str, mtu: int, v4_egress: V4Egress | None = None) -> None:
        self.veth_prefix = veth_prefix
        self.mtu = mtu
        self.v4_egress = v4_egress


class NetConf:
    """The network configuration, checked."""

    __slots__ = (
        "cni_version",
        "interface",
        "log",
        "network",
        "prev_result",
        "socket",
        "valid_attachments",
    )

    def __init__(
        self,
        cni_version: str,
        network: str,
        socket: str,
        prev_result: Mapping[str, object] | None,
        valid_attachments: tuple[Attachment, ...] | None,
        interface: InterfaceConf | None = None,
        log: tuple[str, str] = ("", ""),
    ) -> None:
        self.cni_version = cni_version
        self.network = network
        self.socket = socket
        self.prev_result = prev_result
        self.valid_attachments = valid_attachments
        """GC's `cni.dev/valid-attachments`; None when the key is absent (never "release
        everything")."""
        self.interface = interface
        """Set when this plugin is the interface plugin (the conf's `type` is `ipamd-cni`)."""
        self.log = log
        """`pluginLogFile` and `pluginLogLevel`, "" for a key absent or not a string."""


class Invocation:
    """One command on one network configuration (and, for ADD, DEL and CHECK, one attachment)."""

    __slots__ = ("cni_path", "command", "conf", "container_id", "ifname", "netns", "pod")

    def __init__(
        self,
        command: str,
        conf: NetConf,
        container_id: str = "",
        ifname: str = "",
        pod: PodInfo | None = None,
        netns: str = "",
        cni_path: str = "",
    ) -> None:
        self.command = command
        self.conf = conf
        self.container_id = container_id
        self.ifname = ifname
        self.pod = pod
        self.netns = netns
        """CNI_NETNS: the pod's network namespace, a path (may be empty on DEL)."""
        self.cni_path = cni_path
        """CNI_PATH: where delegated plugins are found (colon-separated directories)."""


def read_command(environ: Mapping[str, str]) -> str:
    command = environ.get("CNI_COMMAND", "")
    if command not in COMMANDS:
        raise CniError(ERR_INVALID_ENV, f"unknown or missing CNI_COMMAND {command!r}")
    return command


def parse_conf(command: str, raw: bytes, environ: Mapping[str, str]) -> NetConf:
    try:
        conf = parse_object(raw)
    except WireError as err:
        raise CniError(ERR_DECODE, "cannot decode the network configuration", str(err)) from None
    log = (_text(conf.get("pluginLogFile")), _text(conf.get("pluginLogLevel")))
    version = conf.get("cniVersion")
    try:
        if not isinstance(version, str):
            raise CniError(ERR_INVALID_CONFIG, "cniVersion must be a string")
        if version not in SUPPORTED_CNI_VERSIONS:
            raise CniError(
                ERR_INCOMPATIBLE_VERSION,
                f"cniVersion {version} is not supported",
                f"supported: {', '.join(SUPPORTED_CNI_VERSIONS)}",
            )
        parsed = _parse_versioned(command, version, conf, environ)
    except CniError as err:
        if isinstance(version, str) and version in SUPPORTED_CNI_VERSIONS:
            err.version = version
        err.log = log
        raise
    parsed.log = log
    return parsed


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _parse_versioned(
    command: str, version: str, conf: Mapping[str, object], environ: Mapping[str, str]
) -> NetConf:
    if command in _SINCE_1_1 and version != CNI_VERSION:
        raise CniError(
            ERR_INCOMPATIBLE_VERSION, f"{command} needs cniVersion {CNI_VERSION}", version
        )
    try:
        network = check_network(conf.get("name"), "name")
    except WireError as err:
        raise CniError(ERR_INVALID_CONFIG, "invalid network name", str(err)) from None
    prev = conf.get("prevResult")
    if command == "CHECK" and not isinstance(prev, dict):
        raise CniError(ERR_INVALID_CONFIG, "CHECK needs prevResult, the result of the ADD")
    return NetConf(
        cni_version=version,
        network=network,
        socket=_socket(conf.get("ipam"), environ),
        prev_result=prev if isinstance(prev, dict) else None,
        valid_attachments=_valid_attachments(conf) if command == "GC" else None,
        interface=_interface(conf) if conf.get("type") == PLUGIN_TYPE else None,
    )


def _interface(conf: Mapping[str, object]) -> InterfaceConf:
    # Only the interface plugin needs the veth vocabulary: the IPAM plugin's start does not pay it.
    from ipamd.wire.pod import DEFAULT_VETH_PREFIX, check_veth_prefix

    try:
        prefix = check_veth_prefix(conf.get("vethPrefix", DEFAULT_VETH_PREFIX))
    except WireError as err:
        raise CniError(ERR_INVALID_CONFIG, "invalid vethPrefix", str(err)) from None
    mtu = conf.get("mtu", DEFAULT_MTU)
    if isinstance(mtu, bool) or not isinstance(mtu, int) or not MIN_MTU <= mtu <= MAX_MTU:
        raise CniError(
            ERR_INVALID_CONFIG, f"mtu must be an integer from {MIN_MTU} to {MAX_MTU}", repr(mtu)
        )
    if "v4Egress" not in conf:
        return InterfaceConf(prefix, mtu)
    return InterfaceConf(prefix, mtu, parse_v4_egress(conf["v4Egress"]))


def _socket(ipam: object, environ: Mapping[str, str]) -> str:
    if not isinstance(ipam, dict):
        raise CniError(ERR_INVALID_CONFIG, "the ipam section is missing or not an object")
    for name in ipam:
        if name not in _IPAM_FIELDS:
            raise CniError(
                ERR_UNSUPPORTED_FIELD, f"unsupported field in ipam: {name}={ipam[name]!r}"
            )
    if not isinstance(ipam.get("type", ""), str):
        raise CniError(ERR_INVALID_CONFIG, "ipam.type must be a string")
    path = ipam.get("socket") or environ.get("IPAMD_SOCKET") or DEFAULT_SOCKET
    if not isinstance(path, str) or not path.startswith("/"):
        raise CniError(ERR_INVALID_CONFIG, "ipam.socket must be an absolute path", repr(path))
    return path


def _valid_attachments(conf: Mapping[str, object]) -> tuple[Attachment, ...]:
    # The spec first wrote the key as `cni.dev/attachments`; libcni sends both.
    items = conf.get("cni.dev/valid-attachments", conf.get("cni.dev/attachments"))
    if not isinstance(items, list):
        raise CniError(ERR_INVALID_CONFIG, "GC needs cni.dev/valid-attachments, a list")
    attachments = []
    for i, item in enumerate(items):
        where = f"cni.dev/valid-attachments[{i}]"
        if not isinstance(item, dict):
            raise CniError(ERR_INVALID_CONFIG, f"{where} must be an object")
        try:
            attachments.append(
                Attachment(
                    check_container_id(item.get("containerID"), f"{where}.containerID"),
                    check_ifname(item.get("ifname"), f"{where}.ifname"),
                )
            )
        except WireError as err:
            raise CniError(ERR_INVALID_CONFIG, "invalid valid attachment", str(err)) from None
    return tuple(attachments)


def parse_cni_args(raw: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in raw.split(";"):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CniError(ERR_INVALID_ENV, "CNI_ARGS: not a KEY=VALUE pair", item)
        if key in pairs:
            raise CniError(ERR_INVALID_ENV, f"CNI_ARGS: {key} is given twice")
        pairs[key] = value
    ignore = pairs.get("IgnoreUnknown", "0").lower()
    if ignore not in {"0", "1", "false", "true"}:
        raise CniError(ERR_INVALID_ENV, "CNI_ARGS: IgnoreUnknown must be 1, 0, true or false")
    unknown = sorted(set(pairs) - {*_ARGS, _ARG_INFRA})
    if unknown and ignore not in {"1", "true"}:
        raise CniError(ERR_INVALID_ENV, f"CNI_ARGS: unknown key(s) {', '.join(unknown)}")
    return pairs


def _pod_if_given(environ: Mapping[str, str]) -> PodInfo | None:
    """DEL's and CHECK's pod: what a valid CNI_ARGS names, else None (never an error)."""
    try:
        return _pod(environ)
    except CniError:
        return None


def _pod(environ: Mapping[str, str]) -> PodInfo | None:
    args = parse_cni_args(environ.get("CNI_ARGS", ""))
    try:
        if _ARG_INFRA in args:
            check_container_id(args[_ARG_INFRA], _ARG_INFRA)
        pod = PodInfo.from_json(
            {
                "namespace": args.get("K8S_POD_NAMESPACE", ""),
                "name": args.get("K8S_POD_NAME", ""),
                "uid": args.get("K8S_POD_UID", ""),
            },
            "CNI_ARGS",
        )
    except WireError as err:
        raise CniError(ERR_INVALID_ENV, "invalid CNI_ARGS", str(err)) from None
    return None if pod == PodInfo() else pod


def parse_invocation(command: str, conf: NetConf, environ: Mapping[str, str]) -> Invocation:
    if command not in _PER_CONTAINER:
        return Invocation(command, conf)
    for name in ("CNI_CONTAINERID", "CNI_IFNAME"):
        if not environ.get(name):
            raise CniError(ERR_INVALID_ENV, f"{command} needs {name}")
    try:
        container_id = check_container_id(environ.get("CNI_CONTAINERID"), "CNI_CONTAINERID")
        ifname = check_ifname(environ.get("CNI_IFNAME"), "CNI_IFNAME")
    except WireError as err:
        raise CniError(ERR_INVALID_ENV, str(err)) from None
    if command != "DEL" and not environ.get("CNI_NETNS"):
        raise CniError(ERR_INVALID_ENV, f"{command} needs CNI_NETNS")
    if command == "ADD":
        pod = _pod(environ)
    else:
        pod = _pod_if_given(environ) if conf.interface is not None else None
    netns = environ.get("CNI_NETNS", "")
    return Invocation(command, conf, container_id, ifname, pod, netns, environ.get("CNI_PATH", ""))


def parse_v4_egress(block: object) -> V4Egress:
    """The `v4Egress` block, or CNI error 7 naming the key at fault."""
    if not isinstance(block, dict):
        raise CniError(ERR_INVALID_CONFIG, "v4Egress must be an object", repr(block))
    for key in ("ifname", "subnet", "dataDir"):
        if key not in block:
            raise CniError(ERR_INVALID_CONFIG, f"v4Egress.{key} is required")
    try:
        ifname = check_ifname(block["ifname"], "v4Egress.ifname")
    except WireError as err:
        raise CniError(ERR_INVALID_CONFIG, "invalid v4Egress.ifname", str(err)) from None
    subnet = block["subnet"]
    gateway = _first_address(subnet)
    if gateway is None:
        raise CniError(
            ERR_INVALID_CONFIG,
            "v4Egress.subnet must be an IPv4 network with a prefix of /1 to /30",
            repr(subnet),
        )
    data_dir = block["dataDir"]
    if not isinstance(data_dir, str) or not data_dir.startswith("/"):
        raise CniError(
            ERR_INVALID_CONFIG, "v4Egress.dataDir must be an absolute path", repr(data_dir)
        )
    return V4Egress(ifname, subnet, gateway, data_dir)


def _first_address(subnet: object) -> str | None:
    """The first address of IPv4 network `subnet` (host bits zero, room for a gateway and a
    pod), or None when it is not one."""
    from ipamd.wire.fast import socket_core as _socket

    if not isinstance(subnet, str):
        return None
    network, _, length = subnet.partition("/")
    if not length.isdigit() or not 1 <= int(length) <= 30:
        return None
    try:
        raw = int.from_bytes(_socket.inet_pton(_socket.AF_INET, network), "big")
    except OSError:
        return None
    if raw & ((1 << (32 - int(length))) - 1):
        return None
    return _socket.inet_ntop(_socket.AF_INET, (raw + 1).to_bytes(4, "big"))
