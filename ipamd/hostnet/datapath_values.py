"""The host-network owner's values: its settings (VPC CNI's datapath knobs, and its own retry
pace) and what it reports having done. Plain data, no I/O."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from ipamd.hostnet.snat_modes import VPC_SNAT, SnatMode


@dataclass(frozen=True, slots=True)
class DatapathSettings:
    mtu: int = 9001
    """AWS_VPC_ENI_MTU: the MTU of every secondary ENI's link."""
    external_snat: bool = False
    exclude_snat_cidrs: tuple[str, ...] = ()
    randomize_snat: Literal["prng", "hashrandom", "none"] = "prng"
    node_port_support: bool = True
    """AWS_VPC_CNI_NODE_PORT_SUPPORT: ipamd's table marks connections to the node's own addresses
    arriving on the primary ENI (`ipamd.hostnet.snat.SnatPlan.node_port`)."""
    snat: SnatMode = VPC_SNAT
    """What the SNAT table does for the node's family (`ipamd/hostnet/snat_modes.py`): IPv4's
    marks and SNAT out of the VPC, or IPv6's SNAT of its pods' IPv4 egress range alone, to which
    the external SNAT, exclusion and node port settings do not apply."""
    retry_base_s: float = 1.0
    retry_cap_s: float = 30.0


@dataclass(slots=True)
class DatapathHealth:
    """What the owner has done, for metrics and introspection."""

    fixes: Counter[str] = field(default_factory=Counter)
    """Reconcile's repairs by kind: rule_added, rule_removed, route_added, route_removed, snat."""
    reconciles: Counter[str] = field(default_factory=Counter)
    """Reconcile rounds by outcome: ok, unreadable, failed."""
    add_failures: int = 0
    takeover_failures: Counter[str] = field(default_factory=Counter)
    """Takeover steps from aws-node that failed (retried by the next reconcile), by step:
    unreadable, rules, snat."""
    rp_filter_strict: str = ""
    """The primary link's name while its reverse-path filtering is strict and ipamd marks inbound
    connections (NodePort and hostPort replies from pods on secondary ENIs are then dropped); ""
    otherwise."""

    def degraded(self) -> tuple[str, ...]:
        """What works less than it should on this node, one sentence each (`/readyz`)."""
        if not self.rp_filter_strict:
            return ()
        name = self.rp_filter_strict
        return (
            f"reverse-path filtering is strict on the primary interface {name} (rp_filter 1): "
            "NodePort, hostPort and load-balancer connections to pods on secondary ENIs are "
            f"dropped; set net.ipv4.conf.{name}.rp_filter=2 (loose), as ipamd's host-sysctls "
            "init container does",
        )
