"""S8 "Crash anywhere": `kill -9` at random instants during ADD/DEL churn. On restart every
acknowledged ADD and DEL is there, the one operation the kill cut short is all there or not at all,
and the invariants hold (docs/architecture.md §3.4, invariant 4).

A child process (`churn_worker`) churns against a real engine on a real state file and reports each
call before making it and after it returns. The parent kills it with SIGKILL at a random instant
(during start-up and restore, inside a call, between calls), reads the file through its own
read-only connection before anything else opens it, then reopens the engine in-process and checks
the invariants. A model of what was acknowledged is kept across rounds: the file accumulates.

Children come from a `forkserver` that preloaded the engine. A fresh interpreter importing it takes
about 180 ms on a 2-core machine; a fork from the server, a few. Plain `fork` from pytest is out (the
process has threads).

`IPAMD_CRASH_KILLS=<n>` raises the number of kills (default 200). `IPAMD_CRASH_SEED=<n>` replays the
choices of a failed run (the kill instants also depend on timing, so replay is approximate).

What each scenario replays, and which tests prove it: docs/failure-scenarios.md.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import random
import signal
import sqlite3
import time
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

import pytest

from datastore.store import STATE_FILE_NAME
from ipamd.clock import SystemClock
from ipamd.engine.engine import Engine
from ipamd.engine.invariants import check_invariants
from tests.crash import churn_worker
from tests.support.node import key

KILLS = int(os.environ.get("IPAMD_CRASH_KILLS", "200"))
FIRST_START_KILLS = 40
"""Kills while a child creates the state file for the first time (its own, smaller test)."""
CHILD_TIMEOUT_S = 10.0
"""A child that has not reached the awaited point by then is reported, not waited for."""
CTX = multiprocessing.get_context("forkserver")
PRELOAD = ["tests.crash.churn_worker", "pytest"]
"""pytest too: every child re-runs the main script before it starts (Python 3.11's forkserver drops a
`__main__` preload), and pytest's console script imports pytest, 160 ms that would go to each child."""
KEY = key("any")

SUMMARY: Counter[str] = Counter()
"""What the last run of the churn scenario did: kills, operations acknowledged, operations cut short
and found committed, ... (also printed)."""


# -- the child ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KillPlan:
    acks: int | None
    """Acknowledgements to wait for before the delay starts; None: the delay starts at the fork."""
    delay_s: float

    def __str__(self) -> str:
        after = "start" if self.acks is None else f"ack {self.acks}"
        return f"kill {1000 * self.delay_s:.1f} ms after {after}"


def plan_kill(rng: random.Random, round_no: int) -> KillPlan:
    # Round 0 creates the file: its kill comes after the engine opened it (see the first-start test).
    if round_no > 0 and rng.random() < 0.12:
        return KillPlan(None, rng.uniform(0.0, 0.04))  # fork, open, integrity check, restore, seed
    return KillPlan(rng.randint(1, 40), rng.uniform(0.0, 0.02))


@dataclass(slots=True)
class ChildRun:
    messages: list[str]
    exitcode: int | None


def churn_until_killed(path: Path, seed: int, tag: str, plan: KillPlan) -> ChildRun:
    """Start a churning child, SIGKILL it as planned, reap it; return every message it sent.

    Blocking: run it in a thread. Messages sent before the kill stay in the pipe after the child is
    gone, so reading on after the kill loses none of them.
    """
    reader, writer = CTX.Pipe(duplex=False)
    child = CTX.Process(
        target=churn_worker.run, args=(str(path), seed, tag, writer), name=f"churn-{tag}"
    )
    messages: list[str] = []
    try:
        child.start()
        writer.close()  # the child's copy is the only writer left: EOF means it is gone
        if plan.acks is not None:
            acks = 0
            deadline = time.monotonic() + CHILD_TIMEOUT_S
            while acks < plan.acks and (message := _receive(reader, deadline)) is not None:
                messages.append(message)
                acks += message.startswith("ack\t")
        time.sleep(plan.delay_s)
        child.kill()
        child.join(CHILD_TIMEOUT_S)
        deadline = time.monotonic() + CHILD_TIMEOUT_S
        while (message := _receive(reader, deadline)) is not None:
            messages.append(message)
        return ChildRun(messages, child.exitcode)
    finally:
        reader.close()
        writer.close()
        if child.is_alive():
            child.kill()
            child.join()
        child.close()


def _receive(reader: Connection, deadline: float) -> str | None:
    """The next message, or None at EOF or once `deadline` (monotonic) has passed."""
    if not reader.poll(max(0.0, deadline - time.monotonic())):
        return None
    try:
        return reader.recv_bytes().decode()
    except EOFError:
        return None


