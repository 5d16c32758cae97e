"""Where a new ENI's addresses come from, which ENIs take no new pods, and which ENIs are not ipamd's
to use at all: VPC CNI's subnet discovery (`ENABLE_SUBNET_DISCOVERY`) and unmanaged ENIs, as pure
functions of plain values.

Subnet discovery reads the subnets of the node's VPC and zone (EC2 filters on both) and their tags:

- `kubernetes.io/role/cni=0` excludes a subnet, the node's own included;
- any other non-empty value of that tag opts a subnet in; an untagged subnet is not used, except the
  node's own subnet, which is used unless tagged `0`;
- with `CLUSTER_NAME` set, a tagged subnet that carries `cni.networking.k8s.aws/cluster/<name>` keys
  is for the clusters they name only; without it, those keys are ignored;
- the subnet with the most free addresses is chosen, ties broken by the lower subnet ID (EC2's
  listing order is not stable), and the next one is tried when a create finds no room;
- a subnet a call found without room (a create, or an assign on one of its ENIs) is *full* until a
  later view shows it with as many free addresses as that call asked for: it goes last among the
  candidates, and while some candidate is not full its ENIs get no new units, so that new ENIs in
  the other subnets take over (VPC CNI with discovery likewise creates an ENI when an unfilled
  one's subnet is out of addresses); an ENI's addresses come from its own subnet, so growing it
  could only fail again.

A subnet is *excluded* (VPC CNI's `IsSubnetExcluded`) when it is tagged `0`, or opted in but scoped to
other clusters; an untagged subnet never is. ENIs in an excluded subnet take no new pods, their
wholly free units go back to EC2, and the ENI itself once nothing on it is used (`plan_drain`); the
primary ENI stays, since it goes only with the instance.

An ENI is never used or touched (`left_alone`) when it is tagged `node.k8s.amazonaws.com/no_manage=true`
(VPC CNI's tag) or is not an ordinary interface (EFA, EFA-only, trunk, branch, ...); the primary ENI
always is the node's, as in VPC CNI.

This module must not import asyncio, do I/O, or know the engine, datastore or cloud adapters.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Final

from ipamd.sizing.inputs import NodeLimits, NodeStats, PoolTargets
from ipamd.sizing.plan import PoolPlan, effective_max_enis

ROLE_TAG: Final = "kubernetes.io/role/cni"
"""VPC CNI's subnet discovery tag: `0` excludes a subnet, any other value opts it in."""
ROLE_EXCLUDED: Final = "0"
CLUSTER_TAG_PREFIX: Final = "cni.networking.k8s.aws/cluster/"
"""A subnet tagged `<prefix><cluster name>` is for that cluster only."""
NO_MANAGE_TAG: Final = "node.k8s.amazonaws.com/no_manage"
"""VPC CNI's tag on an ENI that is someone else's: `true` and ipamd never uses or touches it."""
POD_INTERFACE_TYPE: Final = "interface"
"""EC2's InterfaceType of an ordinary ENI, the only kind that carries pods."""


@dataclass(frozen=True, slots=True)
class SubnetFacts:
    """One subnet as DescribeSubnets shows it: what discovery decides on."""

    subnet_id: str
    available_ips: int
    tags: Mapping[str, str]


def scoped_elsewhere(tags: Mapping[str, str], cluster_name: str) -> bool:
    """Tagged for some clusters, none of them this one. Never without a cluster name."""
    if not cluster_name:
        return False
    scopes = {key for key in tags if key.startswith(CLUSTER_TAG_PREFIX)}
    return bool(scopes) and CLUSTER_TAG_PREFIX + cluster_name not in scopes


def takes_new_enis(subnet: SubnetFacts, node_subnet_id: str, cluster_name: str) -> bool:
    """Whether discovery may create an ENI in `subnet` (VPC CNI's `isSubnetValidForENICreation`)."""
    role = subnet.tags.get(ROLE_TAG, "")
    if role == ROLE_EXCLUDED:
        return False
    if not role:
        return subnet.subnet_id == node_subnet_id
    return not scoped_elsewhere(subnet.tags, cluster_name)


def is_excluded(subnet: SubnetFacts, cluster_name: str) -> bool:
    """Whether the ENIs in `subnet` take no new pods (VPC CNI's `IsSubnetExcluded`)."""
    role = subnet.tags.get(ROLE_TAG, "")
    if not role:
        return False
    return role == ROLE_EXCLUDED or scoped_elsewhere(subnet.tags, cluster_name)


def rank_subnets(
    subnets: Iterable[SubnetFacts],
    node_subnet_id: str,
    cluster_name: str,
    full: Collection[str] = (),
) -> tuple[str, ...]:
    """The subnets a new ENI may go to, the one with the most free addresses first; equal counts
    by subnet ID, so every node given the same listing makes the same choice. Those found `full`
    since the view was read go last: their counts are stale."""
    eligible = (s for s in subnets if takes_new_enis(s, node_subnet_id, cluster_name))
    order = sorted(eligible, key=lambda s: (s.subnet_id in full, -s.available_ips, s.subnet_id))
    return tuple(s.subnet_id for s in order)


