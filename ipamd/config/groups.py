"""The settings groups: each is the object one part of ipamd receives, declared with its keyword
arguments and typed defaults once, and each field declares the environment variable it is read from
(its default, unit, meaning and VPC CNI equivalent).

`ipamd.config.settings.Config` holds one of each, reads them from the environment together, and
checks the rules between them (`ipamd.config.rules`); docs/configuration.md is generated from the
same declarations, group by group. A part imports its group's type from here and never sees the
rest of the configuration. Pure: no I/O but the files two settings name, read at start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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
    SOCKET,
    TAINT,
    HostPort,
    Kind,
    Tags,
    bounded,
    choice,
    integer,
    parse_endpoint,
    parse_host_port,
    parse_optional_path,
    parse_tags,
    setting,
    show_tags,
)
from ipamd.config.kubelet import DEFAULT_KUBELET_CONFIG, KUBELET_CONFIG, KubeletConfig

DEFAULT_LOG_FILE = "/var/log/aws-routed-eni/ipamd.log"
DEFAULT_PLUGIN_LOG_FILE = "/var/log/aws-routed-eni/plugin.log"
LogFormat = Literal["auto", "json", "text"]
HostNetworkMode = Literal["on", "off"]
RandomizeSnat = Literal["prng", "hashrandom", "none"]
LogLevel = Literal["debug", "info", "warn", "error", "fatal"]

# fmt: off


@dataclass(frozen=True, slots=True, kw_only=True)
class FamilySettings:
    """The address family of the node's pods, chosen once at start (`ipamd.node.family`)."""

    enable_ipv4: bool = setting(
        "ENABLE_IPv4", BOOL, "true", "", "`ENABLE_IPv4` (code default false, manifest true)",
        "Pods get IPv4 addresses. Exactly one of ENABLE_IPv4 and ENABLE_IPv6 is true: no dual stack.")
    enable_ipv6: bool = setting(
        "ENABLE_IPv6", BOOL, "false", "", "`ENABLE_IPv6`",
        "Pods get IPv6 /128s from one /80 prefix on the primary ENI; needs ENABLE_IPv4=false and "
        "ENABLE_PREFIX_DELEGATION=true, and no custom networking; each pod also gets IPv4 egress "
        "through a second interface (IPv6 mode, below).")


