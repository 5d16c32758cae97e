"""One simulated node: ipamd's real parts (engine on a real state file, pool manager, EC2 drift, IMDS
hint, runtime leak GC, ENI GC), built by `ipamd.daemon.build_daemon` itself, on the node's own
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
import math
import random
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from bench.cluster.vtime import InlineExecutor
from bench.cluster.waiting import EPS_S, Waiting, WatchedEngine
from cloud.ec2 import Boto3Ec2
from cloud.embedded import space_watch
from cloud.embedded.eni_rules import PREFIXES_ATTR
from cloud.embedded.watched import WatchedList
from cloud.ports import ImdsIdentity, ImdsInterface
from datastore.store import Store
from ipamd.clock import Clock
from ipamd.config.settings import Config
from ipamd.engine.allocator import EngineParams
from ipamd.engine.engine import Engine
from ipamd.engine.state import NodeState
from ipamd.errors import StoreWriteFailed
from ipamd.hostnet.datapath import Datapath
from ipamd.hostnet.fake import FakeHostNetwork, FakeSnatTable
from ipamd.hostnet.ports import HostNetError
from ipamd.node.daemon import Daemon, HostNetAdapters, build_daemon
from ipamd.pool.rounds import Pool
from ipamd.reconcile.ec2_drift import Ec2Drift
from ipamd.reconcile.eni_gc import EniGc
from ipamd.reconcile.imds_hint import ImdsHint
from ipamd.reconcile.jobs import Job, Jobs
from ipamd.reconcile.leaks import LeakGc
from ipamd.runtime.fake import FakeRuntime
from ipamd.runtime.ports import RuntimeUnavailable

WAL_PAGES = 100
"""Pages a simulated node's write-ahead log holds before SQLite copies it into the state file, where
the daemon leaves SQLite's 1,000; after each such checkpoint the log is cut back to nothing. The
state files are in RAM (/dev/shm), and a log grows to its checkpoint size and stays there: at
1,000 pages about 4 MiB a node, 20 GiB at 5,000 nodes. At 100, about 0.4 MiB at most. Durability
is not measured here, and the daemon's commits are the same."""


