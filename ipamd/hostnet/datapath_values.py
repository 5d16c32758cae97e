"""The host-network owner's values: its settings (VPC CNI's datapath knobs, and its own retry
pace) and what it reports having done. Plain data, no I/O."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True, slots=True)
class DatapathSettings:
    mtu: int = 9001
    """AWS_VPC_ENI_MTU: the MTU of every secondary ENI's link."""
    external_snat: bool = False
    exclude_snat_cidrs: tuple[str, ...] = ()
    randomize_snat: Literal["prng", "hashrandom", "none"] = "prng"
    ipv6_egress_cidr: str = ""
    """IPv6 mode: the IPv4 egress range of IPv6 pods, which the SNAT table then only SNATs to the
    node's IPv4 (`ipamd.hostnet.snat.SnatPlan.egress_cidr`); "" in IPv4 mode. The external SNAT
    and exclusion settings are IPv4 mode's and do not apply."""
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
