"""Runtime leak GC: allocations whose pod sandbox is gone, found against the runtime's own list.

A DEL can go missing (ipamd down, an error the runtime gave up on); seed 003 is a node that believed
64 addresses in use by pods long gone, and could start no more. Rules, so that no live pod is touched:

- allocations are read *before* the sandboxes, so an allocation made after the listing began is not
  judged by it (S13);
- an allocation is leaked only if its sandbox is absent from two consecutive listings (a sandbox the
  runtime does not list yet, S14) and it is older than the grace period;
- a runtime that cannot be reached proves nothing: that round releases nothing, and fails (it raises
  `RuntimeUnavailable`, so the schedule counts the round as failed and an alert can fire);
- release goes through the engine with a delete intent, exactly as a DEL would (a late ADD for that
  sandbox is then refused);
- a quarantined claim is judged the same way: its addresses stay held while its sandbox may run,
  and cool (the usual grace) once two listings past the grace period show it gone.

`release_invalid_attachments` serves the CNI GC verb (spec 1.1, `cni.dev/valid-attachments`) on the
same path: attachments of the network that the runtime did not list as valid are released, past grace.

The design: docs/architecture.md §6.5. The scenarios (S11, S13-S15, S29) and seed 003:
docs/failure-scenarios.md.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from datastore.records import AllocationKey
from ipamd.clock import Clock
from ipamd.engine.engine import Engine
from ipamd.runtime.ports import RuntimeApi, RuntimeUnavailable

logger = logging.getLogger(__name__)

MISSES_TO_LEAK = 2


class LeakGc:
    def __init__(self, engine: Engine, runtime: RuntimeApi, grace_s: float, clock: Clock) -> None:
        self._engine = engine
        self._runtime = runtime
        self._grace_s = grace_s
        self._clock = clock
        self._misses: dict[str, int] = {}
        self.released = 0
        self.unreachable = 0

    async def run_once(self) -> tuple[str, ...]:
        """One round; returns the container IDs released. Raises `RuntimeUnavailable`, having
        released nothing, when the runtime cannot be listed."""
        snapshot = _oldest_allocation_by_container(self._engine)
        try:
            sandboxes = await self._runtime.list_sandboxes()
        except RuntimeUnavailable:
            self.unreachable += 1
            raise
        live = {s.sandbox_id for s in sandboxes}
        self._misses = {cid: self._misses.get(cid, 0) + 1 for cid in snapshot if cid not in live}
        now = self._clock.now()
        leaked = tuple(
            cid
            for cid, misses in self._misses.items()
            if misses >= MISSES_TO_LEAK and now - snapshot[cid] >= self._grace_s
        )
        for cid in leaked:
            released = await self._release(cid)
            logger.warning(
                "reconcile.leak_released container_id=%s addresses=%s",
                cid,
                [a for r in released for a in r],
            )
            self._misses.pop(cid, None)
        self.released += len(leaked)
        return leaked

    async def _release(self, container_id: str) -> list[tuple[str, ...]]:
        state = self._engine.state
        held = state.allocations_of(container_id)
        claims = [q for q in state.quarantine().values() if q.key.container_id == container_id]
        if not held and not claims:
            return []  # released meanwhile by the runtime's own DEL
        key = held[0].key if held else claims[0].key
        released = await self._engine.release(key)
        return [r.addresses for r in released] + [q.addresses for q in claims]


def _oldest_allocation_by_container(engine: Engine) -> dict[str, float]:
    """Container ID → its oldest claim: allocations, and the quarantined claims whose addresses
    stay held until the runtime shows their sandbox is gone (aws-node entries a takeover did not
    adopt, claims set aside at restore)."""
    oldest: dict[str, float] = {}
    for alloc in engine.state.allocations().values():
        cid = alloc.key.container_id
        oldest[cid] = min(alloc.created_at, oldest.get(cid, alloc.created_at))
    for q in engine.state.quarantine().values():
        cid = q.key.container_id
        oldest[cid] = min(q.quarantined_at, oldest.get(cid, q.quarantined_at))
    return oldest


async def release_invalid_attachments(
    engine: Engine,
    network: str,
    valid: Iterable[tuple[str, str]],
    grace_s: float,
    clock: Clock,
) -> tuple[AllocationKey, ...]:
    """CNI GC: release this network's allocations not in `valid` (container ID, ifname) and older than
    `grace_s`. An ADD racing the GC call is younger than the grace period, so it is kept. Raises the
    engine's `StateUnavailable` when its state file is unusable: then nothing can be judged, and an
    empty answer would tell the runtime that nothing needed collecting."""
    if engine.unavailable is not None:
        raise engine.unavailable
    keep = set(valid)
    now = clock.now()
    doomed = [
        key
        for key, alloc in list(engine.state.allocations().items())
        if key.network == network
        and (key.container_id, key.ifname) not in keep
        and now - alloc.created_at >= grace_s
    ]
    released: list[AllocationKey] = []
    for key in doomed:
        if key in engine.state.allocations():
            released.extend(r.key for r in await engine.release(key))
    return tuple(released)
