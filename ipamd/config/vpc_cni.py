"""Every environment variable of VPC CNI's aws-node that ipamd does not implement, with the answer
ipamd gives it: an operator who copies aws-node's environment into ipamd's ConfigMap (the obvious
migration step) is never left with a setting that silently does nothing.

The list is VPC CNI's README at v1.23.1 (aws/amazon-vpc-cni-k8s, `README.md`, "ipamd configuration
variables" and the CNI plugin's), less the variables `ipamd.config.settings` implements with VPC
CNI's meaning. Each variable here is one of:

- **inert**: any value is accepted; it would change nothing ipamd does (a setting of the API client
  ipamd does not have, a knob of a feature ipamd lacks). A set one is logged once at start
  (`config.inert`).
- **default only**: ipamd behaves as VPC CNI does at the variable's default. Another value, whose
  effect ipamd would drop, is a start-up error in the one error list, saying what ipamd does
  instead. A value VPC CNI could not parse is an error too (VPC CNI would fall back to the default
  with a log line; ipamd never falls back silently).

No I/O and no logging: `problems` and `inert` give what `Config.from_env` reports and what
`ipamd.main` logs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from ipamd.config.kinds import BOOL

Status = Literal["inert", "default only"]


@dataclass(frozen=True, slots=True)
class VpcCniVariable:
    env: str
    default: str
    """VPC CNI's default ("" when unset)."""
    status: Status
    instead: str
    """What ipamd does: the reason it is inert, or what a non-default value would not get."""
    boolean: bool = False
    """Parsed as VPC CNI parses it (Go's strconv.ParseBool), compared by meaning."""
    applies: Callable[[Mapping[str, str]], bool] = lambda _environ: True
    """Whether a non-default value matters given the rest of the environment (say IPv6 mode)."""

    def differs(self, text: str) -> bool:
        """Whether `text` means something else than the default. Raises `ValueError` when
        `text` is not a value VPC CNI accepts."""
        if self.boolean:
            return bool(BOOL.parse(text) != BOOL.parse(self.default))
        return text != self.default


def _ipv6(environ: Mapping[str, str]) -> bool:
    try:
        return bool(BOOL.parse(environ.get("ENABLE_IPv6", "") or "false"))
    except ValueError:
        return False  # reported by ENABLE_IPv6's own setting


def _inert(env: str, default: str, why: str, *, boolean: bool = False) -> VpcCniVariable:
    return VpcCniVariable(env, default, "inert", why, boolean)


def _only(env: str, default: str, instead: str, *, boolean: bool = False) -> VpcCniVariable:
    return VpcCniVariable(env, default, "default only", instead, boolean)


NOT_API = "ipamd reads no Kubernetes object"

README_VARIABLES: frozenset[str] = frozenset(
    (
        "ADDITIONAL_ENI_TAGS",
        "ANNOTATE_POD_IP",
        "AWS_EC2_ENDPOINT",
        "AWS_EXTERNAL_SERVICE_CIDRS",
        "AWS_MANAGE_ENIS_NON_SCHEDULABLE",
        "AWS_VPC_CNI_NODE_PORT_SUPPORT",
        "AWS_VPC_ENI_MTU",
        "AWS_VPC_K8S_CNI_CONFIGURE_RPFILTER",
        "AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG",
        "AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS",
        "AWS_VPC_K8S_CNI_EXTERNALSNAT",
        "AWS_VPC_K8S_CNI_LOGLEVEL",
        "AWS_VPC_K8S_CNI_LOG_FILE",
        "AWS_VPC_K8S_CNI_RANDOMIZESNAT",
        "AWS_VPC_K8S_CNI_VETHPREFIX",
        "AWS_VPC_K8S_PLUGIN_LOG_FILE",
        "AWS_VPC_K8S_PLUGIN_LOG_LEVEL",
        "CLUSTER_ENDPOINT",
        "CLUSTER_NAME",
        "DISABLE_INTROSPECTION",
        "DISABLE_LEAKED_ENI_CLEANUP",
        "DISABLE_METRICS",
        "DISABLE_NETWORK_RESOURCE_PROVISIONING",
        "DISABLE_POD_V6",
        "DISABLE_TCP_EARLY_DEMUX",
        "ENABLE_BANDWIDTH_PLUGIN",
        "ENABLE_IMDS_ONLY_MODE",
        "ENABLE_IPv4",
        "ENABLE_IPv6",
        "ENABLE_MULTI_NIC",
        "ENABLE_NFTABLES",
        "ENABLE_POD_ENI",
        "ENABLE_PREFIX_DELEGATION",
        "ENABLE_SUBNET_DISCOVERY",
        "ENABLE_V4_EGRESS",
        "ENABLE_V6_EGRESS",
        "ENI_CONFIG_ANNOTATION_DEF",
        "ENI_CONFIG_LABEL_DEF",
        "HOST_CNI_BIN_PATH",
        "HOST_CNI_CONFDIR_PATH",
        "INTROSPECTION_BIND_ADDRESS",
        "IP_COOLDOWN_PERIOD",
        "MAX_ENI",
        "MINIMUM_IP_TARGET",
        "NETWORK_POLICY_ENFORCING_MODE",
        "POD_MTU",
        "POD_SECURITY_GROUP_ENFORCING_MODE",
        "WARM_ENI_TARGET",
        "WARM_IP_TARGET",
        "WARM_PREFIX_TARGET",
    )
)
r"""Every variable VPC CNI's README documents (aws/amazon-vpc-cni-k8s v1.23.1, `README.md`, each
`#### \`NAME\`` heading): the ones ipamd implements are settings of `ipamd.config.settings`, the
rest are `VARIABLES`."""