@dataclass(frozen=True, slots=True, kw_only=True)
class SizingSettings:
    """How many addresses the pool keeps and may hold (`ipamd.sizing`): the warm targets, the
    unit, the caps on ENIs and pods."""

    warm_eni_target: int = setting(
        "WARM_ENI_TARGET", COUNT, "1", "ENIs", "`WARM_ENI_TARGET` (invalid values become 1)",
        "Keep this many ENIs' worth of free addresses. Ignored when WARM_IP_TARGET or "
        "MINIMUM_IP_TARGET is set.")
    warm_ip_target: int = setting(
        "WARM_IP_TARGET", COUNT, "0", "addresses", "`WARM_IP_TARGET` (invalid values become 0)",
        "Free addresses to keep; 0 = unset. When set, WARM_ENI_TARGET and WARM_PREFIX_TARGET "
        "are ignored.")
    minimum_ip_target: int = setting(
        "MINIMUM_IP_TARGET", COUNT, "0", "addresses", "`MINIMUM_IP_TARGET`",
        "Floor on the addresses held by the node; 0 = unset. Set without WARM_IP_TARGET, the pool "
        "stays at this floor, as in VPC CNI.")
    warm_prefix_target: int = setting(
        "WARM_PREFIX_TARGET", COUNT, "1", "prefixes",
        "`WARM_PREFIX_TARGET` (code default 0, manifest 1)",
        "Prefix mode: free /28 prefixes to keep. Ignored when WARM_IP_TARGET or "
        "MINIMUM_IP_TARGET is set.")
    enable_prefix_delegation: bool = setting(
        "ENABLE_PREFIX_DELEGATION", BOOL, "false", "", "`ENABLE_PREFIX_DELEGATION`",
        "Assign /28 prefixes (16 addresses each) instead of secondary IPs. Needs WARM_IP_TARGET, "
        "WARM_PREFIX_TARGET or MINIMUM_IP_TARGET > 0, as VPC CNI's entrypoint does.")
    prefix_fallback_to_ips: bool = setting(
        "IPAMD_PREFIX_FALLBACK_TO_IPS", BOOL, "false", "", "none (growth stops)",
        "Prefix mode: when the subnet has no free /28 left, grow with secondary IPs instead; once "
        "a prefix is had again, prefixes replace the free /32s.")
    max_eni: int | None = setting(
        "MAX_ENI", integer(1, none="-1", hint=", or -1 for no cap"), "-1", "ENIs",
        "`MAX_ENI` (values < 1 ignored)",
        "Cap on the node's ENIs below the instance type's limit; -1 = no cap.")
    max_pods_override: int | None = setting(
        "IPAMD_MAX_PODS", integer(1, none=""), "", "pods", "none (node's pod capacity)",
        "Max pods of the node; unset = the kubelet's (IPAMD_KUBELET_CONFIG), else as EKS "
        "computes it from the instance type: ENIs * (IPv4 per ENI - 1) + 2 (x 16 per slot in "
        "prefix and IPv6 modes), capped at 110 (30 vCPUs or fewer) or 250; `ipamctl status` "
        "says which rule applied.")
    kubelet_config: KubeletConfig | None = setting(
        "IPAMD_KUBELET_CONFIG", KUBELET_CONFIG, DEFAULT_KUBELET_CONFIG, "",
        "the node's `status.capacity.pods` (the kubelet's maxPods), from the API server",
        "The kubelet's config file (JSON, as the EKS AMI writes it) and its `<file>.d/*.conf` "
        "drop-ins, read at start: the last `maxPods` is the node's max pods (rule `kubelet`), "
        "unless IPAMD_MAX_PODS is set. No file, or no `maxPods`: as EKS computes it. A file that "
        "cannot be read or is not JSON stops the start.", typed=None)
    min_eni_lifetime_s: float = setting(
        "IPAMD_MIN_ENI_LIFETIME", GRACE, "60", "s", "`minENILifeTime` (60 s, fixed)",
        "An ENI attached less than this long ago is not freed, so a short dip in demand does "
        "not undo a fresh attach.")


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolSettings:
    """The pool's rounds (`ipamd.pool`): how often it checks, how it gives back, and whether it
    provisions at all."""

    interval_s: float = setting(
        "IPAMD_POOL_INTERVAL", INTERVAL, "5", "s", "`ipPoolMonitorInterval` (5 s, fixed)",
        "Period of the pool check (grow or shrink). An empty pool grows at once, not on the "
        "next tick.")
    shrink_interval_s: float = setting(
        "IPAMD_SHRINK_INTERVAL", INTERVAL, "30", "s", "`decreaseIPPoolInterval` (30 s, fixed)",
        "Least time between two shrinks, so that a burst of DELs before ADDs does not send "
        "addresses back to EC2 only to request them again.")
    release_delay_s: float = setting(
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
        "prefix mode's fallback left once prefixes come again.")
    disable_network_resource_provisioning: bool = setting(
        "DISABLE_NETWORK_RESOURCE_PROVISIONING", BOOL, "false", "",
        "`DISABLE_NETWORK_RESOURCE_PROVISIONING` (reads IMDS; ipamd reads EC2)",
        "`true`: ipamd never creates, attaches, assigns, releases, detaches or deletes an ENI or "
        "address; it serves the ENIs and addresses EC2 lists on the node, adopting those added "
        "later, and the warm targets and ENI GC do nothing (someone else provisions the node).")