# -- what the child said -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Call:
    seq: int
    op: str
    target: str
    count: int

    def __str__(self) -> str:
        return f"#{self.seq} {self.op.upper()} {self.target}" + (
            f" x{self.count}" if self.count > 1 else ""
        )


@dataclass(frozen=True, slots=True)
class Ack:
    call: Call
    outcome: str
    addresses: tuple[str, ...]


@dataclass(slots=True)
class Transcript:
    opened: bool = False
    acks: list[Ack] = field(default_factory=list)
    cut_short: Call | None = None
    """The call made and never acknowledged: the kill landed inside it."""
    trouble: list[str] = field(default_factory=list)
    """`unavailable` or `error` messages."""


def parse(messages: list[str], where: str) -> Transcript:
    t = Transcript()
    for message in messages:
        kind, *fields = message.split("\t")
        if kind == "open":
            t.opened = True
        elif kind == "call":
            seq, op, target, count = fields
            assert t.cut_short is None, (
                f"{where}: call {message!r} while {t.cut_short} is unanswered"
            )
            t.cut_short = Call(int(seq), op, target, int(count))
        elif kind == "ack":
            call = t.cut_short
            assert call is not None and call.seq == int(fields[0]), f"{where}: stray {message!r}"
            t.acks.append(Ack(call, fields[3], tuple(a for a in fields[4].split(",") if a)))
            t.cut_short = None
        else:
            t.trouble.append(message)
    return t


# -- what the file holds -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Disk:
    """The state file's rows, read raw: nothing of the engine's restore logic in between."""

    allocations: dict[str, tuple[str, ...]]
    """Container ID to its addresses, in order, for allocations under the churn's network/ifname."""
    other_keys: list[tuple[str, str, str]]
    hollow: list[str]
    """Allocation rows without a single address row."""
    orphans: list[str]
    """Address rows whose allocation row is missing."""
    intents: dict[str, float]
    cooldowns: dict[str, float]
    enis: set[str]
    units: dict[str, tuple[str, str]]
    """Unit CIDR to (ENI ID, state)."""
    quarantined: int

    def describe(self, container_id: str) -> str:
        return (
            f"on disk: allocation {self.allocations.get(container_id)}, "
            f"intent {self.intents.get(container_id)}"
        )


def read_raw(path: Path) -> Disk:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT id, network, container_id, ifname FROM allocations").fetchall()
        addresses: dict[int, list[str]] = {}
        orphans = []
        ids = {row[0] for row in rows}
        for alloc_id, address in conn.execute(
            "SELECT allocation_id, address FROM allocation_addresses ORDER BY allocation_id, position"
        ):
            if alloc_id in ids:
                addresses.setdefault(alloc_id, []).append(address)
            else:
                orphans.append(address)
        ours = [(i, cid) for i, net, cid, ifn in rows if (net, ifn) == (KEY.network, KEY.ifname)]
        return Disk(
            allocations={cid: tuple(addresses.get(i, ())) for i, cid in ours},
            other_keys=[(n, c, f) for _, n, c, f in rows if (n, f) != (KEY.network, KEY.ifname)],
            hollow=[cid for i, cid in ours if i not in addresses],
            orphans=orphans,
            intents=dict(conn.execute("SELECT container_id, first_del_at FROM delete_intents")),
            cooldowns=dict(conn.execute("SELECT address, released_at FROM cooldowns")),
            enis={row[0] for row in conn.execute("SELECT eni_id FROM enis")},
            units={c: (e, s) for c, e, s in conn.execute("SELECT cidr, eni_id, state FROM units")},
            quarantined=conn.execute("SELECT count(*) FROM quarantine").fetchone()[0],
        )
    finally:
        conn.close()


# -- what was promised -------------------------------------------------------------------------


