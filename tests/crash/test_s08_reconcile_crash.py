"""S8 "Crash anywhere" with the cloud in the loop (and S12, "Restart during scale-down"): `kill -9` at
random instants while a node churns ADD/DEL, grows and shrinks its pool through EC2, and reconciles
with EC2. On restart every acknowledged ADD and DEL is there, and once drift and the pool have run,
EC2 and ipamd agree on every unit, with nothing left `releasing`.

The parent runs the embedded EC2 (moto with ipamd's extension) as a loopback HTTP server, so EC2's
state lives in the parent and outlives each child. Each round a child (`reconcile_worker`, from a
forkserver) opens the engine on the shared state file and runs a whole node against that server:
ADD/DEL churn, pool rounds and drift rounds in a seeded random order. The parent kills it with
SIGKILL at a random instant — inside a pool grow or release (after `releasing` committed and before
EC2 is asked, inside the EC2 call, between EC2's answer and the commit), inside a new ENI's
create/attach or an ENI's detach/delete, inside drift, inside any commit — waits until the server has
finished every request the child sent, and then, in-process:

1. reads the state file raw and checks it against the model of what was acknowledged (kept across
   rounds, as the file and EC2 accumulate): every acknowledged ADD owns its addresses, every
   acknowledged DEL left no allocation and its intent, the one call cut short is whole or absent;
2. reopens the engine and checks the invariants, and that every owned address is on its ENI per EC2;
3. runs drift once and checks S12: each unit the kill left `releasing` is free again if EC2 still lists
   it, released if its ENI no longer has it, gone with its ENI if EC2 no longer lists the ENI;
4. runs the pool until its plan is empty, then checks: what EC2 lists equals what ipamd holds (ENIs
   and units per ENI), nothing `releasing` or `lost`, no address on two ENIs or with two owners, the
   acknowledged ADDs still owned, the invariants; and a last drift, past the grace window, finds
   nothing to change.

Between rounds the parent sometimes assigns an address to an ENI behind ipamd's back, so the next
child's drift has something to adopt (and a kill can land in that commit). ENIs the kills leave
detached (created and never attached, detached and never deleted) must be findable by ENI GC's tag
query, and no attached ENI may be left without DeleteOnTermination (a kill between the attach and
setting it leaves one; the restart drift sets it: see the last test).

Most kills (60%) come at a random instant after a random number of steps, 10% during start-up; most
of a child's time goes to Describe calls, so the other 30% are aimed: the parent waits for a chosen
point (e.g. "units marked releasing", "assign answered") and kills a random 0-3 ms later.

Time: see `reconcile_worker` — one node clock, wall time plus a shift that the parent moves forward
by more than the grace window after each kill.

`IPAMD_CRASH_KILLS_RECONCILE=<n>` raises the number of kills (default 60); `IPAMD_CRASH_SEED=<n>`
replays a run's choices (the kill instants also depend on timing, so replay is approximate).

What each scenario replays, and which tests prove it: docs/failure-scenarios.md.
"""

from __future__ import annotations

import asyncio
import multiprocessing.forkserver
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cloud.ec2 import Boto3Ec2, client_config
from cloud.embedded.world import EmbeddedEc2, World
from cloud.ports import MANAGED_BY, TAG_INSTANCE_ID, TAG_MANAGED_BY, Instance
from ipamd.engine.engine import Engine
from ipamd.parts import NodeFacts, Parts
from ipamd.policy.model import NodeLimits
from ipamd.reconcile.ec2_drift import DriftReport
from tests.crash import reconcile_worker as worker
from tests.crash.test_s08_crash import (
    CHILD_TIMEOUT_S,
    CTX,
    Disk,
    Model,
    Transcript,
    _receive,
    parse,
    read_raw,
)
from tests.crash.test_s08_crash import PRELOAD as CHURN_PRELOAD
from tests.support.cloudnode import FAST, open_cloud_node
from tests.support.invariants import check_invariants
from tests.support.node import key