@dataclass(frozen=True, slots=True, kw_only=True)
class SubnetSettings:
    """Which subnets new ENIs go to, and how scarce addresses change the pool
    (`ipamd.pool.subnet_catalogue`)."""

    discovery: bool = setting(
        "ENABLE_SUBNET_DISCOVERY", BOOL, "true", "", "`ENABLE_SUBNET_DISCOVERY` (v1.18.0+)",
        "New ENIs go to the subnet with the most free addresses among the node's own (unless "
        "tagged `kubernetes.io/role/cni=0`) and the subnets of its VPC and zone tagged "
        "`kubernetes.io/role/cni` (any value but `0`); ENIs in a subnet tagged `0` take no new "
        "pods and are returned once empty. Off: new ENIs go to the node's subnet.")
    refresh_interval_s: float = setting(
        "IPAMD_SUBNET_REFRESH_INTERVAL", INTERVAL, "1800", "s",
        "none (DescribeSubnets before every new ENI)",
        "Subnet discovery: how often the subnets of the node's zone, their tags and free "
        "addresses are read again (one DescribeSubnets); also soon after a call finds a "
        "subnet full. Without discovery, how often subnet-scarcity mode reads the free addresses "
        "of the subnet new ENIs go to.")
    scarcity_threshold: int = setting(
        "IPAMD_SUBNET_SCARCITY_THRESHOLD", COUNT, "64", "addresses",
        "none (warm targets kept whatever the subnet has left)",
        "Subnet-scarcity mode: while the subnets this node draws from have fewer free addresses "
        "than this, WARM_IP_TARGET, WARM_ENI_TARGET and WARM_PREFIX_TARGET count as 0 "
        "(MINIMUM_IP_TARGET stays) and the free addresses above that go back; it ends once twice "
        "this many are free. 0 = off.")
    exhausted_cooldown_s: float = setting(
        "IPAMD_SUBNET_EXHAUSTED_COOLDOWN", GRACE, "120", "s",
        "`insufficientCidrErrorCooldown` (2 min, fixed)",
        "After EC2 reports the subnet out of addresses, growth waits this long before retrying; "
        "not with subnet discovery while another subnet has room: new ENIs go there.")


@dataclass(frozen=True, slots=True, kw_only=True)
class CustomNetworkingSettings:
    """Custom networking: the ENIConfig that gives secondary ENIs their subnet and security groups."""

    enabled: bool = setting(
        "AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG", BOOL, "false", "",
        "`AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG` (ENIConfigs from the Kubernetes API)",
        "Custom networking: secondary ENIs take the subnet and security groups of the ENIConfig "
        "of the node's zone, from IPAMD_ENI_CONFIG_FILE (required), and the primary ENI carries "
        "no pods (max pods counts one ENI fewer).")
    eni_config_file: EniConfigFile | None = setting(
        "IPAMD_ENI_CONFIG_FILE", Kind(read_eni_config_file, show_eni_config_file), "", "",
        "ENIConfig resources (`kubectl get eniconfigs -o json`)",
        "JSON file of the ENIConfigs custom networking uses, one per zone, named after it "
        "(docs/operations.md); read and checked at start.")
    eni_config_label: str = setting(
        "ENI_CONFIG_LABEL_DEF", Kind(parse_label_key), DEFAULT_ENICONFIG_KEY, "",
        "`ENI_CONFIG_LABEL_DEF`",
        "The node label whose value names the node's ENIConfig (after the label "
        "`vpc.amazonaws.com/externalEniConfig` and the annotation ENI_CONFIG_ANNOTATION_DEF; "
        "else `default`), read from the Kubernetes API. Without it (IPAMD_ENI_CONFIG_FILE), "
        f"the node's ENIConfig is the one named after its zone, and only the default or "
        f"`{ZONE_LABELS[0]}` / `{ZONE_LABELS[1]}` are accepted.")
    eni_config_annotation: str = setting(
        "ENI_CONFIG_ANNOTATION_DEF", Kind(parse_label_key), DEFAULT_ENICONFIG_KEY, "",
        "`ENI_CONFIG_ANNOTATION_DEF`",
        "The node annotation whose value names the node's ENIConfig, before ENI_CONFIG_LABEL_DEF "
        "(Kubernetes API only).")


