"""The chaos run: faults on a schedule against a daemon under pod churn, each judged once it is over.

One fault's cycle: inject it; churn pods through the plugin until the fault took effect (and at least
`window_min_s`, at most `window_max_s`); clear it (a killed daemon is started again); then the daemon
must answer `/readyz` 200 within `ready_deadline_s`, every failed DEL must go through on retry, a new
ADD must be served, and `chaos.checks` must find nothing wrong. Only then was the fault survived. A
daemon that exited on its own during the cycle is restarted (as kubelet would) and the fault counts as
not survived.

After the last fault, every deferred DEL (one the plugin reported done while ipamd was unreachable)
must have been released by the daemon's runtime leak GC within `ready_deadline_s`, and the checks must
pass once more.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TextIO

from chaos.checks import Verdict, check_node, deferred_outstanding
from chaos.faults import KINDS, Fault, all_faults, schedule
from chaos.node import ChaosNode, open_node
from chaos.pods import Churn, Ledger


@dataclass(frozen=True, slots=True)
class Options:
    faults: int = 104
    seed: int = 1
    kinds: tuple[str, ...] = KINDS
    window_min_s: float = 1.0
    window_max_s: float = 10.0
    ready_deadline_s: float = 30.0
    start_deadline_s: float = 90.0
    churn_ops: int = 3
    inject_jitter_s: float = 0.3
    """The fault lands at a seeded instant this far into a round of ADDs and DELs."""
    disk_bytes: int = 8 << 20


class ChaosError(RuntimeError):
    """The run could not start (the daemon never became ready)."""


@dataclass
class FaultResult:
    index: int
    kind: str
    skipped: str | None = None
    took_effect: bool = False
    ready_s: float | None = None
    deletes_done: bool = False
    served: bool = False
    exits: list[int] = field(default_factory=list)
    exit_logs: list[str] = field(default_factory=list)
    during: Counter[str] = field(default_factory=Counter)
    """What the plugin got while the fault was on (`add:ok`, `add:11`, `del:deferred`, ...)."""
    verdict: Verdict = field(default_factory=Verdict)

    @property
    def injected(self) -> bool:
        return self.skipped is None

    @property
    def survived(self) -> bool:
        return (
            self.injected
            and self.took_effect
            and self.ready_s is not None
            and self.deletes_done
            and self.served
            and not self.exits
            and self.verdict.ok
        )

    def why_not(self) -> list[str]:
        reasons = [] if self.took_effect else ["the fault never took effect"]
        if self.ready_s is None:
            reasons.append("not ready again in time")
        if not self.deletes_done:
            reasons.append("failed DELs still failing")
        if not self.served:
            reasons.append("no ADD served after recovery")
        if self.exits:
            reasons.append(f"the daemon exited on its own: {self.exits}")
        return reasons + self.verdict.problems


@dataclass
class Outcome:
    results: list[FaultResult]
    ledger: Ledger
    wall_s: float
    starts: int
    kills: int
    exits: list[int]
    deferred_unreleased: list[str]
    final: Verdict
    log_tail: str = ""


async def run(options: Options, progress: TextIO) -> Outcome:
    started = time.monotonic()
    ledger = Ledger()
    async with open_node(seed=options.seed, disk_bytes=options.disk_bytes) as node:
        churn = Churn(node.cri, node.daemon.ends.socket_path, ledger, seed=options.seed)
        await _first_ready(node, churn, options)
        if not node.disk.mounted:
            print(f"chaos: disk_full skipped: {node.disk.why_not}", file=progress)
        results = await _faults(node, churn, options, progress)
        unreleased = await _deferred_released(node, ledger, options.ready_deadline_s)
        final = await check_node(node, ledger)
        failing = any(not r.survived for r in results if r.injected)
        tail = node.daemon.log_tail() if failing or not final.ok else ""
        return Outcome(
            results,
            ledger,
            time.monotonic() - started,
            node.daemon.starts,
            node.daemon.kills,
            list(node.daemon.exits),
            unreleased,
            final,
            tail,
        )


async def _first_ready(node: ChaosNode, churn: Churn, options: Options) -> None:
    if await node.daemon.wait_ready(options.start_deadline_s) is None:
        raise ChaosError(f"the daemon never became ready:\n{node.daemon.log_tail()}")
    if not await churn.add_until_served(options.start_deadline_s):
        raise ChaosError(f"the daemon served no ADD:\n{node.daemon.log_tail()}")


async def _faults(
    node: ChaosNode, churn: Churn, options: Options, progress: TextIO
) -> list[FaultResult]:
    faults = {fault.kind: fault for fault in all_faults()}
    occurrences: Counter[str] = Counter()
    results: list[FaultResult] = []
    order = schedule(options.faults, options.seed, options.kinds)
    rng = random.Random(options.seed)
    for index, kind in enumerate(order):
        fault = faults[kind]
        result = await _one_fault(node, churn, fault, occurrences[kind], index, options, rng)
        occurrences[kind] += 1
        results.append(result)
        _report_progress(result, len(order), progress)
    return results


async def _one_fault(
    node: ChaosNode,
    churn: Churn,
    fault: Fault,
    occurrence: int,
    index: int,
    options: Options,
    rng: random.Random,
) -> FaultResult:
    result = FaultResult(index, fault.kind, skipped=fault.unavailable(node))
    if not result.injected:
        return result
    exits_before = len(node.daemon.exits)
    before = Counter(churn.ledger.outcomes)
    try:
        # The fault lands while ADDs and DELs are in flight.
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(churn.step(options.churn_ops))
            await asyncio.sleep(rng.uniform(0.0, options.inject_jitter_s))
            await fault.inject(node, occurrence)
        result.took_effect = await _churn_during(node, churn, fault, options)
    finally:
        await fault.clear(node)
    result.during = churn.ledger.outcomes - before
    result.ready_s = await node.daemon.wait_ready(options.ready_deadline_s)
    result.deletes_done = await churn.retry_deletes(options.ready_deadline_s)
    result.served = await churn.add_until_served(options.ready_deadline_s)
    result.verdict = await check_node(node, churn.ledger)
    result.exits = node.daemon.exits[exits_before:]
    result.exit_logs = node.daemon.exit_logs[exits_before:]
    return result


async def _churn_during(node: ChaosNode, churn: Churn, fault: Fault, options: Options) -> bool:
    """Churn until the fault took effect and `window_min_s` passed, or `window_max_s` passed."""
    start = time.monotonic()
    while True:
        elapsed = time.monotonic() - start
        took_effect = fault.took_effect(node)
        if (took_effect and elapsed >= options.window_min_s) or elapsed >= options.window_max_s:
            return took_effect
        await churn.step(options.churn_ops)


async def _deferred_released(node: ChaosNode, ledger: Ledger, deadline_s: float) -> list[str]:
    """Pods whose deferred DEL the leak GC has not released within `deadline_s`."""
    end = time.monotonic() + deadline_s
    while True:
        await node.daemon.wait_ready(deadline_s)
        outstanding = await deferred_outstanding(node, ledger)
        if outstanding == [] or time.monotonic() >= end:
            return ["(allocations unreadable)"] if outstanding is None else outstanding
        await asyncio.sleep(0.25)


def _report_progress(result: FaultResult, total: int, progress: TextIO) -> None:
    if not result.injected:
        verdict = f"skipped ({result.skipped})"
    else:
        verdict = "survived" if result.survived else "NOT SURVIVED"
    ready = "-" if result.ready_s is None else f"{result.ready_s:.2f}s"
    print(
        f"chaos: [{result.index + 1:3d}/{total}] {result.kind:<13} {verdict} (ready in {ready})",
        file=progress,
        flush=True,
    )
    if result.injected and not result.survived:
        for reason in result.why_not():
            print(f"chaos:     {reason}", file=progress)
        for tail in result.exit_logs:
            print(f"chaos:     the daemon's log before it exited:\n{tail}", file=progress)
