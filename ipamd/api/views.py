"""How the daemon's state reads on the wire. Pure functions of one snapshot or one synchronous read of
the engine's state: they never await, so a response cannot mix two moments.

The pod's gateway. A pod's address is a secondary address of an ENI, but the pod does not sit on the
ENI's link: the host routes its traffic (a /32 route to the pod's veth on the host, the pod's default
route out of its veth). The pod's gateway is therefore the host, not the VPC subnet's router: the
daemon gives the node's own primary address, which a chained `ptp` puts on the host end of each veth
(the CNI plugin widens the pod's /32 to a prefix covering it, as `ptp` requires — `ipamd.cni.plugin`).
Without a node address (tests), the link-local 169.254.1.1 of the AWS VPC CNI is used. An IPv6
node's pods are /128s behind the host veth's link-local `fe80::1` instead: the composition gives the
API its family's `PodRoutes` once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from datastore.records import AllocationRecord, QuarantineRecord
from ipamd.engine.state import NodeState
from ipamd.model import AddressState, EniView, PoolSnapshot, UnitView
from ipamd.wire import Allocation, IpConfig, PodInfo, Route

POD_GATEWAY = "169.254.1.1"
POD_GATEWAY_V6 = "fe80::1"
"""An IPv6 pod's next hop: link-local, answered by the host veth's MAC through a permanent
neighbour entry the interface plugin makes, as in VPC CNI's IPv6 mode."""


@dataclass(frozen=True, slots=True)
class PodRoutes:
    """How the node's pods are answered: each address as a host prefix of `host_bits`, behind
    `gateway`, with `default` as their default route."""

    gateway: str = POD_GATEWAY
    default: str = "0.0.0.0/0"
    host_bits: int = 32


IPV4_POD_ROUTES = PodRoutes()
"""An IPv4 node's without its own address (tests): behind VPC CNI's link-local gateway."""
IPV6_POD_ROUTES = PodRoutes(POD_GATEWAY_V6, "::/0", 128)
"""An IPv6 node's: one /128 per pod, behind the host veth's link-local gateway."""


def allocation(
    record: AllocationRecord,
    routes: PodRoutes = IPV4_POD_ROUTES,
    network_policy: str | None = None,
) -> Allocation:
    """An allocation as ADD and GET answer it; `network_policy` only on ADD's answer (the mode, when
    the plugin must ask for the agent's call)."""
    pod = PodInfo(record.pod_namespace, record.pod_name, record.pod_uid)
    gateway, bits = routes.gateway, routes.host_bits
    return Allocation(
        network=record.key.network,
        container_id=record.key.container_id,
        ifname=record.key.ifname,
        ips=tuple(IpConfig(f"{a}/{bits}", gateway, record.eni_id) for a in record.addresses),
        routes=(Route(routes.default, gateway),),
        created_at=record.created_at,
        pod=pod if pod != PodInfo() else None,
        network_policy=network_policy,
    )


def released(
    records: Iterable[AllocationRecord], routes: PodRoutes = IPV4_POD_ROUTES
) -> dict[str, object]:
    return {
        "released": [
            {
                "network": r.key.network,
                "container_id": r.key.container_id,
                "ifname": r.key.ifname,
                "addresses": [f"{a}/{routes.host_bits}" for a in r.addresses],
            }
            for r in records
        ]
    }


def _counts(counts: dict[AddressState, int]) -> dict[str, int]:
    return {state.value: counts.get(state, 0) for state in AddressState}


def _datapath(eni: EniView, host_network: bool) -> str:
    if not host_network:
        return "off"  # IPAMD_HOST_NETWORK=off: nothing is set up, only the primary ENI's pods send
    return "blocked" if eni.blocked else "ready"


