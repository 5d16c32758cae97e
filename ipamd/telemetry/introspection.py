"""VPC CNI's introspection endpoint: read-only JSON over TCP on `INTROSPECTION_BIND_ADDRESS`
(`127.0.0.1:61679`), with VPC CNI's paths and shapes, for the tools and runbooks written against it
(`curl localhost:61679/v1/enis`, the EKS log collector).

| path | answer |
|---|---|
| `/` | `{"AvailableCommands": [...]}`, the paths below |
| `/v1/enis` | VPC CNI's `ENIInfos`: `TotalIPs`, `AssignedIPs`, `ENIs` keyed by ENI ID |
| `/v1/pods` | `<pod name>_<namespace>_<container ID>` → `{"IPAMKey", "IP", "DeviceNumber"}` |
| `/v1/ipamd-env-settings` | the effective settings, as `Config.describe()` gives them, except ... |
| `/v1/networkutils-env-settings` | ... the host network's, which VPC CNI lists apart |
| `/v1/max-pods` | ipamd's own: the node's max pods, the rule that set it and why, the kubelet config read |

Each answer is built from one engine snapshot and the allocations and cooldowns read in the same
synchronous step (no `await` between them, and the engine changes memory only in a synchronous
`apply`), so it shows one moment. It must not change anything, and must not be served on anything
but the address it is given: it lists every pod's address and container.
"""

from __future__ import annotations

import base64
import ipaddress
from collections.abc import Mapping
from datetime import UTC, datetime

from aiohttp import web

from datastore.records import AllocationRecord
from ipamd.config.kinds import HostPort
from ipamd.engine.engine import Engine
from ipamd.model import AddressState, EniView, PoolSnapshot, UnitView
from ipamd.telemetry.endpoint import serve_tcp
from ipamd.telemetry.totals import total_addresses

PATH_ENIS = "/v1/enis"
PATH_PODS = "/v1/pods"
PATH_IPAMD_ENV = "/v1/ipamd-env-settings"
PATH_NETWORKUTILS_ENV = "/v1/networkutils-env-settings"
PATH_MAX_PODS = "/v1/max-pods"
PATHS = (PATH_ENIS, PATH_PODS, PATH_IPAMD_ENV, PATH_NETWORKUTILS_ENV, PATH_MAX_PODS)

NETWORKUTILS_SETTINGS = frozenset(
    {
        "AWS_VPC_ENI_MTU",
        "POD_MTU",
        "AWS_VPC_K8S_CNI_EXTERNALSNAT",
        "AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS",
        "AWS_VPC_K8S_CNI_RANDOMIZESNAT",
        "AWS_VPC_CNI_NODE_PORT_SUPPORT",
        "IPAMD_HOST_NETWORK",
        "IPAMD_HOST_NETWORK_RECONCILE_INTERVAL",
    }
)
"""The settings of the host's datapath: VPC CNI's networkutils package reads its own."""

_GO_ZERO_TIME = "0001-01-01T00:00:00Z"
"""How Go writes a zero `time.Time`: VPC CNI's never-set AssignedTime and UnassignedTime."""

ENGINE = web.AppKey("engine", Engine)
SETTINGS: web.AppKey[Mapping[str, str]] = web.AppKey("settings")
MAX_PODS: web.AppKey[Mapping[str, object]] = web.AppKey("max_pods")


def _go_time(epoch_s: float | None) -> str:
    if epoch_s is None:
        return _GO_ZERO_TIME
    return datetime.fromtimestamp(epoch_s, UTC).isoformat().replace("+00:00", "Z")


def _go_ipnet(cidr: str) -> dict[str, str]:
    """A CIDR as Go's JSON writes a `net.IPNet`: the address, and the mask's bytes in base64."""
    net = ipaddress.ip_network(cidr)
    return {
        "IP": str(net.network_address),
        "Mask": base64.b64encode(net.netmask.packed).decode(),
    }


def _ipam_key(record: AllocationRecord | None) -> dict[str, str]:
    if record is None:
        return {"networkName": "", "containerID": "", "ifName": ""}
    key = record.key
    return {"networkName": key.network, "containerID": key.container_id, "ifName": key.ifname}


def _metadata(record: AllocationRecord | None) -> dict[str, str]:
    if record is None:
        return {}
    # Go's `omitempty`: absent when unknown.
    fields = {"k8sPodNamespace": record.pod_namespace, "k8sPodName": record.pod_name}
    return {k: v for k, v in fields.items() if v}


class View:
    """One moment of the engine: the snapshot, who owns each address, when each cooled one was
    released."""

    def __init__(self, engine: Engine) -> None:
        # One synchronous step: nothing can change the engine between these reads.
        state = engine.state
        self.snapshot: PoolSnapshot = engine.snapshot()
        self.allocations: tuple[AllocationRecord, ...] = tuple(state.allocations().values())
        self.owners: dict[str, AllocationRecord] = {
            address: record for record in self.allocations for address in record.addresses
        }
        self.released_at: dict[str, float] = dict(state.cooldowns())


CIDRS_BY_VERSION: Mapping[int, str] = {4: "AvailableIPv4Cidrs", 6: "IPv6Cidrs"}
"""VPC CNI's `ENIInfo` keeps an ENI's units in one map per IP version, named by these keys."""


