"""Drives one `RunSpec` on a virtual-time loop and returns its `RunResult` (see `bench.cluster.sim`
for the phases of a run)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

from bench.cluster import limits
from bench.cluster.bound import lower_bound
from bench.cluster.front import THROTTLED, AccountFront
from bench.cluster.moto_client import MotoEc2Client
from bench.cluster.sim import Cluster, RunResult, RunSpec, install_executor, new_front
from bench.cluster.vtime import VirtualClock, VirtualTimeLoop
from bench.cluster.workload import LOCAL, Draws, Workload
from cloud.embedded.world import EmbeddedEc2

Progress = Callable[[str], None]
QUIET_LOGGERS = ("ipamd", "cloud", "datastore")
READY_POLL_S = 5.0
READY_WAIT_CAP_S = 3600.0
"""After the join spread and the idle time, how long the workload waits at most for nodes not
yet ready (then it starts on those that are)."""
FINAL_CHECK_GAP_S = 120.0
"""The last check is taken twice, this far apart, so that an ENI between two steps is not a leak."""
GC_THRESHOLDS = (50_000, 20, 10)
"""The cyclic collector's thresholds during a run (Python's default: 700, 10, 10). A run allocates
millions of short-lived objects (futures, handles, exceptions) beside a large, long-lived heap (moto's
account, every node's parts); at the default, full collections, whose cost grows with the heap, took
a quarter of a 250-node run. Reference counting frees nearly everything anyway."""


def state_root() -> str | None:
    """Where the state files go: RAM (/dev/shm) where there is one; durability is not measured."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() else None


@contextlib.contextmanager
def lean_gc() -> Iterator[None]:
    """`GC_THRESHOLDS` for the run; objects frozen by `freeze_heap` are thawed after it."""
    thresholds = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
        gc.collect()


def freeze_heap() -> None:
    """Leave what exists now (the account, the ready nodes) out of every later collection."""
    gc.collect()
    gc.freeze()


@contextlib.contextmanager
def quiet_logs() -> Iterator[None]:
    """ipamd logs every throttled call and every pool change; at 500 nodes that is noise."""
    loggers = [logging.getLogger(name) for name in QUIET_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def run_spec(
    spec: RunSpec,
    host: EmbeddedEc2,
    progress: Progress = lambda _: None,
    cluster_type: type[Cluster] = Cluster,
) -> RunResult:
    """One run, start to finish, on a fresh virtual-time loop and a fresh moto world; the nodes'
    network is `cluster_type`'s (e.g. `bench.cluster.subnets_run.TakeoverCluster`). Refused with
    `limits.TooFewDescriptors` before anything starts if the process cannot hold its nodes; a
    local error stops it with `sim.LocalFailure`."""
    limits.ensure_descriptors(spec.nodes)
    workdir = Path(tempfile.mkdtemp(prefix=f"ipamd-cluster-{spec.name}-", dir=state_root()))
    loop = VirtualTimeLoop()
    cpu_before = time.process_time()
    try:
        with quiet_logs(), lean_gc():
            result = loop.run_until_complete(_run(spec, host, workdir, progress, cluster_type))
        result.cpu_s = time.process_time() - cpu_before
        return result
    finally:
        _close_loop(loop)
        shutil.rmtree(workdir, ignore_errors=True)


def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
    left = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in left:
        task.cancel()
    if left:
        loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()


async def _run(
    spec: RunSpec, host: EmbeddedEc2, workdir: Path, progress: Progress, cluster_type: type[Cluster]
) -> RunResult:
    loop = asyncio.get_running_loop()
    clock = VirtualClock(loop)
    limits.reset_peak()
    rss_before = limits.rss_mib()
    front = new_front(spec, clock)
    install_executor(loop, front)
    cluster = cluster_type(spec, host, workdir)
    client = MotoEc2Client(front, cluster.backend, cluster.instances)
    await _join_all(cluster, client, clock, rss_before, progress)
    freeze_heap()
    workload = Workload(
        cluster.live_nodes, clock, Draws(spec.seed), spec.pods, spec.name, cluster.failed
    )
    background: list[asyncio.Task[None]] = []
    try:
        start_s = clock.elapsed_s()
        background.append(
            loop.create_task(_every(spec.sample_s, lambda: _sample(cluster, clock, start_s)))
        )
        background.append(
            loop.create_task(_every(spec.checkpoint_s, lambda: _check(cluster, clock)))
        )
        phase = _burst if spec.burst_pods else _steady
        await cluster.until_failed(phase(cluster, workload, front, clock, client, progress))
        _check(cluster, clock)
        await cluster.until_failed(asyncio.sleep(FINAL_CHECK_GAP_S))
        _check(cluster, clock)
        cluster.raise_if_failed()
        cluster.result.state_mib_per_node = _state_mib(workdir) / max(spec.nodes, 1)
    finally:
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await workload.close()
        await cluster.close()
    return _finish(cluster, workload, front, clock, rss_before)


async def _join_all(
    cluster: Cluster,
    client: MotoEc2Client,
    clock: VirtualClock,
    rss_before: float,
    progress: Progress,
) -> None:
    """Launch the instances, let the nodes join and the cluster idle, until every node is ready
    (each start waits out a throttled account: at thousands of nodes the account's reads alone
    take longer than the join spread); the descriptors and memory the nodes took."""
    spec = cluster.spec
    ids = cluster.launch_instances(spec.nodes, 0)
    descriptors_before = limits.open_descriptors()
    cluster.join(ids, spec.join_spread_s, client)
    try:
        await cluster.until_failed(asyncio.sleep(spec.join_spread_s + spec.warmup_s))
        waited_s = 0.0
        while _ready(cluster) < spec.nodes and waited_s < READY_WAIT_CAP_S:
            await cluster.until_failed(asyncio.sleep(READY_POLL_S))
            waited_s += READY_POLL_S
        _count_descriptors(cluster, descriptors_before)
    except BaseException:
        await cluster.close()
        raise
    progress(
        f"{spec.name}: {_ready(cluster)} nodes ready at t={clock.elapsed_s():.0f}s, "
        f"{cluster.result.descriptors_per_node:.2f} descriptors and "
        f"{(limits.rss_mib() - rss_before) / max(spec.nodes, 1):.3f} MiB a node"
    )


def _ready(cluster: Cluster) -> int:
    return sum(1 for node in cluster.nodes if node.ready)


def _finish(
    cluster: Cluster,
    workload: Workload,
    front: AccountFront,
    clock: VirtualClock,
    rss_before: float,
) -> RunResult:
    """The run's result: the counts of the account and the nodes, the bound, the memory."""
    result = cluster.result
    result.pods = workload.stats
    result.throttled_total = front.throttled()
    result.client_retries = sum(_retries(n.adapter) for n in (*cluster.nodes, *cluster.retired))
    result.pool_failures = sum(n.pool.health.failures for n in (*cluster.nodes, *cluster.retired))
    result.job_failures = sum(
        n for (_, outcome), n in cluster.jobs.outcomes.items() if outcome != "ok"
    )
    result.sim_s = clock.elapsed_s()
    result.node_traces = list(cluster.node_traces.values())
    model = cluster.bound_model()
    if model is not None:
        result.bound = lower_bound(
            result.pods.traces, result.node_traces, model, result.since_s, result.until_s
        )
    result.peak_rss_mib = limits.peak_rss_mib()
    result.rss_mib_per_node = (result.peak_rss_mib - rss_before) / max(cluster.spec.nodes, 1)
    return result


def _count_descriptors(cluster: Cluster, before: int) -> None:
    """Descriptors per node once the nodes are ready; more than `limits.FDS_PER_NODE` is a local
    error (the limit the run was admitted under would not hold)."""
    now = limits.open_descriptors()
    if before < 0 or now < 0 or not cluster.nodes:
        return
    per_node = (now - before) / len(cluster.nodes)
    cluster.result.descriptors_per_node = per_node
    if per_node > limits.FDS_PER_NODE:
        cluster.failed(
            LOCAL,
            "descriptors",
            RuntimeError(f"{per_node:.2f} a node, more than the {limits.FDS_PER_NODE} allowed for"),
        )
        cluster.raise_if_failed()


def _state_mib(workdir: Path) -> float:
    """The size of every file under `workdir` (the nodes' state files, WALs, shared memory)."""
    total = 0
    for path in workdir.rglob("*"):
        with contextlib.suppress(OSError):
            if path.is_file():
                total += path.stat().st_size
    return total / (1024 * 1024)


def _retries(adapter: object) -> int:
    recorder = getattr(adapter, "recorder", None)
    return int(getattr(recorder, "retries", 0))


async def _every(interval_s: float, action: Callable[[], None]) -> None:
    while True:
        await asyncio.sleep(interval_s)
        action()


def _sample(cluster: Cluster, clock: VirtualClock, start_s: float) -> None:
    cluster.sample(clock.elapsed_s() - start_s)


def _check(cluster: Cluster, clock: VirtualClock) -> None:
    cluster.check(clock.now())


def _measure_from(
    cluster: Cluster, front: AccountFront, clock: VirtualClock
) -> Counter[tuple[str, str]]:
    cluster.result.since_s = clock.now()
    if cluster.spec.build_unmetered:
        front.meter()
    return front.snapshot()


def _close_window(
    cluster: Cluster, front: AccountFront, since: Counter[tuple[str, str]], clock: VirtualClock
) -> None:
    result = cluster.result
    result.until_s = clock.now()
    result.window_s = result.until_s - result.since_s
    result.calls = dict(front.by_operation(since))
    result.throttled_by_operation = dict(front.by_operation(since, THROTTLED))
    result.throttled = front.throttled(since)


async def _steady(
    cluster: Cluster,
    workload: Workload,
    front: AccountFront,
    clock: VirtualClock,
    client: MotoEc2Client,
    progress: Progress,
) -> None:
    spec = cluster.spec
    workload.mean_lifetime_s = spec.mean_lifetime_s
    target = round(spec.nodes * spec.pods_per_node)
    end = clock.now() + spec.ramp_s + spec.measure_s
    tasks = [
        asyncio.create_task(workload.spread(target, spec.ramp_s)),
        asyncio.create_task(workload.arrivals(target / spec.mean_lifetime_s, end)),
    ]
    if spec.churn_per_hour > 0:
        tasks.append(asyncio.create_task(_churn(cluster, workload, client)))
    await asyncio.sleep(spec.ramp_s)
    progress(f"{spec.name}: ramp done, {workload.stats.scheduled} pods scheduled")
    since = _measure_from(cluster, front, clock)
    await _report_every(
        spec.measure_s, clock, lambda: progress(_status(cluster, workload, front, clock))
    )
    _close_window(cluster, front, since, clock)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _report_every(duration_s: float, clock: VirtualClock, say: Callable[[], None]) -> None:
    end = clock.elapsed_s() + duration_s
    while clock.elapsed_s() < end:
        await asyncio.sleep(min(1800.0, end - clock.elapsed_s()))
        say()


def _status(cluster: Cluster, workload: Workload, front: AccountFront, clock: VirtualClock) -> str:
    stats = workload.stats
    return (
        f"{cluster.spec.name}: t={clock.elapsed_s():.0f}s nodes={len(cluster.nodes)} "
        f"pods={sum(len(n.pods) for n in cluster.nodes)} failed={stats.failed_no_address} "
        f"throttled={front.throttled()} violations={cluster.result.violations}"
    )


async def _churn(cluster: Cluster, workload: Workload, client: MotoEc2Client) -> None:
    """Replace `churn_per_hour` of the nodes per hour, one at a time, evenly spaced."""
    spec = cluster.spec
    gap_s = 3600.0 / max(spec.churn_per_hour * spec.nodes, 1e-9)
    index = spec.nodes
    while True:
        await asyncio.sleep(gap_s)
        ready = [n for n in cluster.nodes if n.ready]
        if not ready:
            continue
        victim = ready[int(cluster.victims.random() * len(ready))]
        await cluster.retire(victim)
        workload.reschedule(victim)
        cluster.result.nodes_replaced += 1
        ids = cluster.launch_instances(1, index)
        index += 1
        cluster.join(ids, spec.rejoin_after_s, client)


async def _burst(
    cluster: Cluster,
    workload: Workload,
    front: AccountFront,
    clock: VirtualClock,
    client: MotoEc2Client,
    progress: Progress,
) -> None:
    spec = cluster.spec
    workload.mean_lifetime_s = None
    since = _measure_from(cluster, front, clock)
    started = clock.elapsed_s()
    await workload.spread(spec.burst_pods, spec.burst_window_s)
    deadline = started + spec.burst_window_s + spec.pods.deadline_s + 60.0
    await workload.settle(deadline - clock.elapsed_s())
    done_s = clock.elapsed_s() - started
    status = _status(cluster, workload, front, clock)
    progress(f"{spec.name}: the burst settled after {done_s:.0f}s virtual; {status}")
    await asyncio.sleep(spec.burst_settle_s)
    _close_window(cluster, front, since, clock)
