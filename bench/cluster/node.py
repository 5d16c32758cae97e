"""One simulated node: ipamd's real parts (engine on a real state file, pool manager, EC2 drift, IMDS
hint, runtime leak GC, ENI GC), wired as `ipamd.daemon.build_daemon` wires them, on the node's own
`Boto3Ec2` adapter (its own client-side buckets and retries) talking to the shared account front.

Differences from the daemon, all forced by virtual time (`bench.cluster.vtime`): the engine is built
on an `InlineExecutor` (`Engine.open` would start a store thread the virtual clock cannot see), and the
reconcilers run in plain periodic loops, with the daemon's intervals and jitter, through
`ipamd.reconcile.jobs.Jobs.run_now` (same error handling: a cloud error is counted, anything else is
fatal) instead of APScheduler, which keeps wall-clock time. IMDS (`MotoImds`) reads the instance's
ENIs from moto as they are: it never lags EC2 here, so the hint triggers no drift checks of its own.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bench.cluster.vtime import InlineExecutor
from cloud.ec2 import Boto3Ec2
from cloud.ports import ImdsIdentity, ImdsInterface
from datastore.store import Store
from ipamd.clock import Clock
from ipamd.config import Config
from ipamd.daemon import engine_settings
from ipamd.engine.engine import Engine
from ipamd.engine.pool import PoolManager, PoolSettings
from ipamd.engine.state import NodeState
from ipamd.policy.model import NodeLimits, PoolTargets
from ipamd.policy.modes import strategy_for
from ipamd.policy.plan import compute_pod_limit
from ipamd.reconcile.ec2_drift import Ec2Drift
from ipamd.reconcile.eni_gc import EniGc
from ipamd.reconcile.imds_hint import ImdsHint
from ipamd.reconcile.jobs import Job, Jobs
from ipamd.reconcile.leaks import LeakGc
from tests.support.fake_cloud import FakeRuntime

STATE_FILE = "ipamd.db"


class MotoImds:
    """`cloud.ports.Imds` for one instance, read from moto's live state (no lag)."""

    def __init__(self, instance: Any, region: str) -> None:
        self._instance = instance
        self._region = region

    async def identity(self) -> ImdsIdentity:
        i = self._instance
        zone = str(i.placement.zone or "")
        macs = tuple(str(nic.mac_address) for _, nic in sorted(i.nics.items()))
        return ImdsIdentity(i.id, str(i.instance_type), self._region, zone, macs)

    async def interfaces(self) -> tuple[ImdsInterface, ...]:
        return tuple(_interface(index, nic) for index, nic in sorted(self._instance.nics.items()))


def _interface(index: int, nic: Any) -> ImdsInterface:
    entries: list[dict[str, Any]] = nic.private_ip_addresses
    primary = str(nic.private_ip_address)
    others = [str(e["PrivateIpAddress"]) for e in entries if not e.get("Primary")]
    return ImdsInterface(
        mac=str(nic.mac_address),
        eni_id=str(nic.id),
        device_number=int(index),
        subnet_id=str(nic.subnet.id),
        local_ipv4s=(primary, *(a for a in others if a != primary)),
        ipv4_prefixes=tuple(str(p["Ipv4Prefix"]) for p in nic.ipv4_prefixes),
    )


@dataclass
class SimNode:
    name: str
    instance_id: str
    path: Path
    engine: Engine
    pool: PoolManager
    drift: Ec2Drift
    hint: ImdsHint
    leak_gc: LeakGc
    eni_gc: EniGc
    runtime: FakeRuntime
    adapter: Boto3Ec2
    max_pods: int
    drift_wanted: asyncio.Event
    ready: bool = False
    gone: bool = False
    eni_gc_cluster: str = ""
    """The cluster whose detached ENIs this node's ENI GC sweeps ("" = only its own instance's)."""
    pods: set[str] = field(default_factory=set)
    """Container IDs of the pods scheduled here and not yet deleted."""
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def pool_addresses(self) -> int:
        """Addresses in the node's inventory, whatever their state."""
        state = self.engine.state
        return sum(len(state.addresses_of.get(cidr, ())) for cidr in state.units)

    async def stop(self) -> None:
        self.gone = True
        self.ready = False
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks.clear()
        await self.engine.close()