@dataclass(frozen=True, slots=True, kw_only=True)
class EniSettings:
    """The ENIs ipamd creates: their tags, and the GC of those left detached."""

    cluster_name: str = setting(
        "CLUSTER_NAME", Kind(str), "", "", "`CLUSTER_NAME`",
        "Cluster name, written as a tag on the ENIs ipamd creates; with subnet discovery, "
        "subnets tagged `cni.networking.k8s.aws/cluster/<name>` are for the clusters named.")
    additional_eni_tags: Tags = setting(
        "ADDITIONAL_ENI_TAGS", Kind(parse_tags, show_tags), "{}", "",
        "`ADDITIONAL_ENI_TAGS` (reserved keys dropped silently)",
        "JSON object of extra tags for the ENIs ipamd creates. Keys containing "
        "`k8s.amazonaws.com` or starting with `aws:` are errors.")
    disable_leaked_eni_cleanup: bool = setting(
        "DISABLE_LEAKED_ENI_CLEANUP", BOOL, "false", "", "`DISABLE_LEAKED_ENI_CLEANUP`",
        "Turn off ENI GC (deleting detached ENIs that ipamd created: the cluster's when "
        "CLUSTER_NAME is set, else this instance's).")
    gc_interval_s: float = setting(
        "IPAMD_ENI_GC_INTERVAL", INTERVAL, "3600", "s", "leaked-ENI sweep (1 h, fixed)",
        "Period of ENI GC, which deletes detached ENIs that ipamd created (the cluster's when "
        "CLUSTER_NAME is set, else this instance's).")
    gc_grace_s: float = setting(
        "IPAMD_ENI_GC_GRACE", GRACE, "300", "s", "`eniDeleteCooldownTime` (5 min, fixed)",
        "A detached ENI younger than this is kept: it may be between create and attach.")


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineSettings:
    """The allocator's windows (`ipamd.engine`): how long a released address cools and a DEL refuses ADDs."""

    ip_cooldown_period_s: int = setting(
        "IP_COOLDOWN_PERIOD", COUNT, "30", "s (integer)", "`IP_COOLDOWN_PERIOD`",
        "A released address is not handed to another pod for this long, so that kube-proxy and "
        "network policy forget it first; an ENI with cooling addresses is not freed.")
    delete_intent_ttl_s: float = setting(
        "IPAMD_DELETE_INTENT_TTL", INTERVAL, "600", "s", "none",
        "Lifetime of a delete intent. Until it expires, an ADD for a deleted container is "
        "refused, so a late or retried ADD cannot take an address for a sandbox that is gone.")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReconcileSettings:
    """How ipamd's view is kept honest against EC2 (`ipamd.reconcile`)."""

    ec2_interval_s: float = setting(
        "IPAMD_EC2_RECONCILE_INTERVAL", INTERVAL, "300", "s",
        "`nodeIPPoolReconcileInterval` (60 s, fixed)",
        "Period of the steady EC2 drift sweep (12 Describe calls an hour: thousands of nodes share "
        "one account's API budget); it also runs at once whenever the 5 s IMDS hint disagrees.")
    imds_hint_interval_s: float = setting(
        "IPAMD_IMDS_HINT_INTERVAL", INTERVAL, "5", "s", "none",
        "Period of the cheap IMDS comparison, which can only trigger an EC2 reconcile.")
    grace_s: float = setting(
        "IPAMD_RECONCILE_GRACE", GRACE, "60", "s", "`ipReconcileCooldown` (60 s, fixed)",
        "Units ipamd added or released within this window are left alone by drift reconcile: "
        "EC2 and IMDS are eventually consistent and may still show the old state.")


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeSettings:
    """The container runtime, and the leak GC that compares allocations with its sandboxes
    (`ipamd.runtime`)."""

    cri_socket_path: str = setting(
        "IPAMD_CRI_SOCKET", SOCKET, "/run/containerd/containerd.sock", "", "none",
        "CRI socket of the container runtime; the runtime leak GC lists pod sandboxes there.")
    leak_gc_interval_s: float = setting(
        "IPAMD_LEAK_GC_INTERVAL", INTERVAL, "60", "s", "none",
        "Period of the runtime leak GC, which compares allocations with the runtime's sandboxes.")
    leak_grace_s: float = setting(
        "IPAMD_LEAK_GRACE", GRACE, "120", "s", "none",
        "An allocation younger than this is never treated as leaked: its sandbox may not be "
        "listed by the runtime yet.")


