"""Rebuild: a new state file from evidence, when the old one cannot be trusted.

The unusable file is never edited or deleted: it is moved aside (`<name>.unusable-<unix time>`, with
its WAL) for inspection. The new file's inventory is read from EC2; its allocations are the addresses
the runtime recorded for each sandbox it still has (CRI PodSandboxStatus) that are on this node's
ENIs per EC2. An address EC2 does not list here is reported, never allocated. Rebuilt allocations are
keyed by sandbox ID with network `rebuilt`: a DEL names the container ID, and DEL releases every
allocation of a container whatever its network, so the runtime's DEL finds them.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from datastore.records import AllocationKey, AllocationRecord, Mutation
from ipamd.clock import Clock
from ipamd.engine.engine import Engine
from ipamd.engine.state import NodeState
from ipamd.runtime.ports import RuntimeApi, SandboxAddresses

REBUILT_NETWORK = "rebuilt"


@dataclass(frozen=True, slots=True)
class Rebuild:
    claims: dict[str, tuple[str, ...]]
    """Sandbox ID → the addresses the runtime recorded for it."""

    def describe(self, path: Path) -> list[str]:
        lines = [f"move the unusable {path} aside and build a new one from EC2 and the runtime"]
        lines += [f"allocate {', '.join(a)} to sandbox {sid}" for sid, a in self.claims.items()]
        return lines


async def gather_claims(runtime: RuntimeApi, addresses: SandboxAddresses) -> Rebuild:
    """What the runtime says each of its sandboxes holds (a stopped sandbox keeps its address until
    its DEL, so stopped ones count). Raises `RuntimeUnavailable`."""
    claims: dict[str, tuple[str, ...]] = {}
    for sandbox in await runtime.list_sandboxes():
        found = await addresses.sandbox_addresses(sandbox.sandbox_id)
        if found:
            claims[sandbox.sandbox_id] = found
    return Rebuild(claims)


def move_aside(path: Path, now: float) -> Path:
    aside = path.with_name(f"{path.name}.unusable-{int(now)}")
    for suffix in ("", "-wal", "-shm"):
        source = path.with_name(path.name + suffix)
        if source.exists():
            os.replace(source, aside.with_name(aside.name + suffix))
    return aside


def plan_allocations(
    state: NodeState, rebuild: Rebuild, now: float
) -> tuple[tuple[AllocationRecord, ...], list[str]]:
    """Allocations for the claimed addresses that are free units of the fresh inventory."""
    records: list[AllocationRecord] = []
    unfixable: list[str] = []
    taken: set[str] = set()
    for sandbox_id, addresses in sorted(rebuild.claims.items()):
        for index, address in enumerate(addresses):
            cidr = state.active_unit_of(address)
            if cidr is None or address in taken:
                unfixable.append(f"{address} of sandbox {sandbox_id} is not on this node per EC2")
                continue
            taken.add(address)
            records.append(
                AllocationRecord(
                    AllocationKey(REBUILT_NETWORK, sandbox_id, f"eth{index}"),
                    (address,),
                    (cidr,),
                    state.units()[cidr].eni_id,
                    now,
                )
            )
    return tuple(records), unfixable


async def rebuild_state(
    path: Path,
    rebuild: Rebuild,
    open_engine: Callable[[Path], Awaitable[Engine]],
    read_ec2: Callable[[Engine], Awaitable[object]],
    clock: Clock,
) -> tuple[Path, list[str]]:
    """Move the unusable file aside, build the new one; returns where the old one went and what
    could not be restored."""
    aside = move_aside(path, clock.now())
    engine = await open_engine(path)
    try:
        await read_ec2(engine)
        records, unfixable = plan_allocations(engine.state, rebuild, clock.now())
        if records:
            await engine.commit_planned(lambda s, n: (Mutation(put_allocations=records), None))
    finally:
        await engine.close()
    return aside, unfixable
