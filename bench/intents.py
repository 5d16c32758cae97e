"""What outstanding delete intents cost a DEL: DEL p50 with none, then with 86,400, in one run.

A node in secondary-IP mode (9 ENIs x 30 addresses) keeps 250 pods. Each measured DEL releases the
oldest live pod and records its intent; an untimed ADD of a new container then takes its place, so
there is always something to delete and the node stays at 250 pods.
"""

from __future__ import annotations

from collections import deque
from itertools import count
from pathlib import Path

from bench.node import backfill_intents, fill, open_node, pod_key
from bench.timing import p50, timed_ms
from datastore.records import AllocationKey
from datastore.store import STATE_FILE_NAME
from ipamd.clock import FakeClock
from ipamd.engine.allocator import EngineParams
from ipamd.engine.engine import Engine

PODS = 250
DELS_PER_PHASE = 1000
BLOCK = 50
BACKFILL_INTENTS = 86_400
BACKFILL_SPAN_S = 300.0
"""The backfilled DELs arrive over five minutes, well inside the 600 s intent TTL."""


class Churn:
    """Keeps `PODS` pods on the node while timing the DEL of one after another."""

    def __init__(self, engine: Engine, live: list[AllocationKey]) -> None:
        self._engine = engine
        self._live = deque(live)
        self._next = count(len(live))

    async def measure_dels(self, n: int) -> list[float]:
        samples: list[float] = []
        for _ in range(n):
            key = self._live.popleft()
            elapsed, released = await timed_ms(self._engine.release(key))
            if len(released) != 1:
                raise RuntimeError(f"DEL of {key.container_id} released {len(released)}")
            samples.append(elapsed)
            replacement = pod_key("intents", next(self._next))
            await self._engine.assign(replacement)
            self._live.append(replacement)
        return samples


async def run(workdir: Path) -> dict[str, float]:
    clock = FakeClock()
    # The clock stands still while DELs are measured, so intents stay outstanding; with the default
    # cooldown every released address would then cool for the whole run and the 20 spare addresses
    # would be gone after 20 DELs. Cooldowns are off here: this measures intents, not cooldowns.
    settings = EngineParams(cooldown_s=0.0)
    bare = await open_node(workdir / "bare.db", clock, settings, enis=9, per_eni=30, kind="ip")
    loaded = await open_node(
        workdir / STATE_FILE_NAME, clock, settings, enis=9, per_eni=30, kind="ip"
    )
    try:
        without = Churn(bare, await fill(bare, "intents", PODS))
        with_intents = Churn(loaded, await fill(loaded, "intents", PODS))
        await backfill_intents(loaded, clock, BACKFILL_INTENTS, BACKFILL_SPAN_S)
        _check_outstanding(loaded, clock.now(), BACKFILL_INTENTS)
        # Two nodes measured in alternating blocks, so whatever else the machine does at a moment
        # weighs on both alike. The bare node's own DELs leave intents too (DELS_PER_PHASE of them by
        # the end, about 1% of the backfill): that only makes the baseline, and the ratio, conservative.
        base_samples: list[float] = []
        loaded_samples: list[float] = []
        for _ in range(DELS_PER_PHASE // BLOCK):
            base_samples += await without.measure_dels(BLOCK)
            loaded_samples += await with_intents.measure_dels(BLOCK)
    finally:
        await bare.close()
        await loaded.close()
    base, with_86400 = p50(base_samples), p50(loaded_samples)
    return {
        "del_p50_ms_0_intents": base,
        "del_p50_ms_86400_intents": with_86400,
        "del_intent_cost_ratio": with_86400 / base,
    }


def _check_outstanding(engine: Engine, now: float, expected: int) -> None:
    intents = engine.state.intents()
    ttl = engine.settings.intent_ttl_s
    outstanding = sum(1 for first_del in intents.values() if now < first_del + ttl)
    if outstanding != expected:
        raise RuntimeError(f"{outstanding} outstanding intents, expected {expected}")
