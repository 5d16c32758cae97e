"""What reconcile costs a node, on the in-memory fakes of `cloud.fakes` and `ipamd.runtime.fake` (so
network round trips are left out and what is measured is ipamd's own work, plus the fakes' few
dictionary lookups).

- `reconcile_cpu_ms_11760_ips`: process CPU time (`time.process_time`, every thread) of one full round
  — an EC2 drift, an IMDS hint and a runtime leak GC — on a 15-ENI prefix-mode node (15 ENIs x 49 /28
  prefixes = 11,760 addresses) running 737 pods, every grace window past; median of 21 rounds.
  Target ≤ 50 ms.
- `gc_ms_737_pods`: wall time of one leak GC round, 737 allocations against a runtime listing 737
  sandboxes; median of 51 rounds.
- `ec2_describe_per_node_hour_steady`: DescribeNetworkInterfaces calls in one simulated node-hour with
  no churn and IMDS agreeing with EC2, every job on its default interval from `Config`: the pool
  manager ticks every `IPAMD_POOL_INTERVAL` (at its target, it describes nothing), the IMDS hint runs
  every `IPAMD_IMDS_HINT_INTERVAL` (it reads IMDS only, and triggers a drift only on disagreement),
  the leak GC every `IPAMD_LEAK_GC_INTERVAL`, and the EC2 drift sweeps once per
  `IPAMD_EC2_RECONCILE_INTERVAL`. Target ≤ 15. The steady sweep (300 s by default) is what it
  counts: 12 an hour; VPC CNI's 60 s period would make 60, four times the target. The 5 s IMDS hint
  is what lets the sweep be slow: it triggers an extra sweep whenever IMDS disagrees with ipamd, so
  the slow authoritative sweep only has to catch what IMDS misses as well.
- `describe_subnets_per_node_hour`: DescribeSubnets calls in that same node-hour. Subnet discovery
  reads the zone's subnets on the pool's first tick and then every `IPAMD_SUBNET_REFRESH_INTERVAL`
  (30 min), never per ENI or per tick: 2. Target ≤ 2 (VPC CNI reads them before every new ENI).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from bench.node import pod_key
from cloud.fakes import FakeEc2, FakeImds
from ipamd.clock import FakeClock
from ipamd.config.groups import ReconcileSettings, RuntimeSettings
from ipamd.config.settings import Config
from ipamd.engine.engine import Engine
from ipamd.node.cloud_node import node_config
from ipamd.node.engine_parts import Parts, describe_node, open_parts
from ipamd.runtime.fake import FakeRuntime
from ipamd.sizing.inputs import PoolTargets

ENIS = 15
PREFIXES_PER_ENI = 49
"""c5.18xlarge: 15 ENIs of 50 IPv4 slots each, the primary address taking one."""
ADDRESSES = ENIS * PREFIXES_PER_ENI * 16
PODS = 737
GRACE_S = 60.0
LEAK_GRACE_S = 120.0
ROUNDS = 21
GC_ROUNDS = 51
HOUR_S = 3600


@dataclass
class BenchNode:
    clock: FakeClock
    ec2: FakeEc2
    imds: FakeImds
    runtime: FakeRuntime
    parts: Parts
    """The daemon's own wiring (`ipamd.node.engine_parts`) on the fakes."""

    @property
    def engine(self) -> Engine:
        return self.parts.engine


async def run(workdir: Path) -> dict[str, float]:
    config = Config.from_env({})
    node = await _open_node(workdir)
    try:
        cpu_ms = await _reconcile_cpu_ms(node)
        gc_ms = await _gc_ms(node)
        steady, subnets = await _describes_per_hour(node, config)
    finally:
        await node.engine.close()
    return {
        f"reconcile_cpu_ms_{ADDRESSES}_ips": cpu_ms,
        f"gc_ms_{PODS}_pods": gc_ms,
        "ec2_describe_per_node_hour_steady": steady,
        "describe_subnets_per_node_hour": subnets,
    }