KILLS = int(os.environ.get("IPAMD_CRASH_KILLS_RECONCILE", "60"))
PRELOAD = ["tests.crash.reconcile_worker", *CHURN_PRELOAD]
QUIET_S = 0.04
"""How long the EC2 server must have had no request in its app, after the child is gone, before the
parent reads EC2: a request the child sent just before the kill is still served (EC2 acts on it)."""
SETTLE_ROUNDS = 12
INJECT_P = 0.3
"""Chance, per round, that the parent assigns an address to an ENI behind ipamd's back."""
AIM_BUDGET = 40
"""Acknowledgements an aimed kill waits for its point at most."""
PROMISES = ("add", "del")
"""The step ops whose acknowledgements are promises to a pod."""

SUMMARY: Counter[str] = Counter()
"""What the last run did: kills, where they landed, acknowledgements, what settling found."""


# -- the forkserver ------------------------------------------------------------------------------

_OUR_FORKSERVER: list[int] = []
"""The PID of the forkserver this module started, once it has."""


def use_forkserver_with(modules: list[str]) -> None:
    """Make sure the forkserver preloaded `modules`. A forkserver preloads only when it starts, and
    the churn test may have started one that lacks the worker here (moto and EC2's service model: 2 s
    per child otherwise). So one not started here is stopped (no child of it is alive between tests)
    and started again, with the churn test's modules too; `_stop` is private, the hook CPython's own
    tests use for this."""
    server: Any = multiprocessing.forkserver._forkserver
    if _OUR_FORKSERVER and server._forkserver_pid == _OUR_FORKSERVER[0]:
        return
    server._stop()
    CTX.set_forkserver_preload(modules)
    server.ensure_running()
    _OUR_FORKSERVER[:] = [server._forkserver_pid]


# -- the EC2 server ------------------------------------------------------------------------------


