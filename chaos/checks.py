"""What must hold after every fault, checked from the outside: the daemon's API, its state file (read
through a read-only connection of our own) and moto's EC2 state.

- every acknowledged ADD whose pod was not deleted is allocated, with the same address, in the API
  and on disk (otherwise it counts as *lost*);
- no container whose DEL was acknowledged owns anything, in the API or on disk;
- no address has two owners (API and disk), and the state file carries the unique index that forbids
  it; no claim was set aside at load (quarantined: the daemon could not trust its own state);
- every owned address is on the instance's ENIs in EC2;
- nothing is allocated to a container the ledger does not know.

Call it with no churn in flight: ADDs and DELs change what is checked.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from chaos.node import ChaosNode
from chaos.pods import IFNAME, Ledger
from datastore.readonly import has_unique_owner_index, read_disk
from ipamd.wire import PATH_ALLOCATIONS

Owners = dict[str, list[str]]
"""address -> the container IDs owning it."""


@dataclass
class Verdict:
    problems: list[str] = field(default_factory=list)
    lost: set[str] = field(default_factory=set)
    """Container IDs whose acknowledged ADD is not held with its address."""
    double_owners: set[str] = field(default_factory=set)
    """Addresses with more than one owner."""

    @property
    def ok(self) -> bool:
        return not self.problems


async def check_node(node: ChaosNode, ledger: Ledger) -> Verdict:
    verdict = Verdict()
    in_ec2 = node.ec2_addresses()  # before the API: no allocation is made while checking
    api = await _api_owners(node, verdict)
    disk = _disk_owners(node, verdict)
    for source, owners in (("api", api), ("disk", disk)):
        if owners is not None:
            _check_owners(source, owners, ledger, verdict)
    if api is not None:
        outside = sorted(a for a in api if a not in in_ec2)
        if outside:
            verdict.problems.append(f"owned but not on the instance's ENIs in EC2: {outside[:5]}")
    return verdict


async def _api_owners(node: ChaosNode, verdict: Verdict) -> Owners | None:
    try:
        status, body = await node.daemon.api("GET", PATH_ALLOCATIONS)
    except (OSError, aiohttp.ClientError, TimeoutError, ValueError) as err:
        verdict.problems.append(f"GET /v1/allocations failed: {err!r}")
        return None
    if status != 200:
        verdict.problems.append(f"GET /v1/allocations answered {status}: {body}")
        return None
    owners: Owners = {}
    for alloc in body["allocations"]:
        _own(owners, alloc, [ip["address"] for ip in alloc["ips"]], verdict)
    if body["quarantined"]:
        verdict.problems.append(f"api: claims set aside at load: {body['quarantined'][:3]}")
    return owners


def _own(owners: Owners, record: dict[str, Any], addresses: list[str], verdict: Verdict) -> None:
    if record.get("ifname") != IFNAME:
        verdict.problems.append(f"an allocation for an interface never added: {record}")
    for address in addresses:
        owners.setdefault(str(address).partition("/")[0], []).append(str(record["container_id"]))


def _disk_owners(node: ChaosNode, verdict: Verdict) -> Owners | None:
    try:
        image = read_disk(node.state_file)
        unique = has_unique_owner_index(node.state_file)
    except (sqlite3.Error, OSError) as err:
        verdict.problems.append(f"state file unreadable: {err!r}")
        return None
    if not unique:
        verdict.problems.append("the state file lacks its unique owner index")
    owners: Owners = {}
    for alloc in image.allocations:
        for address in alloc.addresses:
            owners.setdefault(address, []).append(alloc.key.container_id)
    if image.quarantine:
        verdict.problems.append(f"disk: claims set aside at load: {image.quarantine[:3]}")
    return owners


def _check_owners(source: str, owners: Owners, ledger: Ledger, verdict: Verdict) -> None:
    by_container: dict[str, set[str]] = {}
    for address, containers in owners.items():
        if len(containers) > 1:
            verdict.double_owners.add(address)
            verdict.problems.append(f"{source}: {address} has {len(containers)} owners")
        for cid in containers:
            by_container.setdefault(cid, set()).add(address)
    for pod in ledger.in_state("live"):
        held = by_container.get(pod.container_id, set())
        if pod.address not in held:
            verdict.lost.add(pod.container_id)
            verdict.problems.append(
                f"{source}: acknowledged ADD lost: {pod.name} had {pod.address}, now {sorted(held)}"
            )
    for pod in ledger.in_state("deleted"):
        if pod.container_id in by_container:
            verdict.problems.append(
                f"{source}: {pod.name} still owns {sorted(by_container[pod.container_id])} "
                "after its acknowledged DEL"
            )
    unknown = Counter(cid for cid in by_container if cid not in ledger.pods)
    if unknown:
        verdict.problems.append(f"{source}: owners the ledger never added: {sorted(unknown)[:3]}")


async def deferred_outstanding(node: ChaosNode, ledger: Ledger) -> list[str] | None:
    """Pods whose DEL was deferred (ipamd unreachable) and still own an address; None if unknown."""
    try:
        status, body = await node.daemon.api("GET", PATH_ALLOCATIONS)
    except (OSError, aiohttp.ClientError, TimeoutError, ValueError):
        return None
    if status != 200:
        return None
    held = {str(a["container_id"]) for a in body["allocations"]}
    return [pod.name for pod in ledger.in_state("deferred") if pod.container_id in held]