async def _open_node(workdir: Path) -> BenchNode:
    """The full node: every ENI attached and full of prefixes, adopted from EC2, 737 pods running,
    every grace window past. MINIMUM_IP_TARGET holds every address, so the pool is at its target."""
    clock = FakeClock()
    ec2 = FakeEc2(clock, instance_type="c5.18xlarge", max_enis=ENIS, ipv4_per_eni=50)
    primary = next(iter(ec2.enis))
    await ec2.assign_units(primary, "prefix", PREFIXES_PER_ENI)
    for index in range(1, ENIS):
        eni = await ec2.create_eni(ec2.subnet_id, ("sg-0fake",), "bench", {})
        await ec2.attach_eni(eni.eni_id, ec2.instance_id, index)
        await ec2.assign_units(eni.eni_id, "prefix", PREFIXES_PER_ENI)
    imds = FakeImds(ec2)
    runtime = FakeRuntime(clock)
    config = node_config(
        workdir,
        PoolTargets(minimum_ip_target=ADDRESSES, warm_prefix_target=0),
        prefix_mode=True,
        cluster_name="",
        reconcile=ReconcileSettings(grace_s=GRACE_S),
        runtime=RuntimeSettings(leak_grace_s=LEAK_GRACE_S),
    )
    facts = await describe_node(ec2, ec2.instance_id)
    parts = await open_parts(
        config, facts, ec2=ec2, imds=imds, runtime=runtime, clock=clock, rng=random.Random(1)
    )
    engine, pool = parts.engine, parts.pool
    await engine.claim_instance(ec2.instance_id)
    await pool.adopt()
    for n in range(PODS):
        key = pod_key("reconcile", n)
        runtime.start(key.container_id)
        await engine.assign(key)
    clock.advance(max(GRACE_S, LEAK_GRACE_S) + 1)
    if not pool.plan().is_empty():
        raise RuntimeError(f"the bench node's pool is not at its target: {pool.plan()}")
    return BenchNode(clock, ec2, imds, runtime, parts)


async def _reconcile_cpu_ms(node: BenchNode) -> float:
    async def one_round() -> None:
        report = await node.parts.drift.run_once()
        found = await node.parts.hint.run_once()
        released = await node.parts.leak_gc.run_once()
        if report.changed() or found or released:
            raise RuntimeError(f"the bench node is not steady: {report} {found} {released}")

    return await _median_ms(one_round, ROUNDS, time.process_time)


async def _gc_ms(node: BenchNode) -> float:
    async def one_round() -> None:
        if await node.parts.leak_gc.run_once():
            raise RuntimeError("leak GC released a live pod")

    return await _median_ms(one_round, GC_ROUNDS, time.perf_counter)


async def _median_ms(
    one_round: Callable[[], Awaitable[None]], rounds: int, timer: Callable[[], float]
) -> float:
    await one_round()  # warm-up: first-use caches, the state's lazily built indexes
    samples: list[float] = []
    for _ in range(rounds):
        started = timer()
        await one_round()
        samples.append((timer() - started) * 1000)
    return statistics.median(samples)


async def _describes_per_hour(node: BenchNode, config: Config) -> tuple[float, float]:
    """One node-hour by the fake clock, second by second, each job when its interval comes round (a
    drift also whenever the hint triggers one); returns the DescribeNetworkInterfaces and the
    DescribeSubnets calls made meanwhile."""
    parts = node.parts
    jobs: list[tuple[float, Callable[[], Awaitable[object]]]] = [
        (config.pool.interval_s, parts.pool.run_once),
        (config.reconcile.imds_hint_interval_s, parts.hint.run_once),
        (config.runtime.leak_gc_interval_s, parts.leak_gc.run_once),
        (config.reconcile.ec2_interval_s, parts.drift.run_once),
    ]
    before = node.ec2.calls["describe_enis"]
    subnets_before = node.ec2.calls["subnets_in"]
    parts.drift_wanted.clear()
    for second in range(1, HOUR_S + 1):
        node.clock.advance(1.0)
        for interval_s, job in jobs:
            if second % round(interval_s) == 0:
                await job()
        if parts.drift_wanted.is_set():
            parts.drift_wanted.clear()
            await parts.drift.run_once()
    subnets = node.ec2.calls["subnets_in"] - subnets_before
    return float(node.ec2.calls["describe_enis"] - before), float(subnets)