@dataclass(frozen=True, slots=True, kw_only=True)
class DatapathSettings:
    """The node's datapath (`ipamd.hostnet`): ENI links, SNAT and connection marks, and its reconcile."""

    host_network: HostNetworkMode = setting(
        "IPAMD_HOST_NETWORK", choice("on", "off"), "on", "",
        "none (always on)",
        "Set up the node's datapath: per-ENI route tables, per-pod policy rules and SNAT. `off` "
        "hands out addresses only, so pods on secondary ENIs cannot send (EC2's source/"
        "destination check drops them); a laptop run never touches the host.", "off")
    eni_mtu: int = setting(
        "AWS_VPC_ENI_MTU", bounded(576, 9001), "9001", "bytes", "`AWS_VPC_ENI_MTU`",
        "MTU of every secondary ENI's link (host networking on).")
    external_snat: bool = setting(
        "AWS_VPC_K8S_CNI_EXTERNALSNAT", BOOL, "false", "", "`AWS_VPC_K8S_CNI_EXTERNALSNAT`",
        "Pods leave the VPC with their own address, by their own ENI (the node sits behind a NAT "
        "gateway): no SNAT, no connmark. False = SNAT to the primary ENI's primary address.")
    node_port_support: bool = setting(
        "AWS_VPC_CNI_NODE_PORT_SUPPORT", BOOL, "true", "", "`AWS_VPC_CNI_NODE_PORT_SUPPORT`",
        "Connections to the node's own addresses arriving on the primary ENI (NodePort, hostPort, "
        "load balancers with instance targets) are marked, so pods on secondary ENIs answer them "
        "by the primary ENI. False = no mark: such connections to pods on secondary ENIs fail. "
        "IPv6 mode needs no mark (every pod is on the primary ENI).")
    exclude_snat_cidrs: tuple[str, ...] = setting(
        "AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS", CIDRS, "", "",
        "`AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS`",
        "Comma-separated IPv4 CIDRs outside the VPC that pods reach without SNAT (e.g. a peered "
        "network), as if they were VPC CIDRs.")
    randomize_snat: RandomizeSnat = setting(
        "AWS_VPC_K8S_CNI_RANDOMIZESNAT", choice("prng", "hashrandom", "none"), "prng", "",
        "`AWS_VPC_K8S_CNI_RANDOMIZESNAT`",
        "Source ports of SNATed connections: `prng` (nft `fully-random`), `hashrandom` "
        "(`random`) or `none`.")
    reconcile_interval_s: float = setting(
        "IPAMD_HOST_NETWORK_RECONCILE_INTERVAL", INTERVAL, "60", "s",
        "none (rules pruned at start only)",
        "Period of the host-network reconcile: ipamd's rules, routes and SNAT table made exactly "
        "what the state implies, whatever changed them.")