class Counted(Protocol):
    """A node as `Refusal` reads it: its engine, and the commits its listener counted."""

    @property
    def engine(self) -> Engine: ...

    @property
    def commits(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Refusal:
    """An ADD refused for want of an address, and what its engine decided it on: an ADD of another
    new pod is refused the same way until the engine commits, the ENIs held back change, or an
    address comes out of its cooldown."""

    at_s: float
    commits: int
    held: frozenset[str]
    free_at_s: float
    """When the first address cooling then comes out of its cooldown (infinite if none)."""

    @classmethod
    def of(cls, node: Counted, now: float) -> Refusal:
        engine = node.engine
        cooldown_s = engine.settings.cooldown_s
        free_at = next(
            (t + cooldown_s for t in engine.state.cooldowns().values() if t + cooldown_s > now),
            math.inf,
        )
        return cls(now, node.commits, frozenset(engine.held_back()), free_at)

    def stands(self, node: Counted, now: float, within_s: float) -> bool:
        """Whether an ADD now would be refused just as this one (and this one is recent). An instant
        within `EPS_S` of its end is its end: the clock adds the loop's time to an epoch, and a
        retry `within_s` after the refusal must not read as a hair too early."""
        return now < self.until(node, within_s) - EPS_S

    def until(self, node: Counted, within_s: float) -> float:
        """Until when it stands if nothing changes: `within_s` after it, or when an address leaves
        its cooldown; -inf if the engine committed or the ENIs held back changed since."""
        if node.commits != self.commits or frozenset(node.engine.held_back()) != self.held:
            return -math.inf
        return min(self.at_s + within_s, self.free_at_s)


class MotoImds:
    """`cloud.ports.Imds` for one instance, read from moto's live state (no lag). The interfaces are
    built again only when what they show may have changed (the hint asks every 5 s, and they seldom
    do): an ENI came or went, or the address or prefix list of one changed."""

    def __init__(self, instance: Any, region: str) -> None:
        self._instance = instance
        self._region = region
        self._shown: tuple[object, ...] | None = None
        self._interfaces: tuple[ImdsInterface, ...] = ()

    async def identity(self) -> ImdsIdentity:
        i = self._instance
        zone = str(i.placement.zone or "")
        macs = tuple(str(nic.mac_address) for _, nic in sorted(i.nics.items()))
        return ImdsIdentity(i.id, str(i.instance_type), self._region, zone, macs)

    async def interfaces(self) -> tuple[ImdsInterface, ...]:
        nics = sorted(self._instance.nics.items())
        shown = tuple(_shown(index, nic) for index, nic in nics)
        if shown != self._shown:
            self._shown = shown
            self._interfaces = tuple(_interface(index, nic) for index, nic in nics)
        return self._interfaces

    async def vpc_cidrs(self, mac: str) -> tuple[str, ...]:
        return (str(self._instance.nics[0].subnet.vpc.cidr_block),)


def _shown(index: int, nic: Any) -> tuple[object, ...]:
    """What tells whether `nic`'s `ImdsInterface` may have changed: its place, and its address and
    prefix lists with the changes each has had (its ID, MAC, subnet and primary address never
    change). Per ENI: a change elsewhere in its subnet does not make it read again."""
    addresses: WatchedList = nic.private_ip_addresses
    prefixes = space_watch.watched_list(nic, PREFIXES_ATTR)
    return (index, nic.id, addresses, addresses.changes, prefixes, prefixes.changes)


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
    store: Store
    """The engine's store: the node's one connection to its state file (`bench.cluster.limits`)."""
    engine: Engine
    pool: Pool
    drift: Ec2Drift
    hint: ImdsHint
    leak_gc: LeakGc
    eni_gc: EniGc
    runtime: FakeRuntime
    adapter: Boto3Ec2
    max_pods: int
    daemon: Daemon
    datapath: Datapath
    """The node's datapath on a fake kernel (`auto_links`: each ENI's link shows at once), so ADD
    and DEL take the daemon's path: rules installed before the answer, removed after."""
    ready: bool = False
    gone: bool = False
    eni_gc_cluster: str = ""
    """The cluster whose detached ENIs this node's ENI GC sweeps ("" = only its own instance's)."""
    pods: set[str] = field(default_factory=set)
    """Container IDs of the pods scheduled here and not yet deleted."""
    commits: int = 0
    """Mutations the node's engine has committed (counted by its listener)."""
    refusal: Refusal | None = None
    """The node's last ADD refused for want of an address (`bench.cluster.workload`)."""
    waiting: Waiting | None = None
    """Its pods waiting for an address, once one has waited (`bench.cluster.workload`)."""
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    coming: set[str] = field(default_factory=set)
    """Pods bound here whose ADD has not yet got them an address: what the API's pod watch tells
    a pod-aware pool (`ipamd.kube.pods.PodWatch.waiting`)."""
    pod_aware: bool = False
    """IPAMD_POD_AWARE_POOL: the pool keeps addresses for the pods `coming`."""

    def bound(self, container_id: str) -> None:
        """The scheduler bound a pod here; its ADD comes after the kubelet's sync."""
        self.coming.add(container_id)
        if self.pod_aware:
            self.engine.want_pool()

    def counted_commit(self) -> None:
        self.commits += 1
        self.changed()

    def changed(self) -> None:
        """A commit, a change of the ENIs held back, or the node gone: an ADD may be answered
        differently now."""
        if self.waiting is not None:
            self.waiting.changed()

    def pool_addresses(self) -> int:
        """Addresses in the node's inventory, whatever their state."""
        state = self.engine.state
        return sum(len(state.addresses_of(cidr)) for cidr in state.units())

    async def stop(self) -> None:
        self.gone = True
        self.ready = False
        self.changed()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks.clear()
        await self.engine.close()


async def open_inline_engine(
    path: Path, clock: Clock, settings: EngineParams, opened: Callable[[Store], None]
) -> Engine:
    """A fresh engine on `path`, its store used on the loop's thread (see the module docstring);
    `opened` is handed the store, through which the invariant checks read the file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    store = Store.open(path)
    conn = store._conn  # the simulator's own settings of its files, never the daemon's
    conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_PAGES}")
    conn.execute("PRAGMA journal_size_limit = 0")
    opened(store)
    state = NodeState.from_image(store.load())
    return WatchedEngine(store, state, clock, settings, InlineExecutor())


class _NoSandboxAddresses:
    """Repair's evidence source; the simulation never repairs."""

    async def sandbox_addresses(self, sandbox_id: str) -> tuple[str, ...]:
        raise RuntimeUnavailable("the simulated runtime records no sandbox addresses")


async def build_node(
    name: str,
    path: Path,
    config: Config,
    adapter: Boto3Ec2,
    imds: MotoImds,
    clock: Clock,
    rng: random.Random,
) -> SimNode:
    """The node's parts, made by the daemon's own `build_daemon` (its EC2 reads included)."""
    runtime = FakeRuntime(clock)
    stores: list[Store] = []

    async def open_engine(path: Path, clock: Clock, settings: EngineParams) -> Engine:
        return await open_inline_engine(path, clock, settings, stores.append)

    daemon = await build_daemon(
        replace(config, storage=replace(config.storage, state_dir=str(path.parent))),
        ec2=adapter,
        imds=imds,
        runtime=runtime,
        addresses=_NoSandboxAddresses(),
        clock=clock,
        open_engine=open_engine,
        rng=random.Random(rng.random()),
        hostnet=HostNetAdapters(FakeHostNetwork(auto_links=True), FakeSnatTable(), imds.vpc_cidrs),
    )
    assert daemon.datapath is not None
    max_pods = daemon.engine.settings.max_pods
    assert max_pods is not None, "build_daemon sets the node's pod limit"
    node = SimNode(
        store=stores[-1],
        daemon=daemon,
        datapath=daemon.datapath,
        eni_gc_cluster=config.enis.cluster_name,
        name=name,
        instance_id=daemon.instance_id,
        path=path,
        engine=daemon.engine,
        pool=daemon.pool,
        drift=daemon.drift,
        hint=daemon.hint,
        leak_gc=daemon.leak_gc,
        eni_gc=daemon.eni_gc,
        runtime=runtime,
        adapter=adapter,
        max_pods=max_pods,
    )
    daemon.engine.subscribe(lambda _mutation, _removed: node.counted_commit())
    if isinstance(daemon.engine, WatchedEngine):
        daemon.engine.watch(node.changed)
    return node


Failed = Callable[[str, str, BaseException], None]
"""Told of a local error: ("local_error", where, the error) (`bench.cluster.sim.Cluster.failed`)."""
LOCAL = "local_error"
LOCAL_JOB_ERRORS = (StoreWriteFailed, HostNetError, RuntimeUnavailable)
"""What the daemon's schedule counts as a round that failed and goes on (`Jobs.run_now`), and
what here can only be the process's own: the simulated kernel and runtime never fail, and a
state file on /dev/shm fails a write only when the process cannot open or write its files."""


async def start_node(
    node: SimNode,
    config: Config,
    jobs: Jobs,
    rng: random.Random,
    failed: Failed = lambda _why, _where, _err: None,
) -> None:
    """The daemon's own start-up (`Daemon.start`: claim the state, read EC2 with backoff, first
    runtime listing, ready), then its loops, the reconcile rounds counted in the shared `jobs`.
    A round that fails on a local error, or a loop that stops on an exception, is told to
    `failed` (the daemon's task group would stop the daemon)."""
    daemon = node.daemon
    daemon.jobs = jobs
    await daemon.start()
    node.ready = daemon.ready
    if config.kube.pod_aware_pool == "on":  # the API's pod watch, as the workload binds pods
        node.pod_aware = True
        node.pool.expect_pods(lambda: len(node.coming))
    loops: list[tuple[str, Callable[[], Coroutine[Any, Any, None]]]] = [
        ("pool", lambda: node.pool.run(config.pool.interval_s)),
        (
            "drift",
            _every(
                jobs,
                Job("ec2_drift", node.drift.run_once, config.reconcile.ec2_interval_s, 5.0),
                rng,
            ),
        ),
        (
            "hint",
            _every(
                jobs,
                Job("imds_hint", node.hint.run_once, config.reconcile.imds_hint_interval_s, 1.0),
                rng,
            ),
        ),
        (
            "leak_gc",
            _every(
                jobs,
                Job("leak_gc", node.leak_gc.run_once, config.runtime.leak_gc_interval_s, 5.0),
                rng,
            ),
        ),
        (
            "eni_gc",
            _every(jobs, Job("eni_gc", node.eni_gc.run_once, config.enis.gc_interval_s, 60.0), rng),
        ),
        ("drift_on_demand", daemon.drift_on_demand),
        ("hostnet", node.datapath.run),
        (
            "hostnet_reconcile",
            _every(
                jobs,
                Job(
                    "hostnet",
                    node.datapath.reconcile,
                    config.datapath.reconcile_interval_s,
                    1.0,
                ),
                rng,
            ),
        ),
    ]
    reading = daemon.parts.subnet_free
    if reading is not None:
        job = Job("subnet_free", reading.run_once, config.subnets.refresh_interval_s, 30.0)
        loops.append(("subnet_free", _every(jobs, job, rng)))
    loop = asyncio.get_running_loop()
    for name, run in loops:
        task = loop.create_task(_watched(run, f"{node.name}: {name}", failed), name=name)
        node.tasks.append(task)


async def _watched(
    run: Callable[[], Coroutine[Any, Any, None]], where: str, failed: Failed
) -> None:
    try:
        await run()
    except LOCAL_JOB_ERRORS as err:
        failed(LOCAL, where, err)
    except Exception as err:
        failed(LOCAL, f"{where} stopped", err)


def _every(jobs: Jobs, job: Job, rng: random.Random) -> Callable[[], Coroutine[Any, Any, None]]:
    """The schedule's interval trigger: every `interval_s` plus up to `jitter_s`. A round that
    fails on a local error (`LOCAL_JOB_ERRORS`) ends the loop with it (`_watched`); one that
    crashes, too (`Jobs.fatal`)."""
    errors: list[BaseException] = []

    async def round_once() -> None:
        try:
            await job.run()
        except LOCAL_JOB_ERRORS as err:
            errors.append(err)
            raise

    counted = replace(job, run=round_once)

    async def run() -> None:
        while True:
            await asyncio.sleep(job.interval_s + rng.uniform(0, job.jitter_s))
            await jobs.run_now(counted)
            if errors:
                raise errors[0]
            if jobs.fatal is not None:
                raise RuntimeError(f"job {job.name} crashed") from jobs.fatal

    return run
