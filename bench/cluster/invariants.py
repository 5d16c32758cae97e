"""The invariants across the cluster, checked at checkpoints and at the end of each run:

- each node's own invariants, those `ipamd.engine.invariants.check_invariants` checks (one owner
  per address, memory equals the state file, no allocation under a live delete intent, ...), with
  the file read through the node's own connection (`node_invariants`, `bench.cluster.limits`);
- every address a pod owns is on an ENI that EC2 (moto) lists attached to that node's instance, in
  the unit ipamd recorded it in, and is not `lost`;
- no address is owned on two nodes;
- no ENI is leaked (a finding counts when two consecutive checks make it, since an ENI attached by
  a call whose answer was lost is adopted by the drift check the IMDS hint triggers seconds later):
  every ENI attached to a node's instance beyond its primary is in that node's inventory or in
  flight in its pool manager, and every detached ENI is in flight, or is one of ipamd's that a
  live node's ENI GC deletes past its grace period: tagged with the cluster's name (every node
  sweeps the cluster's) or with a live node's instance (the pool manager leaves an ENI it could not
  attach or delete, e.g. when throttled, to ENI GC; so does a node terminated mid-step). Those are
  counted apart (`awaiting_eni_gc`); a detached ENI no live node will collect is leaked.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from bench.cluster.node import SimNode
from cloud.embedded import eni_rules
from cloud.ports import MANAGED_BY, TAG_CLUSTER_NAME, TAG_INSTANCE_ID, TAG_MANAGED_BY
from datastore.store import Store
from ipamd.engine.engine import Engine
from ipamd.engine.invariants import InvariantBroken, check_state, normalized


def node_invariants(engine: Engine, store: Store, now: float) -> None:
    """`ipamd.engine.invariants.check_invariants` for a simulated node, the state file read
    through the node's own connection (`store`, the engine's) rather than one of the checker's
    own, which would hold a descriptor per node for as long as the node lives
    (`bench.cluster.limits`). The reading is still the file's, apart from the engine's memory:
    every record is selected and decoded again. The one-owner index is checked by the store at
    open (`missing_indexes`; nothing in the daemon drops an index)."""
    settings = engine.settings
    check_state(engine.state, now, settings.cooldown_s, settings.intent_ttl_s)
    disk = store.load()
    owners = Counter(a for alloc in disk.allocations for a in alloc.addresses)
    twice = [a for a, n in owners.items() if n > 1]
    if twice:
        raise InvariantBroken(f"addresses with two owners on disk: {twice}")
    if store.missing_indexes:
        raise InvariantBroken(f"the state file lacks {sorted(store.missing_indexes)}")
    memory, on_disk = normalized(engine.state.to_image()), normalized(disk)
    differ = {k: (memory[k], on_disk[k]) for k in memory if memory[k] != on_disk[k]}
    if differ:
        raise InvariantBroken(f"memory differs from disk (memory, disk): {differ}")


def check_cluster(nodes: Iterable[SimNode], instances: Mapping[str, Any], now: float) -> list[str]:
    """Every violation of the address invariants, one line each (empty when they all hold). ENIs
    are checked apart (`leaked_enis`): an ENI may be between two steps for a moment."""
    live = [n for n in nodes if not n.gone]
    problems: list[str] = []
    owners: dict[str, str] = {}
    for node in live:
        try:
            node_invariants(node.engine, node.store, now)
        except AssertionError as err:
            problems.append(f"{node.name}: node invariant: {err}")
        problems += _owned_on_ec2(node, instances[node.instance_id])
        for address in node.engine.state.owned_addresses():
            if address in owners:
                problems.append(f"{address} owned on {owners[address]} and {node.name}")
            owners[address] = node.name
    return problems


def _ec2_units(instance: Any) -> set[tuple[str, str]]:
    """(ENI ID, unit CIDR) of every address and prefix on the instance's ENIs, per moto."""
    units: set[tuple[str, str]] = set()
    for nic in instance.nics.values():
        units.update((nic.id, f"{a}/32") for a in eni_rules.eni_secondaries(nic))
        units.update((nic.id, p) for p in eni_rules.eni_prefixes(nic))
    return units


def _owned_on_ec2(node: SimNode, instance: Any) -> list[str]:
    state = node.engine.state
    on_ec2 = _ec2_units(instance)
    problems: list[str] = []
    for alloc in state.allocations().values():
        for address, cidr in zip(alloc.addresses, alloc.unit_cidrs, strict=True):
            unit = state.unit(cidr)
            if unit is None or unit.state == "lost":
                problems.append(f"{node.name}: {address} is owned but its unit {cidr} is lost")
            elif (unit.eni_id, cidr) not in on_ec2:
                problems.append(f"{node.name}: {address} is owned but EC2 lacks {cidr}")
    return problems


def leaked_enis(nodes: Iterable[SimNode], backend: Any) -> list[str]:
    return [
        f"{eni_id}: {why}" for eni_id, why in _eni_findings(nodes, backend) if why != AWAITING_GC
    ]


def awaiting_eni_gc(nodes: Iterable[SimNode], backend: Any) -> int:
    return sum(1 for _, why in _eni_findings(nodes, backend) if why == AWAITING_GC)


AWAITING_GC = "detached, left to its node's ENI GC"


def _eni_findings(nodes: Iterable[SimNode], backend: Any) -> list[tuple[str, str]]:
    by_instance = {n.instance_id: n for n in nodes}
    swept = {n.eni_gc_cluster for n in by_instance.values()}
    in_flight: set[str] = set()
    for node in by_instance.values():
        in_flight |= node.pool.pending_enis | node.pool.releases_in_flight
    findings: list[tuple[str, str]] = []
    for eni in list(backend.enis.values()):
        if eni.id in in_flight:
            continue
        if eni.instance is None:
            tags: dict[str, str] = backend.tags.get(eni.id, {})
            ours = tags.get(TAG_MANAGED_BY) == MANAGED_BY
            collected = (
                by_instance.get(tags.get(TAG_INSTANCE_ID, "")) is not None
                or tags.get(TAG_CLUSTER_NAME) in swept
            )
            why = AWAITING_GC if ours and collected else "detached and no node collects it"
            findings.append((eni.id, why))
            continue
        owner = by_instance.get(eni.instance.id)
        if owner is not None and eni.device_index != 0 and eni.id not in owner.engine.state.enis():
            findings.append((eni.id, f"attached to {owner.name} but not in its inventory"))
    return findings