class RequestGauge:
    """Wraps the embedded EC2 server's WSGI app and counts the requests inside it."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self._app = app
        self._lock = threading.Lock()
        self.active = 0
        self.served = 0
        self.last_done = time.monotonic()

    @classmethod
    def install(cls, host: EmbeddedEc2) -> RequestGauge:
        # The werkzeug server behind `EmbeddedEc2("server")`; its handler reads `.app` per request.
        server = getattr(getattr(host, "_server", None), "_server", None)
        assert server is not None and callable(getattr(server, "app", None)), (
            "EmbeddedEc2's loopback server changed shape: update RequestGauge.install"
        )
        gauge = cls(server.app)
        server.app = gauge
        return gauge

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        with self._lock:
            self.active += 1
        try:
            return list(self._app(environ, start_response))
        finally:
            with self._lock:
                self.active -= 1
                self.served += 1
                self.last_done = time.monotonic()

    def wait_quiet(self, quiet_s: float, timeout_s: float) -> bool:
        """Block until no request has been inside the app for `quiet_s`, counted from now at the
        earliest; False after `timeout_s`."""
        start = time.monotonic()
        while (now := time.monotonic()) < start + timeout_s:
            with self._lock:
                since = None if self.active else max(self.last_done, start)
            if since is not None and now - since >= quiet_s:
                return True
            time.sleep(quiet_s / 4)
        return False


# -- the child -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Aim:
    """A point to kill near: the first trace message starting with `trace` inside a step `step`
    (any step if None)."""

    step: str | None
    trace: str
    label: str


AIMS = (
    Aim("pool", "committed\tunits:releasing", "units marked releasing, EC2 not yet asked"),
    Aim("pool", "ec2\tunassign_private_ip_addresses", "inside the unassign"),
    Aim("pool", "ec2done\tunassign_private_ip_addresses", "unassign answered, not committed"),
    Aim("pool", "ec2\tassign_private_ip_addresses", "inside the assign"),
    Aim("pool", "ec2done\tassign_private_ip_addresses", "assign answered, not committed"),
    Aim("pool", "ec2done\tcreate_network_interface", "ENI created, not attached"),
    Aim("pool", "ec2\tattach_network_interface", "inside the attach"),
    Aim("pool", "ec2done\tattach_network_interface", "ENI attached, not recorded"),
    Aim("pool", "ec2\tdetach_network_interface", "inside the detach"),
    Aim("pool", "ec2done\tdetach_network_interface", "ENI detached, not deleted"),
    Aim("pool", "ec2done\tdelete_network_interface", "ENI deleted, not removed"),
    Aim("drift", "ec2done\tdescribe_network_interfaces", "drift read EC2, not committed"),
    Aim("drift", "commit\t", "inside a drift commit"),
    Aim(None, "commit\t", "inside a commit"),
)
"""Where a random instant rarely falls (most of a child's time goes to Describe calls)."""


@dataclass(frozen=True, slots=True)
class NodeKillPlan:
    acks: int | None
    """Acknowledgements to wait for before the delay starts (when aiming: at most); None: the delay
    starts at the fork."""
    delay_s: float
    aim: Aim | None = None

    def __str__(self) -> str:
        after = "start" if self.acks is None else f"ack {self.acks}"
        if self.aim is not None:
            after = f"'{self.aim.label}' (or {after})"
        return f"kill {1000 * self.delay_s:.1f} ms after {after}"


def plan_kill(rng: random.Random, round_no: int) -> NodeKillPlan:
    r = rng.random()
    if round_no > 0 and r < 0.1:
        # Fork, open and restore, claim, the start-up drift and adopt take ~0.1-0.2 s.
        return NodeKillPlan(None, rng.uniform(0.0, 0.25))
    if r < 0.6:
        return NodeKillPlan(rng.randint(1, 30), rng.uniform(0.0, 0.03))
    return NodeKillPlan(AIM_BUDGET, rng.uniform(0.0, 0.003), rng.choice(AIMS))


def node_until_killed(args: worker.ChildArgs, plan: NodeKillPlan) -> tuple[list[str], bool]:
    """Start a node child, SIGKILL it as planned, reap it; return every message it sent and whether
    the aim (if any) was met (blocking).

    As in the churn test, the parent keeps reading after the kill: what was sent before is in the pipe.
    """
    reader, writer = CTX.Pipe(duplex=False)
    child = CTX.Process(target=worker.run, args=(args, writer), name=f"node-{args.tag}")
    messages: list[str] = []
    hit = False
    try:
        child.start()
        writer.close()
        if plan.acks is not None:
            acks, step = 0, None
            aim = plan.aim
            deadline = time.monotonic() + CHILD_TIMEOUT_S
            while acks < plan.acks and (message := _receive(reader, deadline)) is not None:
                messages.append(message)
                kind, _, rest = message.partition("\t")
                if kind == "call":
                    step = rest.split("\t")[1]
                elif kind == "ack":
                    acks, step = acks + 1, None
                elif (
                    aim is not None
                    and kind == "trace"
                    and rest.startswith(aim.trace)
                    and aim.step in (None, step)
                ):
                    hit = True
                    break
        time.sleep(plan.delay_s)
        child.kill()
        child.join(CHILD_TIMEOUT_S)
        deadline = time.monotonic() + CHILD_TIMEOUT_S
        while (message := _receive(reader, deadline)) is not None:
            messages.append(message)
        assert child.exitcode == -signal.SIGKILL, (
            f"the child ended by itself (exit code {child.exitcode}): {messages[-3:]}"
        )
        return messages, hit
    finally:
        reader.close()
        writer.close()
        if child.is_alive():
            child.kill()
            child.join()
        child.close()


def landing(messages: list[str]) -> str:
    """Where the kill landed, from the last step begun and the last trace inside it."""
    step: str | None = None
    trace: list[str] | None = None
    opened = False
    for message in messages:
        kind, *fields = message.split("\t")
        if kind == "open":
            opened = True
        elif kind == "call":
            step, trace = fields[1], None
        elif kind == "ack":
            step, trace = None, None
        elif kind == "trace":
            trace = fields
    if not opened:
        return "start: opening and restoring the state file"
    if step is None:
        return "between steps"
    step = f"churn {step.upper()}" if step in PROMISES else step
    if trace is None:
        return f"{step}: deciding, nothing sent or committed yet"
    return f"{step}: {inside_step(*trace)}"


def inside_step(what: str, name: str, *outcome: str) -> str:
    if what == "ec2":
        return f"inside EC2 {name}"
    if what == "ec2done":
        return f"EC2 {name} answered ({outcome[0]}), next call or commit not begun"
    if what == "commit":
        return f"inside commit [{name}]"
    return f"commit [{name}] done, next call or commit not begun"


# -- the parent's checks -------------------------------------------------------------------------


def promises_only(messages: list[str]) -> list[str]:
    return [m for m in messages if not m.startswith("trace\t")]


def check_disk(model: Model, disk: Disk, where: str) -> None:
    """The raw file against the acknowledged model: Model.check without its fixed inventory (here
    the inventory is EC2's, checked against EC2 after reopening)."""
    assert not disk.hollow, f"{where}: allocations without addresses: {disk.hollow}"
    assert not disk.orphans, f"{where}: addresses without allocation: {disk.orphans}"
    assert not disk.other_keys, f"{where}: allocations nobody made: {disk.other_keys}"
    assert disk.quarantined == 0, f"{where}: {disk.quarantined} quarantined allocations"
    for cid, held in model.alive.items():
        assert disk.allocations.get(cid) == held, (
            f"{where}: acknowledged ADD {cid} -> {held} lost; {disk.describe(cid)}"
        )
    for cid, first_del in model.deleted.items():
        on_disk = disk.intents.get(cid)
        assert cid not in disk.allocations and on_disk is not None, (
            f"{where}: acknowledged DEL {cid} lost; {disk.describe(cid)}"
        )
        assert first_del in (None, on_disk), (
            f"{where}: the delete intent of {cid} moved from {first_del} to {on_disk}"
        )
        model.deleted[cid] = on_disk
    unexplained = sorted(set(disk.allocations) - set(model.alive))
    assert not unexplained, f"{where}: allocations no acknowledged ADD explains: {unexplained}"
    unexplained = sorted(set(disk.intents) - set(model.deleted))
    assert not unexplained, f"{where}: intents no acknowledged DEL explains: {unexplained}"
    cooling = [a for held in disk.allocations.values() for a in held if a in disk.cooldowns]
    assert not cooling, f"{where}: owned addresses still cooling: {cooling}"


EC2View = dict[str, set[str]]
"""Attached ENI ID to its secondary IPs as /32 CIDRs, as DescribeNetworkInterfaces lists them."""


async def read_ec2(ec2: Boto3Ec2, instance_id: str, where: str) -> EC2View:
    enis = await ec2.describe_enis(instance_id)
    view = {e.eni_id: set(e.units("ip")) for e in enis if e.device_index is not None}
    twice = Counter(c for units in view.values() for c in units)
    assert [c for c, n in twice.items() if n > 1] == [], f"{where}: EC2 lists an address twice"
    return view


def check_owned_on_ec2(engine: Engine, model: Model, ec2: EC2View, where: str) -> None:
    """Every acknowledged ADD is owned with its addresses, each on the allocation's ENI per EC2."""
    state = engine.state
    in_memory = {k.container_id: a for k, a in state.allocations().items()}
    assert {c: a.addresses for c, a in in_memory.items()} == model.alive, (
        f"{where}: the engine's allocations differ from the acknowledged ADDs"
    )
    for cid, alloc in in_memory.items():
        for address, cidr in zip(alloc.addresses, alloc.unit_cidrs, strict=True):
            assert cidr in ec2.get(alloc.eni_id, set()), (
                f"{where}: {address} of acknowledged ADD {cid} is not on {alloc.eni_id} per EC2 "
                f"(EC2: {sorted(ec2.get(alloc.eni_id, set()))}; unit {state.unit(cidr)})"
            )


def check_s12(
    releasing: dict[str, str], ec2: EC2View, report: DriftReport, engine: Engine, where: str
) -> None:
    """Units the kill left `releasing`: EC2's listing settles each, nothing else does."""
    kept = {c for c, eni in releasing.items() if c in ec2.get(eni, set())}
    released = {c for c, eni in releasing.items() if eni in ec2 and c not in ec2[eni]}
    with_eni = set(releasing) - kept - released
    where = f"{where}: S12, units left releasing {sorted(releasing)}"
    assert set(report.settled_kept) == kept, f"{where}: EC2 still lists {kept}: {report}"
    assert set(report.settled_released) == released, f"{where}: EC2 dropped {released}: {report}"
    state = engine.state
    for cidr in kept:
        assert state.units()[cidr].state == "active", f"{where}: {cidr} not free again"
    for cidr in released | with_eni:
        assert cidr not in state.units(), f"{where}: {cidr} still in the inventory"


def ipamd_view(engine: Engine) -> EC2View:
    state = engine.state
    return {eni: set(state.units_on(eni)) for eni in state.enis()}


class Parent:
    """The parent's half: EC2 and the model across rounds, and one restart per kill."""

    def __init__(
        self, world: World, path: Path, instance: Instance, limits: NodeLimits, seed: int
    ) -> None:
        self.world = world
        self.path = path
        self.instance = instance
        self.limits = limits
        self.ec2 = Boto3Ec2(world.client(client_config()), limits=FAST, rng=random.Random(seed))
        self.clock = worker.ShiftedClock(0.0)
        self.model = Model()
        self.counts: Counter[str] = Counter()
        self.rng = random.Random(seed)

    def child_args(self, seed: int, tag: str) -> worker.ChildArgs:
        assert self.world.endpoint_url is not None
        return worker.ChildArgs(
            str(self.path),
            self.clock.shift,
            self.world.region,
            self.world.endpoint_url,
            self.instance,
            self.limits,
            seed,
            tag,
        )

    async def check_round(self, messages: list[str], where: str) -> None:
        self.clock.advance(worker.JUMP_S)  # the restart comes after the grace window
        transcript = parse(promises_only(messages), where)
        assert not transcript.trouble, f"{where}: the child reported {transcript.trouble}"
        self.tally(transcript, messages)
        disk = read_raw(self.path)  # before the engine, whose restore could change the file
        for ack in transcript.acks:
            if ack.call.op in PROMISES:
                self.model.apply(ack, where)
        call = transcript.cut_short
        if call is not None and call.op in PROMISES:
            where = f"{where}, cut short: {call}"
            self.counts["calls cut short but committed"] += self.model.settle(call, disk, where)
        check_disk(self.model, disk, where)
        ec2 = await read_ec2(self.ec2, self.instance.instance_id, where)
        facts = NodeFacts(self.instance, self.limits)
        rng = random.Random(self.rng.random())
        parts = await worker.open_node(self.path, facts, self.ec2, self.clock, rng)
        engine = parts.engine
        try:
            assert engine.unavailable is None, f"{where}: reopening failed: {engine.unavailable}"
            self.invariants(engine, f"{where}: after reopening")
            check_owned_on_ec2(engine, self.model, ec2, f"{where}: after reopening")
            ec2 = await self.settle(parts, ec2, where)
        finally:
            await engine.close()
        if self.rng.random() < INJECT_P:
            self.inject(ec2)

    async def settle(self, parts: Parts, ec2: EC2View, where: str) -> EC2View:
        """Drift, then the pool until its plan is empty; returns EC2's view once settled."""
        engine, pool, drift = parts.engine, parts.pool, parts.drift
        releasing = {c: u.eni_id for c, u in engine.state.units().items() if u.state == "releasing"}
        self.counts["restarts with units releasing"] += bool(releasing)
        report = await drift.run_once()
        self.tally_report("restart drift", report)
        check_s12(releasing, ec2, report, engine, where)
        self.invariants(engine, f"{where}: after the restart drift")
        for _ in range(SETTLE_ROUNDS):
            plan = await pool.run_once()
            assert pool.health.failures == 0, (
                f"{where}: the pool failed while settling: {pool.health.last_error}; plan {plan}"
            )
            if plan.is_empty():
                break
            self.counts[f"settle pool {worker.plan_outcome(plan)}"] += 1
        else:
            raise AssertionError(f"{where}: the pool did not settle: {pool.plan()}")
        where = f"{where}: after settling"
        self.invariants(engine, where)
        ec2 = await read_ec2(self.ec2, self.instance.instance_id, where)
        stuck = {c: u.state for c, u in engine.state.units().items() if u.state != "active"}
        assert not stuck, f"{where}: units not active: {stuck}"
        assert ipamd_view(engine) == ec2, (
            f"{where}: EC2 lists {ec2}, ipamd holds {ipamd_view(engine)}"
        )
        check_owned_on_ec2(engine, self.model, ec2, where)
        self.clock.advance(worker.JUMP_S)
        report = await drift.run_once()
        assert not report.changed(), f"{where}: a drift past the grace window changed {report}"
        await self.loose_ends(where)
        return ec2

    async def loose_ends(self, where: str) -> None:
        """ENIs the kills left where only EC2 sees them: detached ones (ENI GC must be able to find
        them by their tags) and attached ones that would outlive the instance."""
        tagged = await self.ec2.find_enis(
            {TAG_INSTANCE_ID: self.instance.instance_id, TAG_MANAGED_BY: MANAGED_BY}
        )
        answer = self.world.client().describe_network_interfaces(
            Filters=[
                {"Name": "subnet-id", "Values": [self.instance.subnet_id]},
                {"Name": "status", "Values": ["available"]},
            ]
        )
        detached = {e["NetworkInterfaceId"] for e in answer["NetworkInterfaces"]}
        untraceable = sorted(detached - {e.eni_id for e in tagged})
        assert not untraceable, f"{where}: detached ENIs ENI GC cannot find: {untraceable}"
        self.counts["detached ENIs left for ENI GC (max)"] = max(
            self.counts["detached ENIs left for ENI GC (max)"], len(detached)
        )
        # A kill between AttachNetworkInterface and the call that sets DeleteOnTermination leaves
        # such an ENI; the restart drift must have set it.
        attached = await self.ec2.describe_enis(self.instance.instance_id)
        outliving = sorted(e.eni_id for e in attached if not e.delete_on_termination)
        assert not outliving, f"{where}: attached without DeleteOnTermination: {outliving}"

    def invariants(self, engine: Engine, where: str) -> None:
        try:
            check_invariants(engine, self.path, self.clock.now())
        except AssertionError as err:
            raise AssertionError(f"{where}: invariants: {err}") from err

    def inject(self, ec2: EC2View) -> None:
        """EC2 gains an address ipamd did not ask for (another tool, or a lost answer)."""
        room = [e for e, units in ec2.items() if len(units) < self.limits.units_per_eni]
        if room:
            self.world.client().assign_private_ip_addresses(
                NetworkInterfaceId=self.rng.choice(sorted(room)), SecondaryPrivateIpAddressCount=1
            )
            self.counts["addresses assigned behind ipamd's back"] += 1

    def tally(self, transcript: Transcript, messages: list[str]) -> None:
        self.counts["kills"] += 1
        self.counts[f"kill landed: {landing(messages)}"] += 1
        for ack in transcript.acks:
            outcome = ack.outcome if ack.call.op in (*PROMISES, "pool") else "done"
            self.counts[f"acks {ack.call.op} {outcome}"] += 1

    def tally_report(self, prefix: str, report: DriftReport) -> None:
        for name in report.__slots__:
            self.counts[f"{prefix} {name}"] += len(getattr(report, name))


def summary_lines(counts: Counter[str]) -> Iterator[str]:
    for name, n in sorted(counts.items()):
        yield f"  {name}: {n}"


# -- the scenario --------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(max(180, 3 * KILLS))
async def test_s08_kill_9_during_reconcile_and_pool_work_keeps_every_acknowledged_operation(
    state_path: Path,
) -> None:
    seed = int(os.environ.get("IPAMD_CRASH_SEED") or random.SystemRandom().randrange(2**32))
    rng = random.Random(seed)
    started = time.monotonic()
    await asyncio.to_thread(use_forkserver_with, PRELOAD)
    with EmbeddedEc2("server") as host:
        gauge = RequestGauge.install(host)
        world = host.world(worker.INSTANCE_TYPE, seed=seed % 2**31)
        boot = Boto3Ec2(world.client(client_config()), limits=FAST)
        raw_limits = await boot.instance_limits(world.instance_type)
        limits = NodeLimits(raw_limits.max_enis, raw_limits.units_per_eni)
        instance = await boot.describe_instance(world.instance_id)
        parent = Parent(world, state_path, instance, limits, seed)
        for round_no in range(KILLS):
            child_seed, plan = rng.randrange(2**32), plan_kill(rng, round_no)
            where = f"round {round_no} (IPAMD_CRASH_SEED={seed}, child seed {child_seed}, {plan})"
            args = parent.child_args(child_seed, f"r{round_no:04d}")
            t0 = time.monotonic()
            messages, hit = await asyncio.to_thread(node_until_killed, args, plan)
            t1 = time.monotonic()
            if plan.aim is not None:
                parent.counts[f"aimed at '{plan.aim.label}': {'met' if hit else 'missed'}"] += 1
            quiet = await asyncio.to_thread(gauge.wait_quiet, QUIET_S, CHILD_TIMEOUT_S)
            assert quiet, f"{where}: the EC2 server is still busy after the kill"
            t2 = time.monotonic()
            await parent.check_round(messages, where)
            parent.counts["time in children (ms)"] += int(1000 * (t1 - t0))
            parent.counts["time waiting for EC2 to go quiet (ms)"] += int(1000 * (t2 - t1))
            parent.counts["time checking and settling (ms)"] += int(1000 * (time.monotonic() - t2))
        parent.counts["EC2 requests served"] = gauge.served
    counts = parent.counts
    SUMMARY.clear()
    SUMMARY.update(counts)
    print(
        f"S8 reconcile seed={seed} in {time.monotonic() - started:.1f} s:\n"
        + "\n".join(summary_lines(counts))
    )
    assert counts["kills"] == KILLS
    assert counts["acks add ok"] and counts["acks del ok"], f"no churn happened: {counts}"
    assert any(name.startswith("acks pool ") and "release" in name for name in counts), (
        f"the pool never shrank: {counts}"
    )
    assert any(name.startswith("acks pool ") and "new_eni" in name for name in counts), (
        f"the pool never added an ENI: {counts}"
    )


# -- a bug the scenario finds --------------------------------------------------------------------


class Killed(BaseException):
    """The process dies here: nothing after this point runs (no `except CloudError` catches it)."""


class KilledBeforeDeleteOnTermination:
    """A boto3 EC2 client on which the process dies when it is about to set DeleteOnTermination,
    i.e. once AttachNetworkInterface has answered."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        if name == "modify_network_interface_attribute":
            raise Killed
        return getattr(self._client, name)


async def test_s08_kill_after_attach_leaves_no_eni_that_outlives_the_instance(
    tmp_path: Path,
) -> None:
    """Deterministic replay of what the scenario above found (it counts such rounds): the pool
    creates and attaches an ENI for new pods, and the process dies before the attachment gets
    DeleteOnTermination. After the restart, EC2's view decides, as ever — but an ENI attached to
    the instance must be one that goes away with it, or it leaks (detached, tagged for an instance
    whose ENI GC never runs again) when the instance terminates. The restart drift gives it
    DeleteOnTermination."""
    with EmbeddedEc2() as host:
        node = await open_cloud_node(host, tmp_path, worker.INSTANCE_TYPE, targets=worker.TARGETS)
        try:
            await node.settle()
            for pod in ("a", "b"):  # 2 of the primary ENI's 3 addresses: the pool needs an ENI
                await node.engine.assign(key(pod))
            await node.engine.close()  # and the node comes back on an adapter it dies on
            dying = Boto3Ec2(
                KilledBeforeDeleteOnTermination(node.world.client(client_config())), limits=FAST
            )
            await node.reopen(api=dying)
            with pytest.raises(Killed):
                await node.pool.run_once()
            await node.engine.close()  # nothing was being committed: as good as a kill
            node.clock.advance(worker.JUMP_S)
            await node.reopen()
            drift = node.drift
            report = await drift.run_once()
            assert len(report.enis_added) == 1, f"the attached ENI is adopted: {report}"
            assert report.enis_bound_to_instance == report.enis_added, "and bound to the instance"
            await node.settle()
            node.check()
            attached = await node.ec2.describe_enis(node.world.instance_id)
            assert report.enis_added[0] in {e.eni_id for e in attached}, "and kept, in use"
            outliving = [e.eni_id for e in attached if not e.delete_on_termination]
            assert not outliving, f"attached without DeleteOnTermination: {outliving}"
            again = await drift.run_once()
            assert not again.enis_bound_to_instance, "set once, not on every round"
        finally:
            await node.engine.close()
