"""Repair: what `ipamctl repair` shows (dry run) and does (`--apply`), from evidence only — EC2's view of
the ENIs and the runtime's list of live sandboxes.

- A stale owner (an allocation whose sandbox the runtime does not list) is released, with a delete
  intent, as its missed DEL would have.
- A lost address (owned, but EC2 no longer lists it) whose owner is dead is released the same way;
  one whose owner still runs cannot be fixed here: the pod must be restarted, and repair says so.
- A quarantined record whose container is gone is dropped. One whose container still runs gets its
  address back if EC2 lists it on this node and nobody owns it; otherwise it stays, reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from datastore.records import (
    AllocationKey,
    AllocationRecord,
    CooldownRecord,
    Mutation,
    QuarantineRecord,
)
from ipamd.engine.engine import Engine
from ipamd.engine.state import NodeState


@dataclass(frozen=True, slots=True)
class RepairPlan:
    release: tuple[AllocationKey, ...] = ()
    drop_quarantine: tuple[AllocationKey, ...] = ()
    restore_quarantine: tuple[AllocationRecord, ...] = ()
    unfixable: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())

    def is_empty(self) -> bool:
        return not (self.release or self.drop_quarantine or self.restore_quarantine)

    def describe(self) -> list[str]:
        lines = [
            f"release {k.container_id} ({k.network}/{k.ifname}): no live sandbox"
            for k in self.release
        ]
        lines += [
            f"drop quarantined {k.container_id}: no live sandbox" for k in self.drop_quarantine
        ]
        lines += [
            f"restore quarantined {a.key.container_id}: {', '.join(a.addresses)}"
            for a in self.restore_quarantine
        ]
        lines += [f"cannot fix: {u}" for u in self.unfixable]
        return lines or ["nothing to repair"]


def plan_repair(state: NodeState, live_sandboxes: frozenset[str], now: float) -> RepairPlan:
    release: list[AllocationKey] = []
    unfixable: list[str] = []
    for key, alloc in state.allocations().items():
        if key.container_id not in live_sandboxes:
            release.append(key)
            continue
        for address, cidr in zip(alloc.addresses, alloc.unit_cidrs, strict=True):
            unit = state.unit(cidr)
            if unit is not None and unit.state == "lost":
                unfixable.append(
                    f"{address} of running {key.container_id} ({alloc.pod_namespace}/"
                    f"{alloc.pod_name}) is no longer on the ENI per EC2: restart the pod"
                )
    drop: list[AllocationKey] = []
    restore: list[AllocationRecord] = []
    for key, q in state.quarantine().items():
        if key.container_id not in live_sandboxes:
            drop.append(key)
        elif (record := _restorable(state, q, now)) is not None:
            restore.append(record)
        else:
            unfixable.append(
                f"quarantined {key.container_id} runs, but {', '.join(q.addresses)} is not free "
                "on this node's ENIs"
            )
    return RepairPlan(tuple(release), tuple(drop), tuple(restore), tuple(unfixable))


def _restorable(state: NodeState, q: QuarantineRecord, now: float) -> AllocationRecord | None:
    if q.key.container_id in state.intents():
        return None  # a DEL came for it: it must not own anything again
    cidrs: list[str] = []
    for address in q.addresses:
        cidr = state.active_unit_of(address)
        if cidr is None or state.owner_of(address) is not None or q.key in state.allocations():
            return None
        cidrs.append(cidr)
    if len({state.units()[c].eni_id for c in cidrs}) != 1:
        return None
    return AllocationRecord(q.key, q.addresses, tuple(cidrs), state.units()[cidrs[0]].eni_id, now)


async def apply_repair(engine: Engine, plan: RepairPlan) -> None:
    for key in plan.release:
        if key in engine.state.allocations():
            await engine.release(key)
    if plan.drop_quarantine or plan.restore_quarantine:
        cool = engine.settings.cooldown_s > 0
        await engine.commit_planned(
            lambda state, now: (
                Mutation(
                    delete_quarantine=(
                        *plan.drop_quarantine,
                        *(r.key for r in plan.restore_quarantine),
                    ),
                    put_allocations=plan.restore_quarantine,
                    # A dropped claim's held addresses cool, as a released pod's do.
                    put_cooldowns=_freed(state, plan.drop_quarantine, now) if cool else (),
                ),
                None,
            )
        )


def _freed(
    state: NodeState, keys: tuple[AllocationKey, ...], now: float
) -> tuple[CooldownRecord, ...]:
    return tuple(
        CooldownRecord(address, now)
        for key in keys
        if (q := state.quarantine().get(key)) is not None
        for address in q.addresses
        if state.owner_of(address) is None
    )
