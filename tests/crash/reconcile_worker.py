"""The child of the reconcile crash scenario (S8 with S12): a whole node — engine on the real state
file, the boto3 EC2 adapter on the parent's embedded EC2 server, a pool manager and the EC2 drift
reconcile, wired by `ipamd.node.engine_parts` as the daemon wires them — doing ADD/DEL churn, pool rounds and
drift rounds in a seeded random order until it is killed.

It speaks the churn worker's protocol (`tests.crash.churn_worker`: `open`, `call`, `ack`, `error`,
`unavailable`), with two more step ops, `pool` and `drift` (target `node`; the outcome says what the
round did), and start-up steps `claim` and `adopt`. Only `add` and `del` acknowledgements are
promises to pods. On top of that it reports where it is inside a step, so the parent can say where
each kill landed:

    trace ec2 <operation>                        a boto3 call is about to go out (worker thread)
    trace ec2done <operation> <ok|ErrorName>      it returned
    trace commit <what>                          a state change is being committed
    trace committed <what>                       it is on disk (and in memory)

Time: one node clock for every process, `ShiftedClock` — wall-clock seconds plus a shift the parent
chooses. The engine persists `changed_at`, `added_at`, `released_at`, cooldowns and intents in these
seconds, so every process that opens the file must read time on the same scale, and it must never run
backwards. The parent adds `JUMP_S` (more than the drift grace window) to the shift after each kill:
for the parent, and for every later child, the dead child's last changes are outside the grace
window, as they would be for a daemon restarting some time after a crash.

Like `churn_worker`, this module is preloaded into a forkserver. Importing it loads moto's server-side
modules (through `cloud.embedded.world`) and EC2's service model into the shared botocore session
(`warm_boto`), about 2 s, so that a child starts with a fork and not with those.

What each scenario replays, and which tests prove it: docs/failure-scenarios.md.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from cloud.ec2 import Boto3Ec2, client_config
from cloud.embedded.world import ec2_client
from cloud.ports import Ec2Api, Instance
from datastore.records import Mutation
from datastore.store import STATE_FILE_NAME
from ipamd.clock import Clock
from ipamd.config import groups
from ipamd.config.groups import PoolSettings, ReconcileSettings
from ipamd.config.settings import Config
from ipamd.engine.allocator import EngineParams
from ipamd.engine.engine import Engine
from ipamd.node import cloud_node
from ipamd.node.cloud_node import FAST, NoImds
from ipamd.node.engine_parts import EngineOpener, NodeFacts, Parts, open_parts, pool_params
from ipamd.pool.rounds import Pool
from ipamd.reconcile.ec2_drift import DriftReport, Ec2Drift
from ipamd.runtime.fake import FakeRuntime
from ipamd.sizing.inputs import NodeLimits, PoolTargets
from ipamd.sizing.plan import PoolPlan
from tests.crash.churn_worker import Churn

INSTANCE_TYPE = "t3.small"
"""3 ENIs of 4 IPv4 addresses: 3 secondary IPs per ENI, so a few pods make ENIs come and go."""
TARGETS = PoolTargets(warm_ip_target=2, minimum_ip_target=2, min_eni_lifetime_s=0.0)
"""Two free addresses kept, no more: the pool grows on ADDs and gives back on DELs, ENIs included."""
MAX_LIVE = 8
"""Allocations the child keeps at most: one under the 9 secondary IPs the instance can hold."""
GRACE_S = 2.0
"""The drift grace window (node-clock seconds)."""
JUMP_S = GRACE_S + 1.0
"""What the parent adds to the node clock after each kill (see the module docstring)."""
COOLDOWN_S = 0.05
"""A real but short IP cooldown: DELs write cooldown rows, and released addresses stay out of both
ADDs and pool shrinks for a few steps."""
INTENT_TTL_S = 1e9
"""Delete intents never expire in this scenario: the node clock gains `JUMP_S` per kill, and every
acknowledged DEL's intent is checked in every round."""
STEP_WEIGHTS = (("churn", 0.55), ("pool", 0.3), ("drift", 0.15))


class ShiftedClock:
    """Wall-clock seconds plus `shift`: the node clock shared by the children and the parent."""

    def __init__(self, shift: float) -> None:
        self.shift = shift

    def now(self) -> float:
        return time.time() + self.shift

    def advance(self, seconds: float) -> None:
        self.shift += seconds


POOL_BACKOFF_S = (0.05, 0.2)
"""A child lives well under a second: a cooldown finer than IP_COOLDOWN_PERIOD's whole seconds
(`COOLDOWN_S`, through the engine opener), and a short pool backoff (first wait, cap), so that it
does not spend its life backing off."""