@dataclass(frozen=True, slots=True, kw_only=True)
class ConflistSettings:
    """The CNI conflist ipamd writes once ready, and what it tells the plugin (`ipamd.node.conflist`)."""

    conf_dir: str | None = setting(
        "IPAMD_CNI_CONF_DIR", Kind(parse_optional_path, lambda value: value or ""), "", "",
        "the entrypoint's conflist copy",
        "Where ipamd writes its CNI conflist once ready (atomically) and removes it on a clean "
        "stop, so the runtime reports the network ready only while ipamd can serve; unset = never.")
    template: str | None = setting(
        "IPAMD_CNI_CONFLIST_TEMPLATE", Kind(parse_optional_path, lambda value: value or ""), "", "",
        "none", "The conflist ipamd writes (its `ipamd-cni` socket is set to IPAMD_SOCKET); "
        "required with IPAMD_CNI_CONF_DIR.")
    pod_mtu: int | None = setting(
        "POD_MTU", bounded(576, 9001, optional=True), "", "bytes", "`POD_MTU`",
        "MTU of the pods' interfaces, written into the conflist as `mtu`; unset = AWS_VPC_ENI_MTU.")
    plugin_log_file: str = setting(
        "AWS_VPC_K8S_PLUGIN_LOG_FILE", PLUGIN_LOG_FILE, DEFAULT_PLUGIN_LOG_FILE, "",
        "`AWS_VPC_K8S_PLUGIN_LOG_FILE`",
        "ipamd-cni's log file, a path on the node (the runtime runs the plugin there), written "
        "into the conflist as `pluginLogFile`, rotated as ipamd's; `stderr`: the runtime's log. "
        "Not `stdout`, the plugin's answer.", "./.run/aws-routed-eni/plugin.log")
    plugin_log_level: LogLevel = setting(
        "AWS_VPC_K8S_PLUGIN_LOG_LEVEL", LOG_LEVEL, "info", "",
        "`AWS_VPC_K8S_PLUGIN_LOG_LEVEL` (default `DEBUG`)",
        "Level of ipamd-cni's log, written into the conflist as `pluginLogLevel`: at info a line "
        "per ADD, DEL and GC and per failure; at debug also each request and each CHECK and "
        "STATUS.")


@dataclass(frozen=True, slots=True, kw_only=True)
class Ec2Settings:
    """How ipamd reaches EC2 and the instance metadata service (`ipamd.node.compose`)."""

    region: str | None = setting(
        "AWS_REGION", REGION, "", "", "none (region from IMDS)",
        "EC2 region; unset = the instance's region, from IMDS.")
    endpoint: str | None = setting(
        "AWS_EC2_ENDPOINT", Kind(parse_endpoint, lambda value: value or ""), "", "",
        "`AWS_EC2_ENDPOINT`", "EC2 endpoint URL (http:// or https://); unset = the region's.")
    http_timeout_s: int = setting(
        "HTTP_TIMEOUT", integer(10), "10", "s (integer)", "`HTTP_TIMEOUT` (values < 10 become 10)",
        "Timeout of each HTTP request to EC2; at least 10.")
    call_timeout_s: float = setting(
        "IPAMD_EC2_CALL_TIMEOUT", INTERVAL, "10", "s", "none",
        "Deadline on each EC2 call ipamd awaits, so a hung call cannot stall a task.")
    imds_endpoint: str | None = setting(
        "AWS_EC2_METADATA_SERVICE_ENDPOINT", Kind(parse_endpoint, lambda value: value or ""), "",
        "", "none",
        "IMDS base URL (http:// or https://), the AWS SDKs' variable; unset = `http://169.254.169.254`.")


@dataclass(frozen=True, slots=True, kw_only=True)
class EndpointSettings:
    """Where ipamd serves: its API socket, metrics and introspection."""

    socket_path: str = setting(
        "IPAMD_SOCKET", SOCKET, "/run/ipamd/ipamd.sock", "", "none (gRPC on its own socket)",
        "Unix socket of the local HTTP API used by ipamd-cni and ipamctl.", "./.run/ipamd.sock")
    disable_metrics: bool = setting(
        "DISABLE_METRICS", BOOL, "false", "", "`DISABLE_METRICS`",
        "Do not serve Prometheus metrics.")
    metrics_addr: HostPort = setting(
        "IPAMD_METRICS_ADDR", Kind(parse_host_port), "127.0.0.1:61678", "",
        "none (`:61678` on all interfaces)",
        "Listen address of the Prometheus metrics endpoint: host:port, `[::1]:61678` for IPv6.")
    disable_introspection: bool = setting(
        "DISABLE_INTROSPECTION", BOOL, "false", "", "`DISABLE_INTROSPECTION`",
        "Do not serve the introspection endpoint.")
    introspection_bind_address: HostPort = setting(
        "INTROSPECTION_BIND_ADDRESS", Kind(parse_host_port), "127.0.0.1:61679", "",
        "`INTROSPECTION_BIND_ADDRESS` (also takes `unix:<path>`)",
        "Listen address of the read-only introspection endpoint (VPC CNI's `/v1/enis`, `/v1/pods`, "
        "`/v1/ipamd-env-settings`, `/v1/networkutils-env-settings`): host:port, loopback by "
        "default, since it lists every pod's address.")