def still_full(full: Mapping[str, int], subnets: Iterable[SubnetFacts]) -> dict[str, int]:
    """The full subnets (subnet ID -> addresses the call that found it full asked for) after a new
    view: those it shows with fewer free addresses than that; one it does not list is forgotten."""
    free = {s.subnet_id: s.available_ips for s in subnets}
    return {sid: asked for sid, asked in full.items() if sid in free and free[sid] < asked}


def growth_closed(full: Collection[str], candidates: Iterable[str]) -> frozenset[str]:
    """The subnets whose ENIs get no new units: the full ones, while some candidate for a new ENI
    is not full. None when every candidate is full: then nothing would take over, and growth
    waits out the exhaustion cooldown on the ENIs it has."""
    if not full or all(c in full for c in candidates):
        return frozenset()
    return frozenset(full)


def excluded_subnets(subnets: Iterable[SubnetFacts], cluster_name: str) -> frozenset[str]:
    return frozenset(s.subnet_id for s in subnets if is_excluded(s, cluster_name))


def left_alone(tags: Mapping[str, str], interface_type: str, is_primary: bool) -> bool:
    """Whether an attached ENI belongs to another user of the instance's network: tagged
    `no_manage=true`, or not an ordinary interface. The primary ENI is always the node's."""
    if is_primary:
        return False
    kind = interface_type or POD_INTERFACE_TYPE
    return tags.get(NO_MANAGE_TAG) == "true" or kind != POD_INTERFACE_TYPE


def stop_growth(stats: NodeStats, subnet_of: Mapping[str, str], full: Collection[str]) -> NodeStats:
    """`stats` with the ENIs of the `full` subnets (`subnet_of`: ENI ID -> subnet ID) marked as
    taking no new units (`EniStats.grows`); their free addresses still count."""
    return NodeStats(
        tuple(replace(e, grows=False) if subnet_of.get(e.eni_id) in full else e for e in stats.enis)
    )


# --- draining the ENIs of excluded subnets -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Drain:
    """The pool split in two: the ENIs that take pods, with the targets and limits the pool is
    planned on for them, and what goes back to EC2 from the ENIs that take none."""

    stats: NodeStats
    """The ENIs that take pods: the knobs' goal is met on these alone."""
    targets: PoolTargets
    limits: NodeLimits
    """The ENIs the pool may have: the instance's limit (or MAX_ENI) less the closed ENIs and the
    ENIs of others, which take an attachment each."""
    release_units: tuple[str, ...] = ()
    """Wholly free units of closed ENIs that stay (primary, or still holding used units)."""
    release_enis: tuple[str, ...] = ()
    """Closed secondary ENIs with nothing used or in flight on them."""

    def applied_to(self, plan: PoolPlan) -> PoolPlan:
        """`plan` (made on `stats`) with the closed ENIs' returns added."""
        if not (self.release_units or self.release_enis):
            return plan
        reason = f"{plan.reason}; " if plan.reason else ""
        reason += f"draining {len(self.release_enis)} ENIs and {len(self.release_units)} units"
        return replace(
            plan,
            release_units=plan.release_units + self.release_units,
            release_enis=plan.release_enis + self.release_enis,
            reason=reason,
        )


def plan_drain(
    stats: NodeStats,
    targets: PoolTargets,
    limits: NodeLimits,
    closed: Collection[str],
    others: int = 0,
) -> Drain:
    """Set the `closed` ENIs (those in excluded subnets) apart from the pool. Their free addresses
    are not available, they get no new units, and what of them is wholly free goes back to EC2: the
    whole ENI when nothing on it is used or releasing and it is not the primary, else its wholly free
    units. The minimum ENI lifetime does not hold them: no pod will ever come to them again.

    The closed ENIs and the `others` attached ENIs ipamd leaves alone each take one of the ENIs the
    instance (and MAX_ENI) allows, as in VPC CNI's `hasRoomForEni`."""
    shut = [eni for eni in stats.enis if eni.eni_id in closed]
    if not shut and not others:
        return Drain(stats, targets, limits)
    kept = tuple(eni for eni in stats.enis if eni.eni_id not in closed)
    room = max(effective_max_enis(targets, limits) - len(shut) - others, 0)
    units: list[str] = []
    enis: list[str] = []
    for eni in shut:
        idle = all(u.wholly_free for u in eni.units)
        if idle and not eni.is_primary:
            enis.append(eni.eni_id)
        else:
            units.extend(u.cidr for u in eni.units if u.wholly_free)
    return Drain(
        NodeStats(kept),
        replace(targets, max_eni=None),
        replace(limits, max_enis=room),
        tuple(units),
        tuple(enis),
    )
