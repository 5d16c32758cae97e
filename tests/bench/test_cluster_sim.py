"""The cluster simulator (`bench.cluster`): its EC2 front throttles as EC2 does and refills by virtual
time, virtual time really is virtual, and small clusters keep every invariant under the steady and
bursty workloads."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from bench.cluster.bound import PodTrace
from bench.cluster.front import THROTTLED, AccountFront, Ec2Budget
from bench.cluster.moto_client import MotoEc2Client
from bench.cluster.report import (
    calls_per_node_hour,
    demand_metrics,
    metrics,
    percentile,
    side_by_side,
    times_to_address,
)
from bench.cluster.runner import run_spec
from bench.cluster.sim import POD_AWARE, RunResult, RunSpec
from bench.cluster.vtime import LatencyExecutor, VirtualTimeLoop
from bench.cluster.workload import PodSettings
from cloud.ec2 import Boto3Ec2
from cloud.embedded.world import EmbeddedEc2, World
from cloud.errors import Throttled
from cloud.ratelimit import RetryPolicy


@pytest.fixture(scope="module")
def host() -> Iterator[EmbeddedEc2]:
    with EmbeddedEc2() as embedded:
        yield embedded


class Now:
    def __init__(self) -> None:
        self.s = 0.0

    def __call__(self) -> float:
        return self.s


def test_the_front_refuses_past_its_bucket_and_refills_with_time() -> None:
    now = Now()
    front = AccountFront(Ec2Budget(mutate_capacity=3, mutate_refill_per_s=2.0), now)
    admitted = [front.admit("AssignPrivateIpAddresses") for _ in range(5)]
    assert admitted == [True, True, True, False, False]
    assert front.throttled() == 2
    assert front.admit("DescribeNetworkInterfaces")  # the other family has its own bucket
    now.s = 0.4  # 0.8 tokens: still nothing
    assert not front.admit("AttachNetworkInterface")
    now.s = 0.5  # 1 token
    assert front.admit("AttachNetworkInterface")
    assert not front.admit("AttachNetworkInterface")
    now.s = 100.0  # refilled, never beyond capacity
    assert [front.admit("CreateNetworkInterface") for _ in range(4)] == [True, True, True, False]


def test_an_unmetered_front_admits_everything_until_the_budget_applies() -> None:
    """A steady run's cluster is built unmetered; from `meter()` on the buckets apply, full."""
    now = Now()
    front = AccountFront(Ec2Budget(mutate_capacity=2, mutate_refill_per_s=1.0), now, metered=False)
    assert all(front.admit("CreateNetworkInterface") for _ in range(50))
    now.s = 10.0
    front.meter()
    assert [front.admit("AttachNetworkInterface") for _ in range(3)] == [True, True, False]
    assert front.throttled() == 1


def test_per_action_buckets_keep_actions_apart() -> None:
    front = AccountFront(Ec2Budget(mutate_capacity=1, per_action=True), Now())
    assert front.admit("AssignPrivateIpAddresses")
    assert front.admit("AttachNetworkInterface")
    assert not front.admit("AssignPrivateIpAddresses")


def test_a_throttled_request_reaches_ipamd_as_request_limit_exceeded(
    host: EmbeddedEc2,
) -> None:
    """Through the real adapter: EC2 does nothing, the adapter retries, gives up as `Throttled`."""
    world: World = host.world("m5.large", seed=7)
    loop = VirtualTimeLoop()
    front = AccountFront(Ec2Budget(describe_capacity=2, describe_refill_per_s=0.001), loop.time)
    loop.set_default_executor(LatencyExecutor(loop, lambda: front.last_latency_s))
    instances = {i.id: i for i in world.backend().all_instances()}
    client = MotoEc2Client(front, world.backend(), instances)
    adapter = Boto3Ec2(client, clock=loop.time, retry=RetryPolicy(max_attempts=3))

    async def describe_three_times() -> list[object]:
        results: list[object] = []
        for _ in range(3):
            try:
                results.append(len(await adapter.describe_enis(world.instance_id)))
            except Throttled as err:
                results.append(err.code)
        return results

    try:
        outcome = loop.run_until_complete(describe_three_times())
        virtual_s = loop.time()
    finally:
        loop.close()
    assert outcome == [1, 1, THROTTLED]
    assert front.calls["DescribeNetworkInterfaces", THROTTLED] == 3  # one per attempt
    assert virtual_s > 0.2  # two answers of 0.1 s each, plus the backoff between attempts


