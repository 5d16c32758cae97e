"""Start-up time: `Engine.open` on a state file holding 250 allocations and 86,400 delete intents.

Timed from the call until `open` returns: opening the file, the integrity check, loading every
record, the quarantine check and building the in-memory view, i.e. ready to serve.
"""

from __future__ import annotations

from pathlib import Path

from bench.node import backfill_intents, fill, open_node
from bench.timing import median, timed_ms
from datastore.store import STATE_FILE_NAME
from ipamd.clock import FakeClock
from ipamd.engine.allocator import EngineParams
from ipamd.engine.engine import Engine

PODS = 250
INTENTS = 86_400
RUNS = 5


async def run(workdir: Path) -> dict[str, float]:
    path = workdir / STATE_FILE_NAME
    clock = FakeClock()
    settings = EngineParams()
    await _build(path, clock, settings)
    samples = [await _timed_open(path, clock, settings) for _ in range(RUNS)]
    # Median of RUNS opens, each after the previous engine closed: the page cache is warm, as for a
    # daemon restarted in place; the median keeps one unlucky run on a shared machine out of it.
    return {"restore_ms_250_alloc_86400_intents": median(samples)}


async def _build(path: Path, clock: FakeClock, settings: EngineParams) -> None:
    engine = await open_node(path, clock, settings, enis=9, per_eni=30, kind="ip")
    try:
        await fill(engine, "restore", PODS)
        await backfill_intents(engine, clock, INTENTS, span_s=300.0)
    finally:
        await engine.close()


async def _timed_open(path: Path, clock: FakeClock, settings: EngineParams) -> float:
    elapsed, engine = await timed_ms(Engine.open(path, clock, settings))
    try:
        loaded = (len(engine.state.allocations()), len(engine.state.intents()))
        if engine.unavailable is not None or loaded != (PODS, INTENTS):
            raise RuntimeError(f"restore loaded {loaded}, unavailable={engine.unavailable}")
    finally:
        await engine.close()
    return elapsed