def open_engine(path: Path, clock: Clock, config: Config) -> Engine:
    """A fresh engine on `path`, its store used on the loop's thread (see the module docstring)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    store = Store.open(path)
    state = NodeState.from_image(store.load())
    return Engine(store, state, clock, engine_settings(config), InlineExecutor())


async def build_node(
    name: str,
    path: Path,
    config: Config,
    adapter: Boto3Ec2,
    imds: MotoImds,
    clock: Clock,
    rng: random.Random,
) -> SimNode:
    """The node's parts, as `build_daemon` makes them (its EC2 reads included)."""
    engine = open_engine(path, clock, config)
    identity = await imds.identity()
    instance = await adapter.describe_instance(identity.instance_id)
    raw = await adapter.instance_limits(instance.instance_type)
    limits = NodeLimits(max_enis=raw.max_enis, units_per_eni=raw.units_per_eni)
    targets = PoolTargets.from_config(config)
    strategy = strategy_for(config.enable_prefix_delegation)
    max_pods = compute_pod_limit(targets, limits, strategy)
    engine.settings = replace(engine.settings, max_pods=max_pods)
    settings = PoolSettings(
        targets=targets,
        strategy=strategy,
        cluster_name=config.cluster_name,
        subnet_exhausted_cooldown_s=config.subnet_exhausted_cooldown_s,
        release_grace_s=config.reconcile_grace_s,
    )
    pool = PoolManager(
        engine, adapter, instance, limits, settings, clock, random.Random(rng.random())
    )

    def in_flight() -> set[str]:
        return pool.releases_in_flight | pool.pending_enis

    kinds = (strategy.kind,)
    grace_s = config.reconcile_grace_s
    drift = Ec2Drift(engine, adapter, instance.instance_id, kinds, grace_s, clock, in_flight)
    wanted = asyncio.Event()
    hint = ImdsHint(lambda: engine.state, imds, kinds, grace_s, clock, wanted.set)
    eni_gc = EniGc(
        adapter,
        instance.instance_id,
        config.eni_gc_grace_s,
        clock,
        lambda: pool.pending_enis | set(engine.state.enis),
        cluster_name=config.cluster_name,
    )
    runtime = FakeRuntime(clock)
    return SimNode(
        eni_gc_cluster=config.cluster_name,
        name=name,
        instance_id=instance.instance_id,
        path=path,
        engine=engine,
        pool=pool,
        drift=drift,
        hint=hint,
        leak_gc=LeakGc(engine, runtime, config.leak_grace_s, clock),
        eni_gc=eni_gc,
        runtime=runtime,
        adapter=adapter,
        max_pods=max_pods,
        drift_wanted=wanted,
    )


async def start_node(node: SimNode, config: Config, jobs: Jobs, rng: random.Random) -> None:
    """The daemon's start-up (claim the state, read EC2, first runtime listing: ready), retried on a
    cloud error as a restarted daemon would be, then its loops."""
    await node.engine.claim_instance(node.instance_id)
    first = Job("start_drift", node.drift.run_once, 0.0)
    delay_s = 1.0
    while not await jobs.run_now(first):
        await asyncio.sleep(rng.uniform(0, delay_s))
        delay_s = min(delay_s * 2, 60.0)
    await node.leak_gc.run_once()
    node.ready = True
    loops: list[tuple[str, Callable[[], Coroutine[Any, Any, None]]]] = [
        ("pool", lambda: node.pool.run(config.pool_interval_s)),
        (
            "drift",
            _every(
                jobs,
                Job("ec2_drift", node.drift.run_once, config.ec2_reconcile_interval_s, 5.0),
                rng,
            ),
        ),
        (
            "hint",
            _every(
                jobs, Job("imds_hint", node.hint.run_once, config.imds_hint_interval_s, 1.0), rng
            ),
        ),
        (
            "leak_gc",
            _every(
                jobs, Job("leak_gc", node.leak_gc.run_once, config.leak_gc_interval_s, 5.0), rng
            ),
        ),
        (
            "eni_gc",
            _every(jobs, Job("eni_gc", node.eni_gc.run_once, config.eni_gc_interval_s, 60.0), rng),
        ),
        ("drift_on_demand", lambda: _on_demand(jobs, node)),
    ]
    loop = asyncio.get_running_loop()
    for name, run in loops:
        node.tasks.append(loop.create_task(run(), name=f"{node.name}-{name}"))


def _every(jobs: Jobs, job: Job, rng: random.Random) -> Callable[[], Coroutine[Any, Any, None]]:
    """The schedule's interval trigger: every `interval_s` plus up to `jitter_s`."""

    async def run() -> None:
        while True:
            await asyncio.sleep(job.interval_s + rng.uniform(0, job.jitter_s))
            await jobs.run_now(job)

    return run


async def _on_demand(jobs: Jobs, node: SimNode) -> None:
    """The EC2 check the IMDS hint asks for (`Daemon.drift_on_demand`)."""
    job = Job("ec2_drift_triggered", node.drift.run_once, 0.0)
    while True:
        await node.drift_wanted.wait()
        node.drift_wanted.clear()
        await jobs.run_now(job)
