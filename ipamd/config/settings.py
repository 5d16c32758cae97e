"""Configuration: every ipamd setting, parsed and validated once, from an environment mapping.

This module owns the settings: their names, types, defaults, units, meanings and VPC CNI equivalents
(each declared once, on its `Config` field), how each is parsed and checked, the rules between them,
and the Markdown table in docs/configuration.md generated from the same declarations. It is the only
code that interprets environment variables: `ipamd.main` passes `os.environ` to `Config.from_env` at
start and hands the frozen `Config` to everything else.

It must not do I/O other than reading the mapping it is given (no sockets, clocks or logging, and no
file but those IPAMD_ENI_CONFIG_FILE and IPAMD_KUBELET_CONFIG name, read once by `config.eniconfig`
and `config.kubelet` so that their problems are reported with the rest) and must not import asyncio.
It never falls back silently: a value that does not parse is an error, reported together with every
other bad value in one `ConfigError`. An empty value counts as unset (manifests often set "").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Literal

from ipamd.config import vpc_cni
from ipamd.config.eniconfig import (
    DEFAULT_ENICONFIG_KEY,
    ZONE_LABELS,
    EniConfigFile,
    parse_label_key,
    read_eni_config_file,
    show_eni_config_file,
)
from ipamd.config.kinds import (
    BOOL,
    CIDRS,
    COUNT,
    GRACE,
    INSTANCE_TYPE,
    INTERVAL,
    LOG_FILE,
    LOG_LEVEL,
    NODE_NAME,
    PLUGIN_LOG_FILE,
    POD_SUBNET,
    REGION,
    SETTING_KEY,
    SOCKET,
    TAINT,
    HostPort,
    Kind,
    Setting,
    Tags,
    bounded,
    choice,
    declare,
    integer,
    parse_endpoint,
    parse_host_port,
    parse_optional_path,
    parse_settings,
    parse_tags,
    show_tags,
)
from ipamd.config.kubelet import DEFAULT_KUBELET_CONFIG, KUBELET_CONFIG, KubeletConfig
from ipamd.config.rules import cross_field_problems, read_renamed

DEFAULT_LOG_FILE = "/var/log/aws-routed-eni/ipamd.log"
DEFAULT_PLUGIN_LOG_FILE = "/var/log/aws-routed-eni/plugin.log"
LogFormat = Literal["auto", "json", "text"]
HostNetworkMode = Literal["on", "off"]
RandomizeSnat = Literal["prng", "hashrandom", "none"]
LogLevel = Literal["debug", "info", "warn", "error", "fatal"]


class ConfigError(ValueError):
    """Every problem found in the configuration; `str()` gives one per line."""

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems: tuple[str, ...] = tuple(problems)
        super().__init__(self.problems)

    def __str__(self) -> str:
        return "\n".join(self.problems)


# --- the settings ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Config:
    """The effective configuration. Each field's metadata declares its environment variable,
    default, unit, meaning and VPC CNI equivalent; `SETTINGS` lists them in this order and
    docs/configuration.md shows them. Durations are float seconds, except where VPC CNI takes
    integer seconds."""

    # fmt: off
    # VPC CNI knobs, with VPC CNI's meanings.
    warm_eni_target: int = field(metadata=declare(
        "WARM_ENI_TARGET", COUNT, "1", "ENIs", "`WARM_ENI_TARGET` (invalid values become 1)",
        "Keep this many ENIs' worth of free addresses. Ignored when WARM_IP_TARGET or "
        "MINIMUM_IP_TARGET is set."))
    warm_ip_target: int = field(metadata=declare(
        "WARM_IP_TARGET", COUNT, "0", "addresses", "`WARM_IP_TARGET` (invalid values become 0)",
        "Free addresses to keep; 0 = unset. When set, WARM_ENI_TARGET and WARM_PREFIX_TARGET "
        "are ignored."))
    minimum_ip_target: int = field(metadata=declare(
        "MINIMUM_IP_TARGET", COUNT, "0", "addresses", "`MINIMUM_IP_TARGET`",
        "Floor on the addresses held by the node; 0 = unset. Set without WARM_IP_TARGET, the pool "
        "stays at this floor, as in VPC CNI."))
    warm_prefix_target: int = field(metadata=declare(
        "WARM_PREFIX_TARGET", COUNT, "1", "prefixes",
        "`WARM_PREFIX_TARGET` (code default 0, manifest 1)",
        "Prefix mode: free /28 prefixes to keep. Ignored when WARM_IP_TARGET or "
        "MINIMUM_IP_TARGET is set."))
    enable_prefix_delegation: bool = field(metadata=declare(
        "ENABLE_PREFIX_DELEGATION", BOOL, "false", "", "`ENABLE_PREFIX_DELEGATION`",
        "Assign /28 prefixes (16 addresses each) instead of secondary IPs. Needs WARM_IP_TARGET, "
        "WARM_PREFIX_TARGET or MINIMUM_IP_TARGET > 0, as VPC CNI's entrypoint does."))
    max_eni: int | None = field(metadata=declare(
        "MAX_ENI", integer(1, none="-1", hint=", or -1 for no cap"), "-1", "ENIs",
        "`MAX_ENI` (values < 1 ignored)",
        "Cap on the node's ENIs below the instance type's limit; -1 = no cap."))
    ip_cooldown_period_s: int = field(metadata=declare(
        "IP_COOLDOWN_PERIOD", COUNT, "30", "s (integer)", "`IP_COOLDOWN_PERIOD`",
        "A released address is not handed to another pod for this long, so that kube-proxy and "
        "network policy forget it first; an ENI with cooling addresses is not freed."))
    cluster_name: str = field(metadata=declare(
        "CLUSTER_NAME", Kind(str), "", "", "`CLUSTER_NAME`",
        "Cluster name, written as a tag on the ENIs ipamd creates; with subnet discovery, "
        "subnets tagged `cni.networking.k8s.aws/cluster/<name>` are for the clusters named."))
    enable_subnet_discovery: bool = field(metadata=declare(
        "ENABLE_SUBNET_DISCOVERY", BOOL, "true", "", "`ENABLE_SUBNET_DISCOVERY` (v1.18.0+)",
        "New ENIs go to the subnet with the most free addresses among the node's own (unless "
        "tagged `kubernetes.io/role/cni=0`) and the subnets of its VPC and zone tagged "
        "`kubernetes.io/role/cni` (any value but `0`); ENIs in a subnet tagged `0` take no new "
        "pods and are returned once empty. Off: new ENIs go to the node's subnet."))
    aws_region: str | None = field(metadata=declare(
        "AWS_REGION", REGION, "", "", "none (region from IMDS)",
        "EC2 region; unset = the instance's region, from IMDS."))
    ec2_endpoint: str | None = field(metadata=declare(
        "AWS_EC2_ENDPOINT", Kind(parse_endpoint, lambda value: value or ""), "", "",
        "`AWS_EC2_ENDPOINT`", "EC2 endpoint URL (http:// or https://); unset = the region's."))
    ec2_http_timeout_s: int = field(metadata=declare(
        "HTTP_TIMEOUT", integer(10), "10", "s (integer)", "`HTTP_TIMEOUT` (values < 10 become 10)",
        "Timeout of each HTTP request to EC2; at least 10."))
    additional_eni_tags: Tags = field(metadata=declare(
        "ADDITIONAL_ENI_TAGS", Kind(parse_tags, show_tags), "{}", "",
        "`ADDITIONAL_ENI_TAGS` (reserved keys dropped silently)",
        "JSON object of extra tags for the ENIs ipamd creates. Keys containing "
        "`k8s.amazonaws.com` or starting with `aws:` are errors."))
    disable_leaked_eni_cleanup: bool = field(metadata=declare(
        "DISABLE_LEAKED_ENI_CLEANUP", BOOL, "false", "", "`DISABLE_LEAKED_ENI_CLEANUP`",
        "Turn off ENI GC (deleting detached ENIs that ipamd created: the cluster's when "
        "CLUSTER_NAME is set, else this instance's)."))
    disable_network_resource_provisioning: bool = field(metadata=declare(
        "DISABLE_NETWORK_RESOURCE_PROVISIONING", BOOL, "false", "",
        "`DISABLE_NETWORK_RESOURCE_PROVISIONING` (reads IMDS; ipamd reads EC2)",
        "`true`: ipamd never creates, attaches, assigns, releases, detaches or deletes an ENI or "
        "address; it serves the ENIs and addresses EC2 lists on the node, adopting those added "
        "later, and the warm targets and ENI GC do nothing (someone else provisions the node)."))
    eni_mtu: int = field(metadata=declare(
        "AWS_VPC_ENI_MTU", bounded(576, 9001), "9001", "bytes", "`AWS_VPC_ENI_MTU`",
        "MTU of every secondary ENI's link (host networking on)."))
    pod_mtu: int | None = field(metadata=declare(
        "POD_MTU", bounded(576, 9001, optional=True), "", "bytes", "`POD_MTU`",
        "MTU of the pods' interfaces, written into the conflist as `mtu`; unset = AWS_VPC_ENI_MTU."))
    external_snat: bool = field(metadata=declare(
        "AWS_VPC_K8S_CNI_EXTERNALSNAT", BOOL, "false", "", "`AWS_VPC_K8S_CNI_EXTERNALSNAT`",
        "Pods leave the VPC with their own address, by their own ENI (the node sits behind a NAT "
        "gateway): no SNAT, no connmark. False = SNAT to the primary ENI's primary address."))
    node_port_support: bool = field(metadata=declare(
        "AWS_VPC_CNI_NODE_PORT_SUPPORT", BOOL, "true", "", "`AWS_VPC_CNI_NODE_PORT_SUPPORT`",
        "Connections to the node's own addresses arriving on the primary ENI (NodePort, hostPort, "
        "load balancers with instance targets) are marked, so pods on secondary ENIs answer them "
        "by the primary ENI. False = no mark: such connections to pods on secondary ENIs fail. "
        "IPv6 mode needs no mark (every pod is on the primary ENI)."))
    exclude_snat_cidrs: tuple[str, ...] = field(metadata=declare(
        "AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS", CIDRS, "", "",
        "`AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS`",
        "Comma-separated IPv4 CIDRs outside the VPC that pods reach without SNAT (e.g. a peered "
        "network), as if they were VPC CIDRs."))
    randomize_snat: RandomizeSnat = field(metadata=declare(
        "AWS_VPC_K8S_CNI_RANDOMIZESNAT", choice("prng", "hashrandom", "none"), "prng", "",
        "`AWS_VPC_K8S_CNI_RANDOMIZESNAT`",
        "Source ports of SNATed connections: `prng` (nft `fully-random`), `hashrandom` "
        "(`random`) or `none`."))
    disable_metrics: bool = field(metadata=declare(
        "DISABLE_METRICS", BOOL, "false", "", "`DISABLE_METRICS`",
        "Do not serve Prometheus metrics."))
    custom_networking: bool = field(metadata=declare(
        "AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG", BOOL, "false", "",
        "`AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG` (ENIConfigs from the Kubernetes API)",
        "Custom networking: secondary ENIs take the subnet and security groups of the ENIConfig "
        "of the node's zone, from IPAMD_ENI_CONFIG_FILE (required), and the primary ENI carries "
        "no pods (max pods counts one ENI fewer)."))
    eni_config_label: str = field(metadata=declare(
        "ENI_CONFIG_LABEL_DEF", Kind(parse_label_key), DEFAULT_ENICONFIG_KEY, "",
        "`ENI_CONFIG_LABEL_DEF`",
        "The node label whose value names the node's ENIConfig (after the label "
        "`vpc.amazonaws.com/externalEniConfig` and the annotation ENI_CONFIG_ANNOTATION_DEF; "
        "else `default`), read from the Kubernetes API. Without it (IPAMD_ENI_CONFIG_FILE), "
        f"the node's ENIConfig is the one named after its zone, and only the default or "
        f"`{ZONE_LABELS[0]}` / `{ZONE_LABELS[1]}` are accepted."))
    eni_config_annotation: str = field(metadata=declare(
        "ENI_CONFIG_ANNOTATION_DEF", Kind(parse_label_key), DEFAULT_ENICONFIG_KEY, "",
        "`ENI_CONFIG_ANNOTATION_DEF`",
        "The node annotation whose value names the node's ENIConfig, before ENI_CONFIG_LABEL_DEF "
        "(Kubernetes API only)."))

    # ipamd's own settings.
    socket_path: str = field(metadata=declare(
        "IPAMD_SOCKET", SOCKET, "/run/ipamd/ipamd.sock", "", "none (gRPC on its own socket)",
        "Unix socket of the local HTTP API used by ipamd-cni and ipamctl.", "./.run/ipamd.sock"))
    state_dir: str = field(metadata=declare(
        "IPAMD_STATE_DIR", Kind(str), "/var/lib/ipamd", "",
        "`AWS_VPC_K8S_CNI_BACKING_STORE` (a JSON file)",
        "Directory of the SQLite state file.", "./.run/state"))
    metrics_addr: HostPort = field(metadata=declare(
        "IPAMD_METRICS_ADDR", Kind(parse_host_port), "127.0.0.1:61678", "",
        "none (`:61678` on all interfaces)",
        "Listen address of the Prometheus metrics endpoint: host:port, `[::1]:61678` for IPv6."))
    cri_socket_path: str = field(metadata=declare(
        "IPAMD_CRI_SOCKET", SOCKET, "/run/containerd/containerd.sock", "", "none",
        "CRI socket of the container runtime; the runtime leak GC lists pod sandboxes there."))
    host_network: HostNetworkMode = field(metadata=declare(
        "IPAMD_HOST_NETWORK", choice("on", "off"), "on", "",
        "none (always on)",
        "Set up the node's datapath: per-ENI route tables, per-pod policy rules and SNAT. `off` "
        "hands out addresses only, so pods on secondary ENIs cannot send (EC2's source/"
        "destination check drops them); a laptop run never touches the host.", "off"))
    embedded_instance_type: str = field(metadata=declare(
        "IPAMD_EMBEDDED_INSTANCE_TYPE", INSTANCE_TYPE, "m5.large", "", "none",
        "Instance type of the simulated instance under `ipamd run --embedded`."))
    embedded_pod_subnet: str | None = field(metadata=declare(
        "IPAMD_EMBEDDED_POD_SUBNET", POD_SUBNET, "", "", "none",
        "Under `ipamd run --embedded`, a second subnet of the VPC (on a secondary CIDR block), "
        "tagged `kubernetes.io/role/cni=1` in the node's zone, for subnet discovery to choose; "
        "e.g. `100.64.0.0/16`, which has more free addresses than the node's. Read when the "
        "embedded cloud is first made."))
    max_pods_override: int | None = field(metadata=declare(
        "IPAMD_MAX_PODS", integer(1, none=""), "", "pods", "none (node's pod capacity)",
        "Max pods of the node; unset = the kubelet's (IPAMD_KUBELET_CONFIG), else as EKS "
        "computes it from the instance type: ENIs * (IPv4 per ENI - 1) + 2 (x 16 per slot in "
        "prefix and IPv6 modes), capped at 110 (30 vCPUs or fewer) or 250; `ipamctl status` "
        "says which rule applied."))
    log_format: LogFormat = field(metadata=declare(
        "IPAMD_LOG_FORMAT", choice("auto", "json", "text"), "auto", "", "none (always JSON)",
        "Format of ipamd's log on its standard error: `json`, `text`, or `auto` (text on a "
        "terminal, JSON otherwise). The log file (AWS_VPC_K8S_CNI_LOG_FILE) is always JSON."))
    log_level: LogLevel = field(metadata=declare(
        "AWS_VPC_K8S_CNI_LOGLEVEL", LOG_LEVEL, "info", "",
        "`AWS_VPC_K8S_CNI_LOGLEVEL` (default `DEBUG`)",
        "Level of ipamd's log, on its standard error and in AWS_VPC_K8S_CNI_LOG_FILE: debug, "
        "info, warn, error or fatal, in any case. At debug the AWS SDK's own lines stay at info "
        "(they hold whole requests)."))
    prefix_fallback_to_ips: bool = field(metadata=declare(
        "IPAMD_PREFIX_FALLBACK_TO_IPS", BOOL, "false", "", "none (growth stops)",
        "Prefix mode: when the subnet has no free /28 left, grow with secondary IPs instead; once "
        "a prefix is had again, prefixes replace the free /32s."))
    subnet_scarcity_threshold: int = field(metadata=declare(
        "IPAMD_SUBNET_SCARCITY_THRESHOLD", COUNT, "64", "addresses",
        "none (warm targets kept whatever the subnet has left)",
        "Subnet-scarcity mode: while the subnets this node draws from have fewer free addresses "
        "than this, WARM_IP_TARGET, WARM_ENI_TARGET and WARM_PREFIX_TARGET count as 0 "
        "(MINIMUM_IP_TARGET stays) and the free addresses above that go back; it ends once twice "
        "this many are free. 0 = off."))
    cni_conf_dir: str | None = field(metadata=declare(
        "IPAMD_CNI_CONF_DIR", Kind(parse_optional_path, lambda value: value or ""), "", "",
        "the entrypoint's conflist copy",
        "Where ipamd writes its CNI conflist once ready (atomically) and removes it on a clean "
        "stop, so the runtime reports the network ready only while ipamd can serve; unset = never."))
    cni_conflist_template: str | None = field(metadata=declare(
        "IPAMD_CNI_CONFLIST_TEMPLATE", Kind(parse_optional_path, lambda value: value or ""), "", "",
        "none", "The conflist ipamd writes (its `ipamd-cni` socket is set to IPAMD_SOCKET); "
        "required with IPAMD_CNI_CONF_DIR."))
    eni_config_file: EniConfigFile | None = field(metadata=declare(
        "IPAMD_ENI_CONFIG_FILE", Kind(read_eni_config_file, show_eni_config_file), "", "",
        "ENIConfig resources (`kubectl get eniconfigs -o json`)",
        "JSON file of the ENIConfigs custom networking uses, one per zone, named after it "
        "(docs/operations.md); read and checked at start."))

    # Grace windows and intervals.
    delete_intent_ttl_s: float = field(metadata=declare(
        "IPAMD_DELETE_INTENT_TTL", INTERVAL, "600", "s", "none",
        "Lifetime of a delete intent. Until it expires, an ADD for a deleted container is "
        "refused, so a late or retried ADD cannot take an address for a sandbox that is gone."))
    pool_interval_s: float = field(metadata=declare(
        "IPAMD_POOL_INTERVAL", INTERVAL, "5", "s", "`ipPoolMonitorInterval` (5 s, fixed)",
        "Period of the pool check (grow or shrink). An empty pool grows at once, not on the "
        "next tick."))
    shrink_interval_s: float = field(metadata=declare(
        "IPAMD_SHRINK_INTERVAL", INTERVAL, "30", "s", "`decreaseIPPoolInterval` (30 s, fixed)",
        "Least time between two shrinks, so that a burst of DELs before ADDs does not send "
        "addresses back to EC2 only to request them again."))
    ec2_reconcile_interval_s: float = field(metadata=declare(
        "IPAMD_EC2_RECONCILE_INTERVAL", INTERVAL, "300", "s",
        "`nodeIPPoolReconcileInterval` (60 s, fixed)",
        "Period of the steady EC2 drift sweep (12 Describe calls an hour: thousands of nodes share "
        "one account's API budget); it also runs at once whenever the 5 s IMDS hint disagrees."))
    imds_hint_interval_s: float = field(metadata=declare(
        "IPAMD_IMDS_HINT_INTERVAL", INTERVAL, "5", "s", "none",
        "Period of the cheap IMDS comparison, which can only trigger an EC2 reconcile."))
    reconcile_grace_s: float = field(metadata=declare(
        "IPAMD_RECONCILE_GRACE", GRACE, "60", "s", "`ipReconcileCooldown` (60 s, fixed)",
        "Units ipamd added or released within this window are left alone by drift reconcile: "
        "EC2 and IMDS are eventually consistent and may still show the old state."))
    leak_gc_interval_s: float = field(metadata=declare(
        "IPAMD_LEAK_GC_INTERVAL", INTERVAL, "60", "s", "none",
        "Period of the runtime leak GC, which compares allocations with the runtime's sandboxes."))
    leak_grace_s: float = field(metadata=declare(
        "IPAMD_LEAK_GRACE", GRACE, "120", "s", "none",
        "An allocation younger than this is never treated as leaked: its sandbox may not be "
        "listed by the runtime yet."))
    eni_gc_interval_s: float = field(metadata=declare(
        "IPAMD_ENI_GC_INTERVAL", INTERVAL, "3600", "s", "leaked-ENI sweep (1 h, fixed)",
        "Period of ENI GC, which deletes detached ENIs that ipamd created (the cluster's when "
        "CLUSTER_NAME is set, else this instance's)."))
    eni_gc_grace_s: float = field(metadata=declare(
        "IPAMD_ENI_GC_GRACE", GRACE, "300", "s", "`eniDeleteCooldownTime` (5 min, fixed)",
        "A detached ENI younger than this is kept: it may be between create and attach."))
    min_eni_lifetime_s: float = field(metadata=declare(
        "IPAMD_MIN_ENI_LIFETIME", GRACE, "60", "s", "`minENILifeTime` (60 s, fixed)",
        "An ENI attached less than this long ago is not freed, so a short dip in demand does "
        "not undo a fresh attach."))
    release_delay_s: float = field(metadata=declare(
        "IPAMD_RELEASE_DELAY", GRACE, "300", "s", "none (freed at the first spare tick)",
        "What the pool could give back (an ENI, a prefix, an address) goes to EC2 only once the "
        "plan has wanted to free it this long without a break; a round in which it is not "
        "spare, or in which pods wait, starts the delay over. The targets make the pool short "
        "one address below where they let it shrink, so without it a node whose pods hover at "
        "that edge gives back and asks again each time its pod count crosses it, paying the "
        "account's budget two mutating calls for a unit and five for an ENI (create, attach, "
        "DeleteOnTermination, detach, delete). No delay while the subnets are scarce (other "
        "nodes want the addresses), nor for what no new pod may use: a closed subnet's ENI, "
        "an ENI whose link is not set up, the primary ENI under custom networking, the /32s "
        "prefix mode's fallback left once prefixes come again."))
    subnet_exhausted_cooldown_s: float = field(metadata=declare(
        "IPAMD_SUBNET_EXHAUSTED_COOLDOWN", GRACE, "120", "s",
        "`insufficientCidrErrorCooldown` (2 min, fixed)",
        "After EC2 reports the subnet out of addresses, growth waits this long before retrying; "
        "not with subnet discovery while another subnet has room: new ENIs go there."))
    subnet_refresh_interval_s: float = field(metadata=declare(
        "IPAMD_SUBNET_REFRESH_INTERVAL", INTERVAL, "1800", "s",
        "none (DescribeSubnets before every new ENI)",
        "Subnet discovery: how often the subnets of the node's zone, their tags and free "
        "addresses are read again (one DescribeSubnets); also soon after a call finds a "
        "subnet full. Without discovery, how often subnet-scarcity mode reads the free addresses "
        "of the subnet new ENIs go to."))
    host_network_reconcile_interval_s: float = field(metadata=declare(
        "IPAMD_HOST_NETWORK_RECONCILE_INTERVAL", INTERVAL, "60", "s",
        "none (rules pruned at start only)",
        "Period of the host-network reconcile: ipamd's rules, routes and SNAT table made exactly "
        "what the state implies, whatever changed them."))
    ec2_call_timeout_s: float = field(metadata=declare(
        "IPAMD_EC2_CALL_TIMEOUT", INTERVAL, "10", "s", "none",
        "Deadline on each EC2 call ipamd awaits, so a hung call cannot stall a task."))

    # The IMDS endpoint (last, with a default, so that constructing a Config without it still works).
    imds_endpoint: str | None = field(default=None, metadata=declare(
        "AWS_EC2_METADATA_SERVICE_ENDPOINT", Kind(parse_endpoint, lambda value: value or ""), "",
        "", "none",
        "IMDS base URL (http:// or https://), the AWS SDKs' variable; unset = `http://169.254.169.254`."))
    # VPC CNI's introspection endpoint (also last, with defaults, for the same reason).
    disable_introspection: bool = field(default=False, metadata=declare(
        "DISABLE_INTROSPECTION", BOOL, "false", "", "`DISABLE_INTROSPECTION`",
        "Do not serve the introspection endpoint."))
    introspection_bind_address: HostPort = field(
        default=HostPort("127.0.0.1", 61679), metadata=declare(
        "INTROSPECTION_BIND_ADDRESS", Kind(parse_host_port), "127.0.0.1:61679", "",
        "`INTROSPECTION_BIND_ADDRESS` (also takes `unix:<path>`)",
        "Listen address of the read-only introspection endpoint (VPC CNI's `/v1/enis`, `/v1/pods`, "
        "`/v1/ipamd-env-settings`, `/v1/networkutils-env-settings`): host:port, loopback by "
        "default, since it lists every pod's address."))
    # aws-node's places (VPC CNI's names): the network-policy agent's contract and the checkpoint.
    network_policy_mode: str = field(default="", metadata=declare(
        "NETWORK_POLICY_ENFORCING_MODE", choice("none", "standard", "strict", optional=True), "",
        "", "`NETWORK_POLICY_ENFORCING_MODE` (manifest `standard`)",
        "`standard` or `strict`: every ADD and DEL tells the EKS network-policy agent (an agent that "
        "cannot be reached fails the ADD); `none`: never; unset: only while the agent's socket "
        "exists. The agent is told `standard` unless `strict` is set."))
    config_server_socket: str = field(default="/var/run/aws-node/ipamd.sock", metadata=declare(
        "IPAMD_CONFIG_SERVER_SOCKET", SOCKET, "/var/run/aws-node/ipamd.sock", "",
        "ipamd's gRPC socket (fixed)",
        "Unix socket where ipamd serves gRPC `rpc.ConfigServerBackend`, which the network-policy "
        "agent reads its configuration from.", "./.run/aws-node/ipamd.sock"))
    network_policy_agent_socket: str = field(default="/var/run/aws-node/npa.sock", metadata=declare(
        "IPAMD_NETWORK_POLICY_AGENT_SOCKET", SOCKET, "/var/run/aws-node/npa.sock", "",
        "the plugin's agent socket (fixed)",
        "Unix socket of the network-policy agent's gRPC `rpc.NPBackend`.",
        "./.run/aws-node/npa.sock"))
    aws_node_checkpoint: str = field(default="/var/run/aws-node/ipam.json", metadata=declare(
        "AWS_VPC_K8S_CNI_BACKING_STORE", Kind(str), "/var/run/aws-node/ipam.json", "",
        "`AWS_VPC_K8S_CNI_BACKING_STORE`",
        "VPC CNI's checkpoint (`vpc-cni-ipam/1`): read at start to adopt the pods aws-node left "
        "running, and kept current (every ADD waits for it) so aws-node started again restores "
        "every pod.", "./.run/aws-node/ipam.json"))
    kubelet_config: KubeletConfig | None = field(default=None, metadata=declare(
        "IPAMD_KUBELET_CONFIG", KUBELET_CONFIG, DEFAULT_KUBELET_CONFIG, "",
        "the node's `status.capacity.pods` (the kubelet's maxPods), from the API server",
        "The kubelet's config file (JSON, as the EKS AMI writes it) and its `<file>.d/*.conf` "
        "drop-ins, read at start: the last `maxPods` is the node's max pods (rule `kubelet`), "
        "unless IPAMD_MAX_PODS is set. No file, or no `maxPods`: as EKS computes it. A file that "
        "cannot be read or is not JSON stops the start."))
    # The address family (VPC CNI's names; last, with defaults, for the same reason).
    enable_ipv4: bool = field(default=True, metadata=declare(
        "ENABLE_IPv4", BOOL, "true", "", "`ENABLE_IPv4` (code default false, manifest true)",
        "Pods get IPv4 addresses. Exactly one of ENABLE_IPv4 and ENABLE_IPv6 is true: no dual stack."))
    enable_ipv6: bool = field(default=False, metadata=declare(
        "ENABLE_IPv6", BOOL, "false", "", "`ENABLE_IPv6`",
        "Pods get IPv6 /128s from one /80 prefix on the primary ENI; needs ENABLE_IPv4=false and "
        "ENABLE_PREFIX_DELEGATION=true, and no custom networking; each pod also gets IPv4 egress "
        "through a second interface (IPv6 mode, below)."))
    # The node's log files, where aws-node keeps its own (VPC CNI's names; last, with defaults).
    log_file: str | None = field(default=DEFAULT_LOG_FILE, metadata=declare(
        "AWS_VPC_K8S_CNI_LOG_FILE", LOG_FILE, DEFAULT_LOG_FILE, "",
        "`AWS_VPC_K8S_CNI_LOG_FILE` (default `/host/var/log/aws-routed-eni/ipamd.log`, the same "
        "node file through aws-node's `/host` mount)",
        "ipamd's log file: the JSON lines of its standard error, rotated at 100 MB (five gzipped "
        "backups, 30 days); `stdout` or `stderr`: no file. A file that cannot be opened is said "
        "once on standard error and ipamd goes on.",
        "./.run/aws-routed-eni/ipamd.log"))
    plugin_log_file: str = field(default=DEFAULT_PLUGIN_LOG_FILE, metadata=declare(
        "AWS_VPC_K8S_PLUGIN_LOG_FILE", PLUGIN_LOG_FILE, DEFAULT_PLUGIN_LOG_FILE, "",
        "`AWS_VPC_K8S_PLUGIN_LOG_FILE`",
        "ipamd-cni's log file, a path on the node (the runtime runs the plugin there), written "
        "into the conflist as `pluginLogFile`, rotated as ipamd's; `stderr`: the runtime's log. "
        "Not `stdout`, the plugin's answer.", "./.run/aws-routed-eni/plugin.log"))
    plugin_log_level: LogLevel = field(default="info", metadata=declare(
        "AWS_VPC_K8S_PLUGIN_LOG_LEVEL", LOG_LEVEL, "info", "",
        "`AWS_VPC_K8S_PLUGIN_LOG_LEVEL` (default `DEBUG`)",
        "Level of ipamd-cni's log, written into the conflist as `pluginLogLevel`: at info a line "
        "per ADD, DEL and GC and per failure; at debug also each request and each CHECK and "
        "STATUS."))
    # The Kubernetes API: this node's objects only (docs/operations.md, "The Kubernetes API").
    kubernetes: str = field(default="auto", metadata=declare(
        "IPAMD_KUBERNETES", choice("auto", "on", "off"), "auto", "", "none (always on)",
        "Read this node's objects from the Kubernetes API server: `on` (start-up waits up to 30 s "
        "for it, then goes on without), `off`, or `auto`: on when a kubeconfig (KUBECONFIG) or the "
        "pod's service-account token is there. `--embedded`: only with KUBECONFIG."))
    node_name: str = field(default="", metadata=declare(
        "MY_NODE_NAME", NODE_NAME, "", "", "`MY_NODE_NAME`",
        "This node's name in Kubernetes (the DaemonSet sets it from `spec.nodeName`); needed when "
        "the Kubernetes API is on."))
    startup_taint: str = field(default="", metadata=declare(
        "IPAMD_STARTUP_TAINT", TAINT, "", "", "none (aws-node removes no taint)",
        "A taint (`key[=value]:Effect`, e.g. `ipamd.k8s.aws/agent-not-ready:NoSchedule`) that "
        "ipamd removes from its own Node once it is ready to serve ADDs; no other taint is ever "
        "touched. Needs the Kubernetes API."))
    pod_aware_pool: str = field(default="auto", metadata=declare(
        "IPAMD_POD_AWARE_POOL", choice("auto", "on", "off"), "auto", "", "none (VPC CNI ignores "
        "pending pods)",
        "Watch this node's pods (`spec.nodeName`) and keep a free address for every pod bound here "
        "that holds none yet, whatever the warm targets ask: the pool grows at the scheduler's "
        "binding, not at the sandbox's ADD, so warm targets can be near 0. `auto`: on when the "
        "Kubernetes API is used; `on` without it is a start-up error."))
    manage_enis_non_schedulable: bool = field(default=False, metadata=declare(
        "AWS_MANAGE_ENIS_NON_SCHEDULABLE", BOOL, "false", "", "`AWS_MANAGE_ENIS_NON_SCHEDULABLE`",
        "With the Kubernetes API: `false` leaves the ENIs and addresses as they are while the node "
        "has the taint node.kubernetes.io/unschedulable:NoSchedule (cordoned, draining): no growth, "
        "no release; `true` manages them all the same. Without the API it changes nothing."))
    annotate_pod_ip: bool = field(default=False, metadata=declare(
        "ANNOTATE_POD_IP", BOOL, "false", "", "`ANNOTATE_POD_IP`",
        "Annotate each pod with `vpc.amazonaws.com/pod-ips` (its first address) on ADD, and clear "
        "it on DEL, so the network-policy controller knows the pod's address before the kubelet "
        "reports it. Needs the Kubernetes API; a failed write is logged, never fails the ADD."))
    # fmt: on

    @classmethod
    def from_env(cls, environ: Mapping[str, str], *, embedded: bool = False) -> Config:
        """Parse every setting from `environ`; raise `ConfigError` listing every problem found.

        `embedded` selects the defaults of `ipamd run --embedded`; a value in `environ` always wins.
        """
        environ, renamed = read_renamed(environ)
        values, texts, problems = parse_settings(SETTINGS, environ, embedded)
        problems += cross_field_problems(values, texts)
        problems += vpc_cni.problems(environ)
        problems += renamed
        if problems:
            raise ConfigError(problems)
        return cls(**values)

    def describe(self) -> dict[str, str]:
        """The effective configuration by variable name, in a form `from_env` accepts back."""
        return {s.env: s.kind.show(getattr(self, s.field)) for s in SETTINGS}


SETTINGS: tuple[Setting, ...] = tuple(
    replace(f.metadata[SETTING_KEY], field=f.name) for f in fields(Config)
)
