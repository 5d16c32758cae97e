"""The IPAM plugin's commands (`COMMANDS`: ADD, DEL, CHECK, GC, STATUS), each one request to
ipamd (`ipamd.cni.plugin` runs them, and the interface plugin, `ipamd.cni.pod_plugin`, calls
them around the pod's veth).

ipamd's answers become CNI errors (JSON on stdout, exit 1) deliberately:

| ipamd | CNI code |
|---|---|
| unreachable (no socket, refused, dropped, 10 s timeout) | ADD/CHECK/GC 11; STATUS 50; DEL success |
| any `retryable` error: `no_address` (empty pool), `store_write_failed` | 11 try again later |
| `delete_intent` (ADD after the container's DEL) | 3 container unknown: no cleanup needed |
| `not_ready` or any other failure of `/readyz` | STATUS: 50 plugin not available |
| `max_pods` | 101 the node holds its max pods |
| `node_full` | 101 every address the node's ENIs can hold is owned by a pod |
| `state_unavailable` | 102 the state file is unusable (`ipamctl repair`); DEL: success |
| `allocation_not_found` | CHECK: 103 no allocation for the attachment |
| `network_policy_refused` (the agent refused; ipamd retracted the allocation) | ADD: 105 |
| ipamd's address missing from prevResult | CHECK: 104 allocation differs from prevResult |
| any other code (`bad_request` from a version skew, `internal`, ...) | 100 ipamd refused the request |
| an answer that is not the expected JSON | 5 I/O failure |

DEL when ipamd cannot act. The spec makes DEL best-effort: it should succeed even when state is
missing, and a DEL that failed until ipamd returned would leave pods Terminating for as long as the
daemon is down or its state file needs repair. So a DEL that cannot reach ipamd, or finds its
state unusable, succeeds with a warning on stderr. Nothing is lost: the allocation stays owned (never
handed to another pod) until ipamd's runtime leak GC sees the sandbox gone from two listings past its
grace period, the CNI GC verb names it stale, or `ipamctl repair` rebuilds from the runtime's list;
each releases it with a delete intent, as the DEL would have. A DEL that ipamd answers with a
retryable error (the write could not be made durable) fails with 11 so that the runtime retries it.

STATUS reports `/readyz` only, never an empty pool: an empty pool is momentary and ADD answers it with
11, while a failed STATUS can make the runtime report the node's network as not ready.
"""

from __future__ import annotations

from ipamd.cni.client import BadAnswer, DaemonError, Unreachable, call, segment
from ipamd.cni.invocation import (
    ERR_INVALID_CONFIG,
    ERR_IO,
    ERR_NOT_AVAILABLE,
    ERR_TRY_AGAIN,
    ERR_UNKNOWN_CONTAINER,
    CniError,
    Invocation,
)
from ipamd.wire import (
    CODE_ALLOCATION_NOT_FOUND,
    CODE_DELETE_INTENT,
    CODE_MAX_PODS,
    CODE_NETWORK_POLICY_REFUSED,
    CODE_NODE_FULL,
    CODE_STATE_UNAVAILABLE,
    PATH_ALLOCATIONS,
    PATH_GC,
    PATH_READYZ,
    AllocateRequest,
    Allocation,
    GcRequest,
    WireError,
)

# `typing` and `collections.abc` cost milliseconds at every pod's ADD and DEL; the annotations below
# are never evaluated.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import IO

ERR_IPAMD = 100
ERR_NODE_FULL = 101
ERR_STATE_UNAVAILABLE = 102
ERR_NO_ALLOCATION = 103
ERR_ALLOCATION_MISMATCH = 104
ERR_NETWORK_POLICY = 105

_DAEMON_CODES = {
    CODE_MAX_PODS: (ERR_NODE_FULL, "the node holds its max pods"),
    CODE_NODE_FULL: (ERR_NODE_FULL, "every address this node's ENIs can hold is in use by a pod"),
    CODE_STATE_UNAVAILABLE: (
        ERR_STATE_UNAVAILABLE,
        "ipamd's state file is unusable; see ipamctl repair",
    ),
    CODE_ALLOCATION_NOT_FOUND: (ERR_NO_ALLOCATION, "ipamd holds no allocation for this attachment"),
}


def from_daemon(err: DaemonError) -> CniError:
    details = f"ipamd: {err.status} {err.body.code}: {err.body.message}"
    if err.body.code == CODE_DELETE_INTENT:
        return CniError(ERR_UNKNOWN_CONTAINER, "the container was already deleted", details)
    if err.body.code == CODE_NETWORK_POLICY_REFUSED:
        # The daemon has already retracted the allocation; the agent's answer is the message.
        msg = f"the network-policy agent refused the pod: {err.body.message}"
        return CniError(ERR_NETWORK_POLICY, msg, details)
    if err.body.retryable:
        return CniError(
            ERR_TRY_AGAIN, "ipamd cannot serve this right now; try again later", details
        )
    code, msg = _DAEMON_CODES.get(err.body.code, (ERR_IPAMD, "ipamd refused the request"))
    return CniError(code, msg, details)


def ask(inv: Invocation, method: str, path: str, body: dict[str, object] | None = None) -> object:
    try:
        return call(inv.conf.socket, method, path, body)
    except Unreachable as err:
        raise CniError(ERR_TRY_AGAIN, "ipamd is not reachable; try again later", str(err)) from None
    except DaemonError as err:
        raise from_daemon(err) from None
    except BadAnswer as err:
        raise CniError(ERR_IO, "unexpected answer from ipamd", str(err)) from None


def one_path(inv: Invocation) -> str:
    return (
        f"{PATH_ALLOCATIONS}/{segment(inv.container_id)}/{segment(inv.ifname)}"
        f"?network={segment(inv.conf.network)}"
    )


