"""Start-up: decide which loaded allocations can be trusted.

A file written by ipamd cannot hold two owners of one address (a UNIQUE index forbids it), but a file
that lost that index, was edited by hand, or was restored from elsewhere can. Failing forever on such a
file is what turns one bad record into a node that never serves again; instead, the claim that cannot
be trusted is set aside in quarantine, reported, and holds its addresses until its DEL, the runtime
leak GC (its sandbox seen gone) or `ipamctl repair`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from datastore.records import (
    AllocationKey,
    AllocationRecord,
    Mutation,
    QuarantineRecord,
    StateImage,
)
from datastore.store import Store
from ipamd.engine.state import NodeState
from ipamd.engine.units import unit_holds

logger = logging.getLogger("ipamd.engine.engine")


async def restore(
    store: Store,
    image: StateImage,
    now: float,
    live_containers: frozenset[str] | None,
    executor: ThreadPoolExecutor,
) -> tuple[NodeState, NodeState]:
    """The committed state, and a second copy of it for deciding changes: the loaded image with its
    untrusted claims set aside (and that written down), and any index the file lacked recreated."""
    loop = asyncio.get_running_loop()
    mutation, trusted = plan_quarantine(image, now, live_containers)
    if not mutation.is_empty():
        for q in mutation.put_quarantine:
            logger.warning(
                "restore.quarantine container_id=%s reason=%r", q.key.container_id, q.reason
            )
        await loop.run_in_executor(executor, store.commit, mutation)
    if store.missing_indexes:
        await loop.run_in_executor(executor, store.restore_indexes)
    state = NodeState.from_image(trusted)
    logger.info(
        "restore.done path=%s allocations=%d intents=%d units=%d quarantined=%d",
        store.path,
        len(state.allocations()),
        len(state.intents()),
        len(state.units()),
        len(mutation.put_quarantine),
    )
    return state, NodeState.from_image(trusted)


def plan_quarantine(
    image: StateImage, now: float, live_containers: frozenset[str] | None
) -> tuple[Mutation, StateImage]:
    """Return the mutation that sets untrusted allocations aside, and the image without them.

    Duplicate owners: the claim backed by a live sandbox is kept when the runtime's list is known;
    without that evidence the newest claim is kept (an address is only handed out when ipamd saw it
    free, so the older claim is the one whose DEL went missing). Unexplained owners: an address on no
    unit of the inventory.
    """
    set_aside = _duplicate_owners(image.allocations, live_containers)
    known = {u.cidr: u.kind for u in image.units}
    for alloc in image.allocations:
        for address, cidr in zip(alloc.addresses, alloc.unit_cidrs, strict=True):
            kind = known.get(cidr)
            if kind is None or not unit_holds(cidr, kind, address):
                set_aside.setdefault(
                    alloc.key, (alloc, f"unexplained owner: {address} is on no unit")
                )
    if not set_aside:
        return Mutation(), image
    records = tuple(
        QuarantineRecord(alloc.key, alloc.addresses, reason, now)
        for alloc, reason in set_aside.values()
    )
    trusted = tuple(a for a in image.allocations if a.key not in set_aside)
    mutation = Mutation(delete_allocations=tuple(set_aside), put_quarantine=records)
    return mutation, replace(image, allocations=trusted, quarantine=(*image.quarantine, *records))


def plan_claim_instance(state: NodeState, instance_id: str, now: float) -> Mutation:
    """Bind the state to `instance_id`. A state file written on another instance (a reused AMI, a
    restored volume) describes ENIs and addresses that are not this node's: its inventory is dropped,
    to be read afresh from EC2, and its allocations are quarantined for `ipamctl repair` rather than
    trusted or silently deleted."""
    if state.instance_id == instance_id:
        return Mutation()
    if state.instance_id is None and not state.allocations():
        return Mutation(instance_id=instance_id)
    reason = f"state file belongs to instance {state.instance_id}, not {instance_id}"
    return Mutation(
        instance_id=instance_id,
        delete_enis=tuple(state.enis()),
        delete_units=tuple(state.units()),
        delete_released=tuple(state.released()),
        delete_cooldowns=tuple(state.cooldowns()),
        delete_allocations=tuple(state.allocations()),
        put_quarantine=tuple(
            QuarantineRecord(a.key, a.addresses, reason, now) for a in state.allocations().values()
        ),
    )


def _duplicate_owners(
    allocations: tuple[AllocationRecord, ...], live_containers: frozenset[str] | None
) -> dict[AllocationKey, tuple[AllocationRecord, str]]:
    claims: dict[str, list[AllocationRecord]] = defaultdict(list)
    for alloc in allocations:
        for address in alloc.addresses:
            claims[address].append(alloc)
    set_aside: dict[AllocationKey, tuple[AllocationRecord, str]] = {}
    for address, allocs in claims.items():
        if len(allocs) < 2:
            continue
        keeper = _keeper(allocs, live_containers)
        kept = keeper.key.container_id if keeper else "none"
        for alloc in allocs:
            if alloc is not keeper:
                set_aside[alloc.key] = (alloc, f"duplicate owner of {address} (kept: {kept})")
    return set_aside


def _keeper(
    allocs: list[AllocationRecord], live_containers: frozenset[str] | None
) -> AllocationRecord | None:
    if live_containers is not None:
        live = [a for a in allocs if a.key.container_id in live_containers]
        return live[0] if len(live) == 1 else None
    return max(allocs, key=lambda a: a.created_at)