def test_an_eni_made_through_the_simulated_account_holds_its_units_and_is_bound(
    host: EmbeddedEc2,
) -> None:
    """Create with units, attach, DeleteOnTermination with the attachment ID the attach answered:
    the simulated account speaks EC2's answers, so the adapter's calls succeed as they would."""
    world: World = host.world("m5.large", seed=8)
    loop = VirtualTimeLoop()
    front = AccountFront(Ec2Budget(), loop.time)
    loop.set_default_executor(LatencyExecutor(loop, lambda: front.last_latency_s))
    instances = {i.id: i for i in world.backend().all_instances()}
    adapter = Boto3Ec2(MotoEc2Client(front, world.backend(), instances), clock=loop.time)

    async def make() -> tuple[int, bool]:
        eni = await adapter.create_eni(world.subnet_id, [], "pods", {"k": "v"}, count=5)
        attachment = await adapter.attach_eni(eni.eni_id, world.instance_id, 1)
        await adapter.set_delete_on_termination(eni.eni_id, attachment)
        listed = {e.eni_id: e for e in await adapter.describe_enis(world.instance_id)}
        return len(listed[eni.eni_id].secondary_ips), listed[eni.eni_id].delete_on_termination

    try:
        assert loop.run_until_complete(make()) == (5, True)
    finally:
        loop.close()
    assert front.calls["ModifyNetworkInterfaceAttribute", "ok"] == 1


def test_virtual_time_passes_without_waiting() -> None:
    loop = VirtualTimeLoop()
    started = time.perf_counter()
    try:
        loop.run_until_complete(asyncio.sleep(7200.0))
        assert loop.time() == pytest.approx(7200.0)
    finally:
        loop.close()
    assert time.perf_counter() - started < 1.0


def test_percentile_is_nearest_rank() -> None:
    assert percentile([], 0.5) == 0.0
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([float(n) for n in range(1, 101)], 0.99) == 99.0


def test_a_pod_given_up_at_its_deadline_counts_as_waiting_until_then() -> None:
    """The p99 must not leave out the pods that waited longest: one given up at its 1,800 s
    deadline counts 1,800 s; one that left before it had an address (its node gone) does not."""
    result = RunResult(RunSpec("burst", 1), since_s=0.0, until_s=100.0)
    result.pods.traces = [
        PodTrace("a", 10.0, address_s=40.0),
        PodTrace("a", 20.0, released_s=1820.0, gave_up=True),
        PodTrace("a", 30.0, released_s=50.0),
        PodTrace("a", 500.0, address_s=510.0),  # after the window
    ]
    assert times_to_address(result) == [30.0, 1800.0]


def test_a_small_steady_cluster_keeps_every_invariant(host: EmbeddedEc2) -> None:
    spec = RunSpec("steady", 12, pods_per_node=15, ramp_s=300, measure_s=1800, warmup_s=120, seed=3)
    result = run_spec(spec, host)
    assert result.problems == []
    assert result.violations == 0
    assert result.checkpoints >= 3
    assert result.pods.failed_no_address == 0
    assert result.pods.add_errors == {}
    assert result.pods.scheduled > spec.nodes * spec.pods_per_node  # the ramp, then arrivals
    assert result.pods.deleted > 0
    calls = calls_per_node_hour(result)
    # The steady sweep: one DescribeNetworkInterfaces per node every 300 s, ~12 a node-hour.
    assert 8 <= calls["DescribeNetworkInterfaces"] <= 30
    # Pods were placed at ~15 per node, so the series shows them held by pools at least as large.
    assert result.series
    assert all(addresses >= pods for _, pods, addresses in result.series)


