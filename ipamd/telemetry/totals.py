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

from ipamd.engine.state import IPV6_PREFIX
from ipamd.model import PoolSnapshot, UnitView

V6_PREFIX_SIZE = 2**48
"""The addresses of a /80 as VPC CNI counts them: all of it, its ::0 too."""


def unit_total(unit: UnitView) -> int:
    """One unit's part of the total: its size for a /80 the node still holds (active or being
    released), otherwise the addresses the snapshot gives a state (a lost unit's owned ones)."""
    if unit.kind == IPV6_PREFIX and unit.state != "lost":
        return V6_PREFIX_SIZE
    return len(unit.addresses) + unit.unlisted


def total_addresses(snapshot: PoolSnapshot) -> int:
    """VPC CNI's `TotalIPs`: on an IPv4 node, the addresses of every state the snapshot counts."""
    return sum(unit_total(unit) for eni in snapshot.enis for unit in eni.units)