def node_config(path: Path) -> Config:
    """The node's configuration, its state file at `path`."""
    assert path.name == STATE_FILE_NAME, f"the state file is {STATE_FILE_NAME} in IPAMD_STATE_DIR"
    return cloud_node.node_config(
        path.parent,
        TARGETS,
        cluster_name="crash-cluster",
        engine=groups.EngineSettings(delete_intent_ttl_s=INTENT_TTL_S),
        reconcile=ReconcileSettings(grace_s=GRACE_S),
        # the pool shrinks as soon as it may: kills land inside releases
        pool=PoolSettings(release_delay_s=0.0),
    )


async def open_node(
    path: Path,
    facts: NodeFacts,
    ec2: Ec2Api,
    clock: Clock,
    rng: random.Random,
    open_engine: EngineOpener = Engine.open,
) -> Parts:
    """The node's parts, wired as the daemon wires them (`ipamd.node.engine_parts`); no IMDS or
    runtime here."""

    async def finer(path: Path, clock: Clock, settings: EngineParams) -> Engine:
        return await open_engine(path, clock, replace(settings, cooldown_s=COOLDOWN_S))

    config = node_config(path)
    base_s, cap_s = POOL_BACKOFF_S
    return await open_parts(
        config,
        facts,
        ec2=ec2,
        imds=NoImds(),
        runtime=FakeRuntime(clock),
        clock=clock,
        open_engine=finer,
        rng=rng,
        pool_config=replace(pool_params(config), backoff_base_s=base_s, backoff_cap_s=cap_s),
    )


def warm_boto() -> None:
    """Load EC2's service model into the shared botocore session (~0.3 s): clients made later in
    this process, or in a process forked from it, take ~10 ms. Makes no request."""
    ec2_client("us-west-2", "http://127.0.0.1:9")


warm_boto()


@dataclass(frozen=True, slots=True)
class ChildArgs:
    path: str
    shift: float
    """The node clock's shift for this child (`ShiftedClock`)."""
    region: str
    endpoint_url: str
    instance: Instance
    limits: NodeLimits
    seed: int
    tag: str


def run(args: ChildArgs, out: Connection) -> None:
    """Process entry point: run the node until killed, reporting on `out`."""
    try:
        asyncio.run(NodeChurn(args, out).run())
    except BaseException as err:
        out.send_bytes(f"error\t{err!r}".encode())
        raise


# -- tracing ------------------------------------------------------------------------------------


def describe_mutation(m: Mutation) -> str:
    """A few words for what a commit writes, e.g. `units:releasing` or `units-,released`."""
    parts: list[str] = []
    if m.instance_id is not None:
        parts.append("claim")
    if m.put_allocations:
        parts.append("allocation")
    if m.delete_allocations or m.put_intents:
        parts.append("release")
    if m.put_enis:
        parts.append("eni+")
    if m.delete_enis:
        parts.append("eni-")
    parts.extend(sorted({f"units:{u.state}" for u in m.put_units}))
    if m.delete_units:
        parts.append("units-")
    if m.put_released:
        parts.append("released")
    return ",".join(parts) or "other"


class TracedEngine(Engine):
    """The engine, reporting each commit before it starts and after it is on disk."""

    trace: Callable[..., None] | None = None

    def trace_to(self, trace: Callable[..., None]) -> None:
        """From now on report each commit to `trace` (set once the worker is ready to report)."""
        self.trace = trace

    async def _write(self, mutations: Sequence[Mutation]) -> tuple[BaseException | None, bool]:
        whats = [describe_mutation(m) for m in mutations]
        if self.trace is not None:
            for what in whats:
                self.trace("commit", what)
        outcome = await super()._write(mutations)
        if self.trace is not None and outcome[0] is None:
            for what in whats:
                self.trace("committed", what)
        return outcome


class TracedClient:
    """A boto3 EC2 client that reports each call before it goes out and when it returns. The calls
    run in the adapter's worker threads; `trace` must be thread-safe."""

    def __init__(self, client: Any, trace: Callable[..., None]) -> None:
        self._client = client
        self._trace = trace

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)
        if not callable(method):
            return method
        trace = self._trace

        def traced(*args: Any, **kwargs: Any) -> Any:
            trace("ec2", name)
            try:
                answer = method(*args, **kwargs)
            except Exception as err:
                trace("ec2done", name, type(err).__name__)
                raise
            trace("ec2done", name, "ok")
            return answer

        return traced