def test_a_burst_under_throttling_reports_time_to_address(host: EmbeddedEc2) -> None:
    # 5 tokens and one each 4 s: fewer than the 60 calls the second and third ENIs of 15 nodes
    # take at least, in the minute the 300 pods arrive.
    budget = Ec2Budget(mutate_capacity=5, mutate_refill_per_s=0.25)
    spec = RunSpec("burst", 15, burst_pods=300, warmup_s=60, budget=budget, seed=4)
    result = run_spec(spec, host)
    tta = times_to_address(result)
    assert len(tta) == 300
    assert result.pods.failed_no_address == 0
    assert result.violations == 0, result.problems
    assert result.throttled > 0  # the small budget did bite
    assert percentile(tta, 0.99) > percentile(tta, 0.5)  # some pods waited for the pool to grow
    assert percentile(tta, 0.99) > 1.0
    # The bound is one: ipamd's own longest wait is no shorter, and the budget made it more than
    # the calls' latency.
    assert result.bound is not None
    assert 1.0 < result.bound.seconds <= max(tta)
    figures = metrics(result, 0.0)
    assert figures["time_to_address_lower_bound_s"] == result.bound.seconds
    assert figures["time_to_address_p99_over_bound"] == pytest.approx(
        percentile(tta, 0.99) / result.bound.seconds
    )
    assert figures["time_to_address_max_over_bound"] >= 1.0
    assert 0 < figures["bound_mutating_calls"] <= figures["mutating_calls"]


def test_node_churn_keeps_the_address_invariants(host: EmbeddedEc2) -> None:
    """A node terminated while its pool manager was between two steps (created but not attached, or
    detached but not deleted, an ENI) leaves that ENI behind; with a cluster name every node's ENI
    GC sweeps the cluster's leftovers, so nothing is leaked and the addresses stay sound."""
    spec = RunSpec("churn", 10, ramp_s=300, measure_s=1200, warmup_s=60, churn_per_hour=2.0, seed=5)
    result = run_spec(spec, host)
    assert result.nodes_replaced >= 5
    assert result.pods.rescheduled > 0  # the terminated nodes' pods started again elsewhere
    assert result.pods.failed_no_address == 0
    assert result.problems == [], result.problems
    assert result.violations == 0


def test_a_pod_aware_pool_keeps_addresses_for_the_pods_bound_and_no_more(host: EmbeddedEc2) -> None:
    """The same pods, bound a while before their ADD, on the default warm pool and on the pod-aware
    pool with every warm target at 0 (`python -m bench.cluster`'s `bound_*` runs, smaller and at
    8 pods a node): the pod-aware pool answers as soon, holds far fewer addresses, and tracks its
    pods."""
    warm = RunSpec(
        "bound_warm_pool",
        8,
        pods_per_node=8,
        ramp_s=300,
        measure_s=1200,
        warmup_s=60,
        build_unmetered=True,
        pods=PodSettings(bind_to_add_median_s=2.0),
        seed=6,
    )
    aware = replace(warm, name="bound_pod_aware", settings=POD_AWARE)
    results = {spec.name: (run_spec(spec, host), 0.0) for spec in (warm, aware)}
    for result, _ in results.values():
        assert result.violations == 0 and result.local_errors == 0, result.problems
        assert result.pods.failed_no_address == 0
    first, second = (demand_metrics(results[name][0]) for name in (warm.name, aware.name))
    assert first["bind_to_address_p50_s"] >= 0.5, "the ADD comes after the kubelet's sync"
    assert second["addresses_per_node_mean"] < first["addresses_per_node_mean"]
    assert second["addresses_per_node_mean"] - second["pods_with_address_per_node_mean"] < 6, (
        "what it holds beyond its pods: the ones on their way, cooling and spare for a while"
    )
    assert second["mutating_calls_per_1000_pods"] > 0, "it grows and shrinks by the pod"
    ratios = side_by_side(results, warm.name, aware.name)
    # At 8 pods a node the default pool holds about 2.6 addresses a pod (an ENI of 9 kept warm);
    # the pod-aware one about 1.3 (what its growth filled, until the release delay gives it back).
    assert ratios["bound_pod_aware_addresses_per_node_mean_over_bound_warm_pool"] < 0.6
    assert ratios["bound_pod_aware_bind_to_address_p99_over_bound_warm_pool"] <= 1.0