def _cidr_info(view: View, unit: UnitView, version: int) -> dict[str, object]:
    addresses: dict[str, object] = {}
    for address, _ in unit.addresses:
        owner = view.owners.get(address)
        addresses[address] = {
            "Address": address,
            "IPAMKey": _ipam_key(owner),
            "IPAMMetadata": _metadata(owner),
            "AssignedTime": _go_time(owner.created_at if owner else None),
            "UnassignedTime": _go_time(None if owner else view.released_at.get(address)),
        }
    return {
        "Cidr": _go_ipnet(unit.cidr),
        "IPAddresses": addresses,
        "IsPrefix": unit.kind != "ip",
        "AddressFamily": str(version),
    }


def _eni(view: View, eni: EniView) -> dict[str, object]:
    cidrs: dict[str, dict[str, object]] = {key: {} for key in CIDRS_BY_VERSION.values()}
    for unit in eni.units:
        version = ipaddress.ip_network(unit.cidr).version
        cidrs[CIDRS_BY_VERSION[version]][unit.cidr] = _cidr_info(view, unit, version)
    return {
        "ID": eni.eni_id,
        "IsPrimary": eni.is_primary,
        # ipamd manages neither trunk ENIs (security groups for pods) nor EFA ENIs.
        "IsTrunk": False,
        "IsEFA": False,
        "DeviceNumber": eni.device_index,
        **cidrs,
    }


def eni_infos(view: View) -> dict[str, object]:
    """VPC CNI's `ENIInfos`. Every address of every IPv4 unit is listed (VPC CNI lists only those a
    pod has used); an IPv6 /80 is under its ENI's `IPv6Cidrs`, with the addresses in use (assigned
    or cooling), as VPC CNI lists them, never its 2^48. TotalIPs and AssignedIPs are
    `awscni_total_ip_addresses` and `awscni_assigned_ip_addresses` of the same moment: VPC CNI's
    total counts a /80 as 2^48 (`ipamd.telemetry.totals`)."""
    counts = view.snapshot.counts
    return {
        "TotalIPs": total_addresses(view.snapshot),
        "AssignedIPs": counts[AddressState.ASSIGNED],
        "ENIs": {eni.eni_id: _eni(view, eni) for eni in view.snapshot.enis},
    }


def pod_infos(view: View) -> dict[str, object]:
    """`<pod name>_<namespace>_<container ID>` → the pod's address, as VPC CNI's `/v1/pods` keyed
    it. A container with several attachments (ifnames, networks) gets one key each, the ifname and
    network appended, so that none hides another."""
    device = {eni.eni_id: eni.device_index for eni in view.snapshot.enis}
    per_container: dict[str, int] = {}
    for record in view.allocations:
        cid = record.key.container_id
        per_container[cid] = per_container.get(cid, 0) + 1
    pods: dict[str, object] = {}
    ordered = sorted(view.allocations, key=lambda r: (r.key.container_id, r.key.ifname))
    for record in ordered:
        key = f"{record.pod_name}_{record.pod_namespace}_{record.key.container_id}"
        if per_container[record.key.container_id] > 1:
            key += f"_{record.key.ifname}_{record.key.network}"
        pods[key] = {
            "IPAMKey": _ipam_key(record),
            "IP": record.addresses[0] if record.addresses else "",
            "DeviceNumber": device.get(record.eni_id, -1),
        }
    return pods


def split_settings(settings: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(ipamd's, the host network's) settings, as VPC CNI lists them on two paths."""
    ipamd = {k: v for k, v in settings.items() if k not in NETWORKUTILS_SETTINGS}
    network = {k: v for k, v in settings.items() if k in NETWORKUTILS_SETTINGS}
    return ipamd, network


async def _root(_: web.Request) -> web.Response:
    return web.json_response({"AvailableCommands": list(PATHS)})


async def _enis(request: web.Request) -> web.Response:
    return web.json_response(eni_infos(View(request.app[ENGINE])))


async def _pods(request: web.Request) -> web.Response:
    return web.json_response(pod_infos(View(request.app[ENGINE])))


async def _ipamd_env(request: web.Request) -> web.Response:
    return web.json_response(split_settings(request.app[SETTINGS])[0])


async def _networkutils_env(request: web.Request) -> web.Response:
    return web.json_response(split_settings(request.app[SETTINGS])[1])


async def _max_pods(request: web.Request) -> web.Response:
    body: Mapping[str, object] = request.app[MAX_PODS]
    return web.json_response(dict(body))


def create_introspection_app(
    engine: Engine, settings: Mapping[str, str], max_pods: Mapping[str, object] | None = None
) -> web.Application:
    """The endpoint's app: GET only; `settings` is the effective configuration by variable,
    `max_pods` the node's max pods and the rule that set it (fixed once the daemon is built)."""
    app = web.Application()
    app[ENGINE] = engine
    app[SETTINGS] = dict(settings)
    app[MAX_PODS] = dict(max_pods or {})
    app.router.add_get("/", _root)
    app.router.add_get(PATH_ENIS, _enis)
    app.router.add_get(PATH_PODS, _pods)
    app.router.add_get(PATH_IPAMD_ENV, _ipamd_env)
    app.router.add_get(PATH_NETWORKUTILS_ENV, _networkutils_env)
    app.router.add_get(PATH_MAX_PODS, _max_pods)
    return app


async def serve_introspection(
    engine: Engine,
    settings: Mapping[str, str],
    addr: HostPort,
    max_pods: Mapping[str, object] | None = None,
    *,
    or_free_port: bool = False,
) -> web.AppRunner:
    """Serve the endpoint on `addr` (`or_free_port`: see `serve_tcp`); raises
    `ipamd.telemetry.endpoint.ListenFailed` if it cannot listen."""
    app = create_introspection_app(engine, settings, max_pods)
    return await serve_tcp(app, addr, "INTROSPECTION_BIND_ADDRESS", or_free_port=or_free_port)