# -- the node -----------------------------------------------------------------------------------


class NodeChurn(Churn):
    """`Churn`'s ADD/DEL steps, interleaved with pool and drift rounds. The pods' number walks up to
    `MAX_LIVE` and back down to none, so the pool both grows (new ENIs included) and shrinks (whole
    ENIs included)."""

    def __init__(self, args: ChildArgs, out: Connection) -> None:
        super().__init__(Path(args.path), random.Random(args.seed), args.tag, out)
        self.args = args
        self._send_lock = threading.Lock()
        self.growing = self.rng.random() < 0.5

    def emit(self, *fields: str) -> None:
        with self._send_lock:  # EC2 calls report from worker threads
            super().emit(*fields)

    def trace(self, *fields: str) -> None:
        self.emit("trace", *fields)

    async def run(self) -> None:
        args = self.args
        clock = ShiftedClock(args.shift)
        client = ec2_client(args.region, args.endpoint_url, client_config())
        ec2 = Boto3Ec2(TracedClient(client, self.trace), limits=FAST, rng=random.Random(args.seed))
        facts = NodeFacts(args.instance, args.limits)
        parts = await open_node(
            self.path, facts, ec2, clock, random.Random(args.seed), TracedEngine.open
        )
        engine = parts.engine
        assert isinstance(engine, TracedEngine)
        try:
            if engine.unavailable is not None:
                self.emit("unavailable", str(engine.unavailable).replace("\t", " "))
                return
            engine.trace_to(self.trace)
            self.live = sorted({k.container_id for k in engine.state.allocations()})
            self.deleted = list(engine.state.intents())
            self.emit("open")
            pool, drift = parts.pool, parts.drift
            await self.start(engine, pool, drift)
            names = [name for name, _ in STEP_WEIGHTS]
            weights = [weight for _, weight in STEP_WEIGHTS]
            while True:
                match self.rng.choices(names, weights)[0]:
                    case "pool":
                        await self.pool_round(pool)
                    case "drift":
                        await self.drift_round(drift)
                    case _:
                        await self.step(engine)
        finally:
            await engine.close()

    async def start(self, engine: Engine, pool: Pool, drift: Ec2Drift) -> None:
        """What the daemon does before it serves: bind the file to the instance, read EC2."""
        seq = self.call("claim", "node")
        await engine.claim_instance(self.args.instance.instance_id)
        self.emit("ack", seq, "claim", "node", "ok", "")
        await self.drift_round(drift)
        seq = self.call("adopt", "node")
        added = await pool.adopt()
        self.emit("ack", seq, "adopt", "node", f"added={added}", "")

    async def pool_round(self, pool: Pool) -> None:
        seq = self.call("pool", "node")
        failures = pool.health.failures
        plan = await pool.run_once()
        outcome = plan_outcome(plan)
        if pool.health.failures > failures:
            outcome += f"/failed:{pool.health.last_error.split(':')[0]}"
        self.emit("ack", seq, "pool", "node", outcome, "")

    async def drift_round(self, drift: Ec2Drift) -> None:
        seq = self.call("drift", "node")
        report = await drift.run_once()
        self.emit("ack", seq, "drift", "node", report_outcome(report), "")

    def choose(self) -> tuple[str, str, int]:
        if self.rng.random() < 0.12:
            self.growing = not self.growing
        r = self.rng.random()
        if r < 0.03 and self.deleted:
            return "add", self.rng.choice(self.deleted), 1  # refused: the DEL already came
        if r < 0.06 and self.deleted:
            return "del", self.rng.choice(self.deleted), 1  # a repeated DEL
        if r < 0.08:
            return "del", self.new_container(), 1  # a DEL for a container never added
        if r < 0.12 and self.live:
            return "add", self.rng.choice(self.live), 1  # a repeated ADD
        if self.live and (not self.growing or len(self.live) >= MAX_LIVE):
            return "del", self.rng.choice(self.live), 1
        return "add", self.new_container(), 2 if r < 0.2 else 1


def plan_outcome(plan: PoolPlan) -> str:
    parts = [
        name
        for name, present in (
            ("grow", plan.assign),
            ("new_eni", plan.new_enis),
            ("release", plan.release_units),
            ("release_eni", plan.release_enis),
        )
        if present
    ]
    return "+".join(parts) or "idle"


def report_outcome(report: DriftReport) -> str:
    parts = [f"{name}={len(getattr(report, name))}" for name in report.__slots__]
    changed = [p for p in parts if not p.endswith("=0")]
    return ",".join(changed) or "quiet"
