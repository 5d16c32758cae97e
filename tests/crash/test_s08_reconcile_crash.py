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
import logging
import os
import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cloud.ec2 import Boto3Ec2, client_config
from cloud.embedded.world import EmbeddedEc2, World
from cloud.ports import MANAGED_BY, TAG_INSTANCE_ID, TAG_MANAGED_BY, Instance
from ipamd.engine.engine import Engine
from ipamd.engine.invariants import check_invariants
from ipamd.node.cloud_node import FAST, open_cloud_node
from ipamd.node.engine_parts import NodeFacts, Parts
from ipamd.pool.enis import BIND_SETTLE_S
from ipamd.reconcile.ec2_drift import DriftReport
from ipamd.sizing.inputs import NodeLimits
from tests.crash import reconcile_worker as worker
from tests.crash.reconcile_checks import (
    EC2View,
    check_disk,
    check_owned_on_ec2,
    check_s12,
    ipamd_view,
    promises_only,
    read_ec2,
)
from tests.crash.reconcile_kills import (
    PROMISES,
    landing,
    node_until_killed,
    plan_kill,
)
from tests.crash.reconcile_server import RequestGauge, use_forkserver_with
from tests.crash.test_s08_crash import (
    CHILD_TIMEOUT_S,
    Model,
    Transcript,
    parse,
    read_raw,
)
from tests.crash.test_s08_crash import PRELOAD as CHURN_PRELOAD
from tests.support.node import key

KILLS = int(os.environ.get("IPAMD_CRASH_KILLS_RECONCILE", "60"))
PRELOAD = ["tests.crash.reconcile_worker", *CHURN_PRELOAD]
QUIET_S = 0.04
"""How long the EC2 server must have had no request in its app, after the child is gone, before the
parent reads EC2: a request the child sent just before the kill is still served (EC2 acts on it)."""
SETTLE_ROUNDS = 12
INJECT_P = 0.3
"""Chance, per round, that the parent assigns an address to an ENI behind ipamd's back."""

SUMMARY: Counter[str] = Counter()
"""What the last run did: kills, where they landed, acknowledgements, what settling found."""


# -- the parent's checks -------------------------------------------------------------------------


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
        self.clock.advance(max(worker.JUMP_S, BIND_SETTLE_S))
        # Past the pool's settling time too: it sets the DeleteOnTermination of the ENIs it made.
        assert (await pool.run_once()).is_empty(), f"{where}: the pool planned after settling"
        assert not pool.unbound_enis, (
            f"{where}: DeleteOnTermination still waits: {pool.unbound_enis}"
        )
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
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Deterministic replay of what the scenario above found (it counts such rounds): the pool
    creates and attaches an ENI for new pods, and the process dies before the attachment gets
    DeleteOnTermination (the pool sets it a while after the ENI and its addresses are recorded, so
    that no pod waits on it). After the restart, EC2's view decides, as ever — but an ENI attached to the
    instance must be one that goes away with it, or it leaks (detached, tagged for an instance
    whose ENI GC never runs again) when the instance terminates. The restart drift gives it
    DeleteOnTermination."""
    with EmbeddedEc2() as host:
        async with open_cloud_node(
            host, tmp_path, worker.INSTANCE_TYPE, targets=worker.TARGETS
        ) as node:
            await node.settle()
            for pod in ("a", "b"):  # 2 of the primary ENI's 3 addresses: the pool needs an ENI
                await node.engine.assign(key(pod))
            await node.engine.close()  # and the node comes back on an adapter it dies on
            dying = Boto3Ec2(
                KilledBeforeDeleteOnTermination(node.world.client(client_config())), limits=FAST
            )
            await node.reopen(api=dying)
            await node.pool.run_once()  # the ENI, recorded with its addresses
            assert node.pool.unbound_enis, "its DeleteOnTermination waits for a quiet round"
            node.clock.advance(BIND_SETTLE_S)
            with pytest.raises(Killed):
                await node.pool.run_once()
            await node.engine.close()  # nothing was being committed: as good as a kill
            node.clock.advance(worker.JUMP_S)
            await node.reopen()
            drift = node.drift
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="ipamd.reconcile.ec2_drift"):
                report = await drift.run_once()
            assert len(report.enis_bound_to_instance) == 1, f"the ENI is bound: {report}"
            # Routine after such a restart: said at info, never as a drift warning.
            said = [(r.levelno, r.getMessage().split()[0]) for r in caplog.records]
            assert said == [(logging.INFO, "reconcile.bound")], said
            (bound,) = report.enis_bound_to_instance
            assert bound in node.engine.state.enis(), "recorded before the kill, with its units"
            assert node.engine.state.units_on(bound), "its addresses could be handed out at once"
            assert not report.enis_added, "nothing to adopt: it was in the inventory already"
            await node.settle()
            node.check()
            attached = await node.ec2.describe_enis(node.world.instance_id)
            assert bound in {e.eni_id for e in attached}, "and kept, in use"
            outliving = [e.eni_id for e in attached if not e.delete_on_termination]
            assert not outliving, f"attached without DeleteOnTermination: {outliving}"
            again = await drift.run_once()
            assert not again.enis_bound_to_instance, "set once, not on every round"