@dataclass(slots=True)
class Model:
    """Acknowledged state, carried from round to round."""

    alive: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Containers with an acknowledged ADD and no acknowledged DEL since: their addresses."""
    deleted: dict[str, float | None] = field(default_factory=dict)
    """Containers with an acknowledged DEL: the time of their delete intent, once read from disk."""
    enis: set[str] = field(default_factory=set)
    seeded: set[str] = field(default_factory=set)
    """ENIs whose units were acknowledged."""

    def apply(self, ack: Ack, where: str) -> None:
        """Take in one acknowledgement, checking the answer itself against what came before."""
        call, cid = ack.call, ack.call.target
        if call.op == "eni":
            self.enis.add(cid)
        elif call.op == "units":
            self.seeded.add(cid)
        elif call.op == "del":
            held = self.alive.pop(cid, ())
            assert sorted(ack.addresses) == sorted(held), (
                f"{where}: {call} released {ack.addresses}, but the container held {held}"
            )
            self.deleted.setdefault(cid, None)
        else:
            self._apply_add(ack, where)

    def _apply_add(self, ack: Ack, where: str) -> None:
        call, cid = ack.call, ack.call.target
        if ack.outcome == "refused":
            assert cid in self.deleted, f"{where}: {call} refused without an acknowledged DEL"
            return
        assert cid not in self.deleted, f"{where}: {call} after an acknowledged DEL: {ack.outcome}"
        held = self.alive.get(cid)
        if ack.outcome in ("no_address", "node_full"):
            assert held is None, f"{where}: repeated {call} failed instead of answering {held}"
        elif held is None:
            assert len(ack.addresses) == call.count, f"{where}: {call} got {ack.addresses}"
            self.alive[cid] = ack.addresses
        else:
            # A repeated ADD answers with the allocation it has, whatever count it asks for.
            assert held == ack.addresses, (
                f"{where}: repeated {call} got {ack.addresses}, not {held}"
            )

    def settle(self, call: Call, disk: Disk, where: str) -> bool:
        """The call the kill cut short: check it is on disk whole or not at all, and take it in if it
        committed. Returns whether it did."""
        cid, layout = call.target, churn_worker.layout()
        if call.op == "add" and cid not in self.alive and cid not in self.deleted:
            found = disk.allocations.get(cid)
            if found is None:
                return False
            assert len(found) == call.count, f"{where}: {call} cut short left half of it: {found}"
            self.alive[cid] = found
            return True
        if call.op == "del" and cid not in self.deleted:
            first_del = disk.intents.get(cid)
            if first_del is None:
                return False
            # One transaction: the allocation goes, its addresses cool from the intent's time.
            for address in self.alive.pop(cid, ()):
                cooling_since = disk.cooldowns.get(address)
                assert cooling_since == first_del, (
                    f"{where}: {call} cut short left half of it: intent at {first_del}, "
                    f"{address} cooling since {cooling_since}; {disk.describe(cid)}"
                )
            self.deleted[cid] = first_del
            return True
        if call.op == "eni" and cid not in self.enis and cid in disk.enis:
            self.enis.add(cid)
            return True
        if call.op == "units" and cid not in self.seeded:
            present = [c for c in layout[cid] if c in disk.units]
            assert present in ([], layout[cid]), f"{where}: {call} cut short left {present}"
            if present:
                self.seeded.add(cid)
            return bool(present)
        return False

    def check(self, disk: Disk, now: float, where: str) -> None:
        """(a) every acknowledged ADD is there, (b) every acknowledged DEL is, nothing else is, and the
        rows hang together."""
        assert not disk.hollow, f"{where}: allocations without addresses: {disk.hollow}"
        assert not disk.orphans, f"{where}: addresses without allocation: {disk.orphans}"
        assert not disk.other_keys, f"{where}: allocations nobody made: {disk.other_keys}"
        assert disk.quarantined == 0, f"{where}: {disk.quarantined} quarantined allocations"
        for cid, held in self.alive.items():
            assert disk.allocations.get(cid) == held, (
                f"{where}: acknowledged ADD {cid} -> {held} lost; {disk.describe(cid)}"
            )
        ttl = churn_worker.SETTINGS.intent_ttl_s
        for cid, first_del in self.deleted.items():
            on_disk = disk.intents.get(cid)
            assert cid not in disk.allocations and on_disk is not None and now < on_disk + ttl, (
                f"{where}: acknowledged DEL {cid} lost; {disk.describe(cid)}"
            )
            assert first_del in (None, on_disk), (
                f"{where}: the delete intent of {cid} moved from {first_del} to {on_disk}"
            )
            self.deleted[cid] = on_disk
        unexplained = sorted(set(disk.allocations) - set(self.alive))
        assert not unexplained, f"{where}: allocations no acknowledged ADD explains: {unexplained}"
        unexplained = sorted(set(disk.intents) - set(self.deleted))
        assert not unexplained, f"{where}: intents no acknowledged DEL explains: {unexplained}"
        assert disk.enis == self.enis, (
            f"{where}: ENIs on disk {disk.enis}, acknowledged {self.enis}"
        )
        layout = churn_worker.layout()
        units = {c: (eni, "active") for eni in self.seeded for c in layout[eni]}
        assert disk.units == units, f"{where}: units on disk differ from the acknowledged ones"
        owned_and_cooling = [
            a for held in disk.allocations.values() for a in held if a in disk.cooldowns
        ]
        assert not owned_and_cooling, f"{where}: owned addresses still cooling: {owned_and_cooling}"


# -- the scenario ------------------------------------------------------------------------------


async def check_round(path: Path, model: Model, transcript: Transcript, where: str) -> bool:
    """Check the file a killed child left; returns whether the call it cut short had committed."""
    disk = read_raw(path)  # before the engine, whose restore could change the file
    for ack in transcript.acks:
        model.apply(ack, where)
    call = transcript.cut_short
    where = f"{where}, cut short: {call or 'nothing'}"
    committed = call is not None and model.settle(call, disk, where)
    model.check(disk, SystemClock().now(), where)
    engine = await Engine.open(path, SystemClock(), churn_worker.SETTINGS)
    try:
        assert engine.unavailable is None, f"{where}: reopening failed: {engine.unavailable}"
        try:
            check_invariants(engine, path, SystemClock().now())
        except AssertionError as err:
            raise AssertionError(f"{where}: invariants after reopening: {err}") from err
        in_memory = {k.container_id: a.addresses for k, a in engine.state.allocations().items()}
        assert in_memory == model.alive, f"{where}: the reopened engine disagrees with disk"
    finally:
        await engine.close()
    return committed


def tally(counts: Counter[str], transcript: Transcript, committed: bool) -> None:
    counts["kills"] += 1
    counts["kills before open"] += not transcript.opened
    counts["kills inside a call"] += transcript.cut_short is not None
    counts["calls cut short but committed"] += committed
    for ack in transcript.acks:
        counts[f"acks {ack.call.op} {ack.outcome}"] += 1


@pytest.mark.slow
@pytest.mark.timeout(max(120, KILLS))
async def test_s08_kill_9_during_churn_keeps_every_acknowledged_operation(
    state_path: Path,
) -> None:
    seed = int(os.environ.get("IPAMD_CRASH_SEED") or random.SystemRandom().randrange(2**32))
    rng = random.Random(seed)
    CTX.set_forkserver_preload(PRELOAD)
    model, counts = Model(), Counter[str]()
    started = time.monotonic()
    for round_no in range(KILLS):
        child_seed, plan = rng.randrange(2**32), plan_kill(rng, round_no)
        where = f"round {round_no} (IPAMD_CRASH_SEED={seed}, child seed {child_seed}, {plan})"
        run = await asyncio.to_thread(
            churn_until_killed, state_path, child_seed, f"r{round_no:04d}", plan
        )
        assert run.exitcode == -signal.SIGKILL, (
            f"{where}: the child ended by itself (exit code {run.exitcode}): {run.messages[-3:]}"
        )
        transcript = parse(run.messages, where)
        assert not transcript.trouble, f"{where}: the child reported {transcript.trouble}"
        tally(counts, transcript, await check_round(state_path, model, transcript, where))
    SUMMARY.clear()
    SUMMARY.update(counts)
    print(
        f"S8 seed={seed} in {time.monotonic() - started:.1f} s: "
        + ", ".join(f"{name}={n}" for name, n in sorted(counts.items()))
    )
    assert counts["kills"] == KILLS
    assert counts["acks add ok"] and counts["acks del ok"], f"no churn happened: {counts}"


@pytest.mark.slow
async def test_s08_kill_9_during_first_start_leaves_a_usable_state_file(tmp_path: Path) -> None:
    """A kill while ipamd creates its state file for the first time interrupted nothing that was
    acknowledged: the next start must serve from that file, not refuse it as damaged."""
    seed = int(os.environ.get("IPAMD_CRASH_SEED") or random.SystemRandom().randrange(2**32))
    rng = random.Random(seed)
    CTX.set_forkserver_preload(PRELOAD)
    for attempt in range(FIRST_START_KILLS):
        path = tmp_path / f"node-{attempt}" / STATE_FILE_NAME
        plan = KillPlan(None, rng.uniform(0.0, 0.04))  # the engine opens a new file in ~30 ms
        where = f"first start {attempt} (IPAMD_CRASH_SEED={seed}, {plan})"
        run = await asyncio.to_thread(churn_until_killed, path, attempt, "first", plan)
        assert run.exitcode == -signal.SIGKILL, (
            f"{where}: the child ended by itself: {run.messages}"
        )
        left = (
            sorted((f.name, f.stat().st_size) for f in path.parent.glob("*"))
            if path.parent.exists()
            else []
        )
        engine = await Engine.open(path, SystemClock(), churn_worker.SETTINGS)
        await engine.close()
        assert engine.unavailable is None, (
            f"{where}: nothing was acknowledged, yet the next start refuses the file the kill "
            f"left (files and sizes: {left}): {engine.unavailable}"
        )
        await check_round(path, Model(), parse(run.messages, where), where)