def allocation_of(answer: object) -> Allocation:
    try:
        return Allocation.from_json(answer)
    except WireError as err:
        raise CniError(ERR_IO, "unexpected answer from ipamd", str(err)) from None


def interface_address(address: str, gateway: str) -> str:
    """The pod's address as the interface plugin must configure it.

    ipamd hands out single addresses (/32). Standard interface plugins such as `ptp` need the gateway
    inside the address's prefix (they route to it on-link, and remove the prefix route the kernel
    adds, so the prefix length decides nothing else): the address is given the longest prefix that
    still covers the gateway — the node's own address, which `ptp` puts on the host end of each veth —
    and in which both are host addresses.
    A link-local gateway (169.254.0.0/16, for plugins built for /32 pods) keeps the /32.
    """
    host = address.partition("/")[0]
    if not gateway or gateway.startswith("169.254.") or ":" in host:
        return address
    a = int.from_bytes(bytes(int(o) for o in host.split(".")), "big")
    g = int.from_bytes(bytes(int(o) for o in gateway.split(".")), "big")
    prefix = 32 - (a ^ g).bit_length()
    # Neither address may be the prefix's network or broadcast address: a route via a broadcast
    # gateway is refused (EINVAL), so ptp's default route would fail for, e.g., pod 10.0.1.200 and
    # node 10.0.1.203 (the broadcast address of 10.0.1.200/30). A /31 has neither (RFC 3021).
    while prefix < 31 and not _both_hosts(a, g, prefix):
        prefix -= 1
    return f"{host}/{prefix}"


def _both_hosts(a: int, g: int, prefix: int) -> bool:
    host_bits = (1 << (32 - prefix)) - 1
    network = a & ~host_bits & 0xFFFFFFFF
    reserved = (network, network | host_bits)
    return a not in reserved and g not in reserved


def ipam_result(alloc: Allocation, version: str) -> dict[str, object]:
    """The IPAM result in `version`'s shape: 0.4.0 carries each IP's `version`; no `interface`
    indexes (an IPAM plugin knows no interfaces)."""
    ips: list[dict[str, object]] = []
    for ip in alloc.ips:
        entry: dict[str, object] = {
            "address": interface_address(ip.address, ip.gateway),
            "gateway": ip.gateway,
        }
        if version == "0.4.0":
            entry = {"version": "6" if ":" in ip.address else "4", **entry}
        ips.append(entry)
    result: dict[str, object] = {"cniVersion": version, "ips": ips}
    if alloc.routes:
        result["routes"] = [route.to_json() for route in alloc.routes]
    return result


def allocate(inv: Invocation) -> Allocation:
    """ADD's request to ipamd: the attachment's addresses (and, for the interface plugin, whether
    the network-policy agent must be told)."""
    request = AllocateRequest(inv.container_id, inv.ifname, inv.conf.network, inv.pod)
    return allocation_of(ask(inv, "POST", PATH_ALLOCATIONS, request.to_json()))


def add(inv: Invocation, log: IO[str]) -> dict[str, object]:
    return ipam_result(allocate(inv), inv.conf.cni_version)


def delete(inv: Invocation, log: IO[str]) -> None:
    try:
        call(inv.conf.socket, "DELETE", one_path(inv))
    except Unreachable as err:
        reason = str(err)
    except DaemonError as err:
        if err.body.code != CODE_STATE_UNAVAILABLE:
            raise from_daemon(err) from None
        reason = str(err)
    except BadAnswer as err:
        raise CniError(ERR_IO, "unexpected answer from ipamd", str(err)) from None
    else:
        return None
    print(
        f"ipamd-cni: DEL {inv.container_id}/{inv.ifname}: {reason}; reported as done, ipamd's "
        "leak GC or repair releases the address",
        file=log,
    )
    return None


def _listed_addresses(prev: Mapping[str, object]) -> set[str]:
    ips = prev.get("ips", [])
    if not isinstance(ips, list):
        raise CniError(ERR_INVALID_CONFIG, "prevResult.ips must be a list")
    listed = set()
    for ip in ips:
        address = ip.get("address") if isinstance(ip, dict) else None
        if not isinstance(address, str):
            raise CniError(ERR_INVALID_CONFIG, "prevResult.ips[].address must be a string")
        listed.add(address.partition("/")[0])
    return listed


def check(inv: Invocation, log: IO[str]) -> None:
    assert inv.conf.prev_result is not None  # parse_conf requires it for CHECK
    listed = _listed_addresses(inv.conf.prev_result)
    alloc = allocation_of(ask(inv, "GET", one_path(inv)))
    missing = sorted(ip.address for ip in alloc.ips if ip.address.partition("/")[0] not in listed)
    if missing:
        raise CniError(
            ERR_ALLOCATION_MISMATCH,
            "ipamd's allocation differs from prevResult",
            f"prevResult lacks {', '.join(missing)}",
        )


def gc(inv: Invocation, log: IO[str]) -> None:
    assert inv.conf.valid_attachments is not None  # parse_conf requires it for GC
    request = GcRequest(inv.conf.network, inv.conf.valid_attachments)
    ask(inv, "POST", PATH_GC, request.to_json())


def status(inv: Invocation, log: IO[str]) -> None:
    try:
        call(inv.conf.socket, "GET", PATH_READYZ)
    except (Unreachable, DaemonError, BadAnswer) as err:
        raise CniError(ERR_NOT_AVAILABLE, "ipamd is not ready", str(err)) from None


COMMANDS: dict[str, Callable[[Invocation, IO[str]], dict[str, object] | None]] = {
    "ADD": add,
    "DEL": delete,
    "CHECK": check,
    "GC": gc,
    "STATUS": status,
}