@dataclass(frozen=True, slots=True, kw_only=True)
class StorageSettings:
    """Where ipamd's state lives, and aws-node's checkpoint it keeps current."""

    state_dir: str = setting(
        "IPAMD_STATE_DIR", Kind(str), "/var/lib/ipamd", "",
        "`AWS_VPC_K8S_CNI_BACKING_STORE` (a JSON file)",
        "Directory of the SQLite state file.", "./.run/state")
    aws_node_checkpoint: str = setting(
        "AWS_VPC_K8S_CNI_BACKING_STORE", Kind(str), "/var/run/aws-node/ipam.json", "",
        "`AWS_VPC_K8S_CNI_BACKING_STORE`",
        "VPC CNI's checkpoint (`vpc-cni-ipam/1`): read at start to adopt the pods aws-node left "
        "running, and kept current (every ADD waits for it) so aws-node started again restores "
        "every pod.", "./.run/aws-node/ipam.json")


@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkPolicySettings:
    """The network-policy agent's contract (`ipamd.netpolicy`)."""

    mode: str = setting(
        "NETWORK_POLICY_ENFORCING_MODE", choice("none", "standard", "strict", optional=True), "",
        "", "`NETWORK_POLICY_ENFORCING_MODE` (manifest `standard`)",
        "`standard` or `strict`: every ADD and DEL tells the EKS network-policy agent (an agent that "
        "cannot be reached fails the ADD); `none`: never; unset: only while the agent's socket "
        "exists. The agent is told `standard` unless `strict` is set.")
    config_server_socket: str = setting(
        "IPAMD_CONFIG_SERVER_SOCKET", SOCKET, "/var/run/aws-node/ipamd.sock", "",
        "ipamd's gRPC socket (fixed)",
        "Unix socket where ipamd serves gRPC `rpc.ConfigServerBackend`, which the network-policy "
        "agent reads its configuration from.", "./.run/aws-node/ipamd.sock")
    agent_socket: str = setting(
        "IPAMD_NETWORK_POLICY_AGENT_SOCKET", SOCKET, "/var/run/aws-node/npa.sock", "",
        "the plugin's agent socket (fixed)",
        "Unix socket of the network-policy agent's gRPC `rpc.NPBackend`.",
        "./.run/aws-node/npa.sock")


