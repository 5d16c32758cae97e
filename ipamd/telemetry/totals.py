"""The node's address total as VPC CNI reports it, shared by `awscni_total_ip_addresses` and the
introspection endpoint's `TotalIPs`, so that the two agree on one snapshot.

VPC CNI's total is the size of every unit its datastore holds: 1 for a secondary IP, 16 for a /28,
and 2^48 for IPv6 mode's /80 (its `CidrInfo.Size()` is 2^(128 - 80) for an IPv6 prefix as for an
IPv4 one), so on an IPv6 node its total is 2^48 whatever the pods, and its assigned count is the
pods' /128s. ipamd reports the same total with the same meaning: the addresses the node holds.
Usable capacity is another figure: in IPv6 mode it is max pods (`awscni_ip_max`, `ipamd_max_pods`),
and ipamd's own counts (`ipamd_addresses`, `GET /v1/pool`, `ipamctl status`) count as free only the
pods max pods still allows, never the /80's 2^48 (`ipamd.engine.snapshot`).
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache

from ipamd.model import PoolSnapshot, UnitView

V6_PREFIX_SIZE = 2**48
"""The addresses of a /80 as VPC CNI counts them: all of it, its ::0 too."""


@lru_cache(maxsize=1024)  # a node holds tens of units; churn brings new ones
def _cidr_size(cidr: str) -> int:
    return ipaddress.ip_network(cidr).num_addresses


def unit_total(unit: UnitView) -> int:
    """One unit's part of the total: the size of its CIDR while the node holds it (active or being
    released), as VPC CNI's `CidrInfo.Size()` counts it (1, 16, or 2^48 for a /80); for a lost unit,
    the addresses the snapshot still gives a state (its owned ones)."""
    if unit.state == "lost":
        return len(unit.addresses) + (unit.unlisted or 0)
    return _cidr_size(unit.cidr)


def total_addresses(snapshot: PoolSnapshot) -> int:
    """VPC CNI's `TotalIPs`: on an IPv4 node, the addresses of every state the snapshot counts."""
    return sum(unit_total(unit) for eni in snapshot.enis for unit in eni.units)
