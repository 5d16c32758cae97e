"""Series the report plots that `make bench` only summarizes: every ADD latency sample of one run,
and DEL p50 against the number of outstanding delete intents, measured on the engine as
`bench.engine_latency` and `bench.intents` measure it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bench.engine_latency import add_then_del
from bench.intents import Churn
from bench.node import backfill_intents, fill, open_node
from bench.timing import p50
from datastore.store import STATE_FILE_NAME
from ipamd.clock import FakeClock
from ipamd.engine.allocator import EngineParams

INTENT_COUNTS = (0, 1_000, 10_000, 86_400)
DELS_PER_POINT = 300
PODS = 250


@dataclass(frozen=True, slots=True)
class EngineSeries:
    add_ms: dict[str, list[float]]
    """ADD latency samples (ms) per mode."""
    del_p50_ms_by_intents: list[tuple[int, float]]
    """(outstanding intents, DEL p50 in ms)."""


async def measure(workdir: Path) -> EngineSeries:
    ip_add, _ = await add_then_del(workdir / "ip", enis=9, per_eni=30, kind="ip")
    prefix_add, _ = await add_then_del(workdir / "prefix", enis=3, per_eni=10, kind="prefix")
    points = [(n, await _del_p50(workdir / f"intents-{n}", n)) for n in INTENT_COUNTS]
    return EngineSeries({"ip": ip_add, "prefix": prefix_add}, points)


async def _del_p50(workdir: Path, intents: int) -> float:
    clock = FakeClock()
    # As in bench.intents: the clock stands still and cooldowns are off, so the intents stay
    # outstanding and every DEL does the same work.
    engine = await open_node(
        workdir / STATE_FILE_NAME,
        clock,
        EngineParams(cooldown_s=0.0),
        enis=9,
        per_eni=30,
        kind="ip",
    )
    try:
        churn = Churn(engine, await fill(engine, "series", PODS))
        if intents:
            await backfill_intents(engine, clock, intents, 300.0)
        return p50(await churn.measure_dels(DELS_PER_POINT))
    finally:
        await engine.close()
