"""The catalogue of every metric ipamd publishes: name, type, labels and help, each declared once.
docs/operations.md's metrics table is checked against it, and `ipamd.telemetry.metrics` builds every family
from it. Pure data: no prometheus_client here (its one home is `ipamd.telemetry.metrics`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

MetricType = Literal["gauge", "counter", "summary", "histogram"]


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str
    type: MetricType
    help: str
    labels: tuple[str, ...] = ()


def _catalogue(rows: Iterable[tuple[str, MetricType, str, str]]) -> tuple[MetricSpec, ...]:
    return tuple(
        MetricSpec(name, kind, text, tuple(labels.split())) for name, kind, labels, text in rows
    )


# fmt: off
CATALOGUE: tuple[MetricSpec, ...] = _catalogue((
    # VPC CNI's metrics (utils/prometheusmetrics), same names, types and labels.
    ("awscni_assigned_ip_addresses", "gauge", "", "The number of IP addresses assigned to pods"),
    ("awscni_total_ip_addresses", "gauge", "", "The total number of IP addresses"),
    ("awscni_total_ipv4_prefixes", "gauge", "", "The total number of IPv4 prefixes"),
    ("awscni_eni_allocated", "gauge", "", "The number of ENIs allocated"),
    ("awscni_eni_max", "gauge", "", "The maximum number of ENIs the instance can attach"),
    ("awscni_ip_max", "gauge", "", "The maximum number of pod addresses the node can hold"),
    ("awscni_assigned_ip_per_cidr", "gauge", "cidr", "IP addresses assigned per CIDR"),
    ("awscni_assigned_ip_per_eni", "gauge", "eni", "IP addresses assigned per ENI"),
    ("awscni_add_ip_req_count", "counter", "", "The number of add IP address requests"),
    ("awscni_del_ip_req_count", "counter", "reason", "The number of delete IP address requests"),
    ("awscni_no_available_ip_addresses", "counter", "",
     "The number of pod IP assignments that fail due to no available IP addresses"),
    ("awscni_ipamd_error_count", "counter", "fn", "The number of errors encountered in ipamd"),
    ("awscni_ipamd_action_inprogress", "gauge", "fn", "The number of ipamd actions in progress"),
    ("awscni_reconcile_count", "counter", "fn", "The number of reconcile rounds by job"),
    ("awscni_aws_api_latency_ms", "summary", "api error status", "AWS API call latency in ms"),
    ("awscni_aws_api_error_count", "counter", "api error",
     "The number of times AWS API returns an error"),
    ("awscni_ec2api_req_count", "counter", "fn", "The number of requests made to EC2 APIs"),
    ("awscni_ec2api_error_count", "counter", "fn", "The number of failed EC2 API requests"),
    ("awscni_force_removed_enis", "counter", "",
     "The number of ENIs EC2 took away while pods held addresses on them"),
    ("awscni_force_removed_ips", "counter", "",
     "The number of pod addresses EC2 took away while pods held them"),
    ("awscni_ipamd_startup_duration_seconds", "histogram", "success with_api_server failure_reason",
     "The duration of ipamd startup from process start to ready to serve CNI requests"),
    ("awscni_ipamd_node_initialization_duration_seconds", "histogram", "success",
     "The duration of node initialization during ipamd startup"),
    ("awscni_connmark_backend", "gauge", "backend", "The connmark backend in use (1)"),
    ("awscni_connmark_reconcile_total", "counter", "result",
     "Host-network reconcile rounds (connmark rule and SNAT table included) by result"),
    ("awscni_build_info", "gauge", "version", "A constant 1 labelled by the ipamd version"),
    # ipamd's own.
    ("ipamd_addresses", "gauge", "state", "Addresses by state (one snapshot)"),
    ("ipamd_lost_addresses", "gauge", "", "Owned addresses EC2 no longer lists"),
    ("ipamd_delete_intents", "gauge", "", "Active delete intents"),
    ("ipamd_quarantined_allocations", "gauge", "", "Allocations set aside at restore"),
    ("ipamd_leaked_allocations_released_total", "counter", "",
     "Allocations the runtime leak GC released"),
    ("ipamd_ec2_calls_total", "counter", "api outcome", "EC2 attempts by operation and outcome"),
    ("ipamd_ec2_retries_total", "counter", "api", "EC2 attempts that were retries"),
    ("ipamd_reconcile_runs_total", "counter", "job outcome", "Reconcile rounds by outcome"),
    ("ipamd_pool_failures_total", "counter", "code", "Pool grow or shrink failures by code"),
    ("ipamd_subnet_free_addresses", "gauge", "",
     "Free addresses in the subnets the node draws from, as last read"),
    ("ipamd_subnet_scarce", "gauge", "",
     "1 while subnet-scarcity mode holds the warm targets at their minimum"),
    ("ipamd_prefix_fallback", "gauge", "",
     "1 while prefix mode grows secondary IPs because no /28 was to be had"),
    ("ipamd_pool_blocked", "gauge", "",
     "1 while the pool cannot grow because EC2 refuses it for good (a subnet or group that does "
     "not exist, a permission): ADDs, /readyz and ipamctl status name the error"),
    ("ipamd_enis_blocked", "gauge", "", "ENIs whose addresses are held back: link not set up yet"),
    ("ipamd_hostnet_rp_filter_strict", "gauge", "",
     "1 while the primary interface filters reverse paths strictly and ipamd marks inbound "
     "connections: NodePort and hostPort replies from pods on secondary ENIs are dropped"),
    ("ipamd_max_pods", "gauge", "rule",
     "The node's max pods, by the rule that set it (kubelet, override, a formula or a vCPU cap)"),
    ("ipamd_hostnet_fixes_total", "counter", "kind", "Host-network reconcile repairs by kind"),
    ("ipamd_hostnet_add_failures_total", "counter", "",
     "ADDs undone: the pod's rules could not be set"),
    ("ipamd_network_policy_calls_total", "counter", "call outcome",
     "Calls to the network-policy agent by call (enforce, delete) and outcome"),
    ("ipamd_network_policy_enforced", "gauge", "",
     "1 while new pods are enforced by the network-policy agent (its mode, or its socket)"),
    ("ipamd_add_latency_seconds", "histogram", "", "Latency of ADD requests on the socket"),
    ("ipamd_del_latency_seconds", "histogram", "", "Latency of DEL requests on the socket"),
))
# fmt: on
SPECS: dict[str, MetricSpec] = {spec.name: spec for spec in CATALOGUE}