def _eni(eni: EniView, with_units: bool, host_network: bool = True) -> dict[str, object]:
    body: dict[str, object] = {
        "eni_id": eni.eni_id,
        "device_index": eni.device_index,
        "subnet_id": eni.subnet_id,
        "is_primary": eni.is_primary,
        "mac": eni.mac,
        "primary_ip": eni.primary_ip,
        # Host networking: "ready" once its link and route table are set up, "blocked" (and why)
        # until then, "off" when ipamd sets up nothing on the host.
        "datapath": _datapath(eni, host_network),
        "datapath_reason": eni.blocked,
        "counts": _counts(eni.counts),
    }
    if with_units:
        body["units"] = [_unit(u) for u in eni.units]
    else:
        # The units too large to list by address: on an IPv6 node, the ENI's /80.
        prefixes = [u.cidr for u in eni.units if u.unlisted is not None]
        if prefixes:
            body["ipv6_prefixes"] = prefixes
    return body


def _unit(u: UnitView) -> dict[str, object]:
    body: dict[str, object] = {
        "cidr": u.cidr,
        "kind": u.kind,
        "state": u.state,
        "addresses": [{"address": a, "state": s.value} for a, s in u.addresses],
    }
    if u.unlisted is not None:
        # A /80's 2^48 addresses are never listed: those in use are, and this many more count
        # as free in the ENI's counts, the pods max pods still allows.
        body["unlisted"] = u.unlisted
    return body


def pool(snapshot: PoolSnapshot, host_network: bool = True) -> dict[str, object]:
    """`GET /v1/pool`: counts per address state, node-wide and per ENI. In IPv6 mode the primary
    ENI names its /80 (`ipv6_prefixes`, absent on an IPv4 node), and its free count is the pods
    max pods still allows (`ipamd.engine.snapshot`): the usable capacity, not the /80's 2^48."""
    return {
        "taken_at": snapshot.taken_at,
        "counts": _counts(snapshot.counts),
        "allocations": snapshot.allocations,
        "intents": snapshot.intents,
        "quarantined": snapshot.quarantined,
        "enis": [_eni(eni, False, host_network) for eni in snapshot.enis],
    }


def enis(snapshot: PoolSnapshot, host_network: bool = True) -> dict[str, object]:
    """`GET /v1/enis`: every ENI with its units and the state of each address; an IPv6 /80 lists
    the addresses in use (assigned, cooling, lost) and, as `unlisted`, how many more its ENI counts
    free: the pods max pods still allows."""
    return {
        "taken_at": snapshot.taken_at,
        "enis": [_eni(eni, True, host_network) for eni in snapshot.enis],
    }


def _quarantined(q: QuarantineRecord) -> dict[str, object]:
    return {
        "network": q.key.network,
        "container_id": q.key.container_id,
        "ifname": q.key.ifname,
        "addresses": list(q.addresses),
        "reason": q.reason,
        "quarantined_at": q.quarantined_at,
    }


def allocations(
    state: NodeState, now: float, routes: PodRoutes = IPV4_POD_ROUTES
) -> dict[str, object]:
    """`GET /v1/allocations`: every allocation, oldest first, and the quarantined claims; each with
    the gateway ADD answered with."""
    records = sorted(
        state.allocations().values(),
        key=lambda r: (r.created_at, r.key.network, r.key.container_id, r.key.ifname),
    )
    return {
        "taken_at": now,
        "allocations": [allocation(r, routes).to_json() for r in records],
        "quarantined": [_quarantined(q) for q in state.quarantine().values()],
    }


def intents(state: NodeState, now: float, ttl_s: float, limit: int) -> dict[str, object]:
    """`GET /v1/intents`: the delete intents still refusing ADDs, oldest first, at most `limit`.
    Expired intents awaiting their lazy pruning are not listed: they no longer refuse anything."""
    active = [(cid, first) for cid, first in state.intents().items() if now < first + ttl_s]
    active.sort(key=lambda item: item[1])
    return {
        "taken_at": now,
        "ttl_s": ttl_s,
        "total": len(active),
        "intents": [
            {"container_id": cid, "first_del_at": first, "expires_at": first + ttl_s}
            for cid, first in active[:limit]
        ],
    }