VARIABLES: tuple[VpcCniVariable, ...] = (
    _only(
        "AWS_EXTERNAL_SERVICE_CIDRS",
        "",
        "traffic to these CIDRs is not routed by the primary ENI: pods reach them by their own "
        "ENI (AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS is ipamd's SNAT exclusion)",
    ),
    _inert(
        "AWS_VPC_K8S_CNI_CONFIGURE_RPFILTER",
        "true",
        "the host-sysctls init container sets the primary interface's rp_filter; the daemon never "
        "writes it",
        boolean=True,
    ),
    _only(
        "AWS_VPC_K8S_CNI_VETHPREFIX",
        "eni",
        "the host veth prefix is the conflist's `vethPrefix` (IPAMD_CNI_CONFLIST_TEMPLATE); "
        "set it there",
    ),
    _inert("CLUSTER_ENDPOINT", "", f"{NOT_API}, so it needs no API server endpoint"),
    _only(
        "DISABLE_POD_V6",
        "false",
        "the pod's namespace keeps IPv6 as the kernel sets it up",
        boolean=True,
    ),
    _inert(
        "DISABLE_TCP_EARLY_DEMUX",
        "false",
        "it matters only with security groups for pods (ENABLE_POD_ENI), which ipamd does not "
        "support",
        boolean=True,
    ),
    _only(
        "ENABLE_BANDWIDTH_PLUGIN",
        "false",
        "no bandwidth plugin is chained: add it to the conflist (IPAMD_CNI_CONFLIST_TEMPLATE)",
        boolean=True,
    ),
    _only(
        "ENABLE_IMDS_ONLY_MODE",
        "false",
        "ipamd reads EC2 as well as IMDS: EC2 is its source of truth",
        boolean=True,
    ),
    _only(
        "ENABLE_MULTI_NIC",
        "false",
        "pods get interfaces on network card 0 only",
        boolean=True,
    ),
    _inert(
        "ENABLE_NFTABLES",
        "false",
        "ipamd's own rules are always nftables (`table ip ipamd`); iptables' are not touched",
        boolean=True,
    ),
    _only(
        "ENABLE_POD_ENI",
        "false",
        "security groups for pods are not supported; pods would run without their security groups",
        boolean=True,
    ),
    VpcCniVariable(
        "ENABLE_V4_EGRESS",
        "true",
        "default only",
        "every IPv6 pod gets IPv4 egress (v4if0)",
        boolean=True,
        applies=_ipv6,
    ),
    _only(
        "ENABLE_V6_EGRESS",
        "false",
        "IPv4 pods get no IPv6 egress",
        boolean=True,
    ),
    _only(
        "HOST_CNI_BIN_PATH",
        "/host/opt/cni/bin",
        "the CNI bin directory is install-cni's IPAMD_CNI_BIN_DIR and the DaemonSet's mount",
    ),
    _only(
        "HOST_CNI_CONFDIR_PATH",
        "/host/etc/cni/net.d",
        "the conflist directory is IPAMD_CNI_CONF_DIR",
    ),
    _inert(
        "POD_SECURITY_GROUP_ENFORCING_MODE",
        "strict",
        "it matters only with security groups for pods (ENABLE_POD_ENI), which ipamd does not "
        "support",
    ),
)
"""VPC CNI's variables ipamd does not implement, by name."""


def problems(environ: Mapping[str, str]) -> list[str]:
    """A start-up error for each default-only variable set to another meaning, and for each
    boolean whose value VPC CNI could not parse."""
    found: list[str] = []
    for var in VARIABLES:
        text = environ.get(var.env, "")
        if not text:
            continue  # unset, as an empty value counts everywhere
        try:
            differs = var.differs(text)
        except ValueError as err:
            found.append(f"{var.env}={text!r}: {err}")
            continue
        if differs and var.status == "default only" and var.applies(environ):
            found.append(
                f"{var.env}={text!r}: ipamd supports only VPC CNI's default ({var.default!r}): "
                f"{var.instead}"
            )
    return found


def inert(environ: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """(variable, value, why nothing changes) for each variable set that ipamd accepts without
    acting on it: the inert ones, and a default-only one at its default or where it does not
    apply."""
    found: list[tuple[str, str, str]] = []
    for var in VARIABLES:
        text = environ.get(var.env, "")
        if not text:
            continue
        try:
            differs = var.differs(text)
        except ValueError:
            continue  # an error of `problems`
        if var.status == "inert" or not differs or not var.applies(environ):
            found.append((var.env, text, var.instead))
    return found


def render_table(implemented: Iterable[str]) -> str:
    """The Markdown table of every VPC CNI variable (README v1.23.1): those ipamd implements
    (`implemented`: their names, documented in the settings table) and those here."""
    rows = [
        (name, "implemented", "", "same meaning: see the settings table") for name in implemented
    ]
    rows += [(var.env, var.status, var.default, var.instead) for var in VARIABLES]
    lines = [
        "| variable | ipamd | VPC CNI's default | what ipamd does |",
        "|---|---|---|---|",
    ]
    for name, status, default, what in sorted(rows):
        shown = f"`{default}`" if default else ""
        lines.append(f"| `{name}` | {status} | {shown} | {what} |")
    return "\n".join(lines)