@dataclass(frozen=True, slots=True, kw_only=True)
class KubeSettings:
    """ipamd's part in its Node's life in the Kubernetes API (`ipamd.kube`)."""

    mode: str = setting(
        "IPAMD_KUBERNETES", choice("auto", "on", "off"), "auto", "", "none (always on)",
        "Read this node's objects from the Kubernetes API server: `on` (start-up waits up to 30 s "
        "for it, then goes on without), `off`, or `auto`: on when a kubeconfig (KUBECONFIG) or the "
        "pod's service-account token is there. `--embedded`: only with KUBECONFIG.")
    node_name: str = setting(
        "MY_NODE_NAME", NODE_NAME, "", "", "`MY_NODE_NAME`",
        "This node's name in Kubernetes (the DaemonSet sets it from `spec.nodeName`); needed when "
        "the Kubernetes API is on.")
    startup_taint: str = setting(
        "IPAMD_STARTUP_TAINT", TAINT, "", "", "none (aws-node removes no taint)",
        "A taint (`key[=value]:Effect`, e.g. `ipamd.k8s.aws/agent-not-ready:NoSchedule`) that "
        "ipamd removes from its own Node once it is ready to serve ADDs; no other taint is ever "
        "touched. Needs the Kubernetes API.")
    pod_aware_pool: str = setting(
        "IPAMD_POD_AWARE_POOL", choice("auto", "on", "off"), "auto", "", "none (VPC CNI ignores "
        "pending pods)",
        "Watch this node's pods (`spec.nodeName`) and keep a free address for every pod bound here "
        "that holds none yet, whatever the warm targets ask: the pool grows at the scheduler's "
        "binding, not at the sandbox's ADD, so warm targets can be near 0. `auto`: on when the "
        "Kubernetes API is used; `on` without it is a start-up error.")
    manage_enis_non_schedulable: bool = setting(
        "AWS_MANAGE_ENIS_NON_SCHEDULABLE", BOOL, "false", "", "`AWS_MANAGE_ENIS_NON_SCHEDULABLE`",
        "With the Kubernetes API: `false` leaves the ENIs and addresses as they are while the node "
        "has the taint node.kubernetes.io/unschedulable:NoSchedule (cordoned, draining): no growth, "
        "no release; `true` manages them all the same. Without the API it changes nothing.")
    annotate_pod_ip: bool = setting(
        "ANNOTATE_POD_IP", BOOL, "false", "", "`ANNOTATE_POD_IP`",
        "Annotate each pod with `vpc.amazonaws.com/pod-ips` (its first address) on ADD, and clear "
        "it on DEL, so the network-policy controller knows the pod's address before the kubelet "
        "reports it. Needs the Kubernetes API; a failed write is logged, never fails the ADD.")


@dataclass(frozen=True, slots=True, kw_only=True)
class LogSettings:
    """ipamd's own log (`ipamd.telemetry.logs`)."""

    format: LogFormat = setting(
        "IPAMD_LOG_FORMAT", choice("auto", "json", "text"), "auto", "", "none (always JSON)",
        "Format of ipamd's log on its standard error: `json`, `text`, or `auto` (text on a "
        "terminal, JSON otherwise). The log file (AWS_VPC_K8S_CNI_LOG_FILE) is always JSON.")
    level: LogLevel = setting(
        "AWS_VPC_K8S_CNI_LOGLEVEL", LOG_LEVEL, "info", "",
        "`AWS_VPC_K8S_CNI_LOGLEVEL` (default `DEBUG`)",
        "Level of ipamd's log, on its standard error and in AWS_VPC_K8S_CNI_LOG_FILE: debug, "
        "info, warn, error or fatal, in any case. At debug the AWS SDK's own lines stay at info "
        "(they hold whole requests).")
    file: str | None = setting(
        "AWS_VPC_K8S_CNI_LOG_FILE", LOG_FILE, DEFAULT_LOG_FILE, "",
        "`AWS_VPC_K8S_CNI_LOG_FILE` (default `/host/var/log/aws-routed-eni/ipamd.log`, the same "
        "node file through aws-node's `/host` mount)",
        "ipamd's log file: the JSON lines of its standard error, rotated at 100 MB (five gzipped "
        "backups, 30 days); `stdout` or `stderr`: no file. A file that cannot be opened is said "
        "once on standard error and ipamd goes on.",
        "./.run/aws-routed-eni/ipamd.log")


@dataclass(frozen=True, slots=True, kw_only=True)
class EmbeddedSettings:
    """The simulated instance of `ipamd run --embedded`."""

    instance_type: str = setting(
        "IPAMD_EMBEDDED_INSTANCE_TYPE", INSTANCE_TYPE, "m5.large", "", "none",
        "Instance type of the simulated instance under `ipamd run --embedded`.")
    pod_subnet: str | None = setting(
        "IPAMD_EMBEDDED_POD_SUBNET", POD_SUBNET, "", "", "none",
        "Under `ipamd run --embedded`, a second subnet of the VPC (on a secondary CIDR block), "
        "tagged `kubernetes.io/role/cni=1` in the node's zone, for subnet discovery to choose; "
        "e.g. `100.64.0.0/16`, which has more free addresses than the node's. Read when the "
        "embedded cloud is first made.")
# fmt: on
