"""A benchmark node: an engine on a real state file, its inventory seeded the way EC2's evidence would
add it, and container IDs shaped like the runtime's. Shared by the benchmark families; measures nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from datastore.records import AllocationKey, EniRecord, IntentRecord, Mutation, UnitKind
from ipamd.clock import FakeClock
from ipamd.engine.allocator import EngineParams
from ipamd.engine.engine import Engine
from ipamd.engine.state import NodeState

NETWORK = "k8s-pod-network"
INTENT_BATCH = 10_000
"""Intents per transaction when backfilling: large enough that 86,400 take a handful of commits."""


def container_id(family: str, n: int) -> str:
    """A 64-hex-digit ID like containerd's: random-looking, so index inserts land all over the tree."""
    return hashlib.sha256(f"{family}-{n}".encode()).hexdigest()


def pod_key(family: str, n: int) -> AllocationKey:
    return AllocationKey(NETWORK, container_id(family, n), "eth0")


def unit_cidrs(eni_index: int, count: int, kind: UnitKind) -> list[str]:
    if kind == "ip":
        return [f"10.0.{eni_index}.{10 + i}/32" for i in range(count)]
    return [f"10.1.{eni_index}.{16 * i}/28" for i in range(count)]


async def open_node(
    path: Path, clock: FakeClock, settings: EngineParams, enis: int, per_eni: int, kind: UnitKind
) -> Engine:
    """Open a fresh engine at `path` and attach `enis` ENIs with `per_eni` units each."""
    engine = await Engine.open(path, clock, settings)
    for index in range(enis):
        eni_id = f"eni-{index:04d}"
        await engine.add_eni(EniRecord(eni_id, index, "subnet-1", index == 0, clock.now()))
        await engine.add_units(eni_id, unit_cidrs(index, per_eni, kind), kind)
    return engine


async def fill(engine: Engine, family: str, count: int) -> list[AllocationKey]:
    """ADD `count` pods (untimed); returns their keys, oldest first."""
    keys = [pod_key(family, n) for n in range(count)]
    for key in keys:
        await engine.assign(key)
    return keys


def _as_planned(mutation: Mutation) -> Callable[[NodeState, float], tuple[Mutation, None]]:
    """`mutation` as a change planned outside the engine, whatever the state."""
    return lambda state, now: (mutation, None)


async def backfill_intents(engine: Engine, clock: FakeClock, count: int, span_s: float) -> None:
    """Put `count` delete intents for unknown containers in place, their first DELs spread evenly over
    the next `span_s` seconds, and leave the clock at the end of that span.

    The realistic way is `count` DELs of unknown container IDs, one durable commit each; that takes
    minutes, so the same records are committed in large batches through the engine's own commit path
    (`Engine.commit_planned`), which writes them to the state file and then to memory exactly as a
    DEL does. With `span_s` below the intent TTL every intent is still outstanding when the clock stops.
    """
    start = clock.now()
    for first in range(0, count, INTENT_BATCH):
        batch = tuple(
            IntentRecord(container_id("unknown", n), start + span_s * n / count)
            for n in range(first, min(first + INTENT_BATCH, count))
        )
        await engine.commit_planned(_as_planned(Mutation(put_intents=batch)))
    clock.advance(span_s)
