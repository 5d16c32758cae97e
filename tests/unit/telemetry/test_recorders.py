"""What `Recorders` notes as events happen: EC2 attempts with VPC CNI's labels, ADD and DEL requests
through the API's middleware, start-up, and addresses EC2 takes away from pods (engine commits)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from ipamd.api import create_app
from ipamd.clock import FakeClock
from ipamd.engine.engine import Engine
from ipamd.errors import DatapathUnavailable, MaxPodsReached, NoAddressAvailable
from ipamd.telemetry.endpoint import latency_middleware
from ipamd.telemetry.metrics import Recorders
from tests.support.node import NodeFixture, key


def latency_samples(recorders: Recorders) -> dict[tuple[str, tuple[str, ...]], float]:
    [family] = recorders.ec2_latency.collect()
    return {
        (s.name, tuple(s.labels[k] for k in ("api", "error", "status"))): s.value
        for s in family.samples
        if not s.name.endswith("_created")
    }


def test_ec2_attempts_are_counted_and_timed_with_vpc_cni_labels() -> None:
    recorders = Recorders()
    recorders.record("AssignPrivateIpAddresses", "ok", 0.25, 1)
    recorders.record("AssignPrivateIpAddresses", "RequestLimitExceeded", 0.5, 1)
    recorders.record("AssignPrivateIpAddresses", "ok", 0.125, 2)
    assert recorders.ec2_attempts == {
        ("AssignPrivateIpAddresses", "ok"): 2,
        ("AssignPrivateIpAddresses", "RequestLimitExceeded"): 1,
    }
    assert recorders.ec2_retries == {"AssignPrivateIpAddresses": 1}
    samples = latency_samples(recorders)
    ok = ("AssignPrivateIpAddresses", "false", "200")
    failed = ("AssignPrivateIpAddresses", "true", "")
    assert samples[("awscni_aws_api_latency_ms_count", ok)] == 2
    assert samples[("awscni_aws_api_latency_ms_sum", ok)] == 375.0, "milliseconds"
    assert samples[("awscni_aws_api_latency_ms_count", failed)] == 1


def test_an_add_refused_for_want_of_an_address_is_counted() -> None:
    recorders = Recorders()
    recorders.add_done(0.01, None)
    recorders.add_done(0.01, NoAddressAvailable("empty"))
    recorders.add_done(0.01, MaxPodsReached("full"))
    recorders.add_done(0.01, DatapathUnavailable("no link"))
    assert (recorders.add_requests, recorders.no_address) == (4, 2)


def test_start_up_is_observed_with_its_outcome() -> None:
    recorders = Recorders()
    recorders.started(False, 2.0, 0.5)
    [startup] = recorders.startup.collect()
    [count] = [s for s in startup.samples if s.name.endswith("_count")]
    assert count.value == 1
    assert count.labels == {
        "success": "false",
        "with_api_server": "false",
        "failure_reason": "state_unavailable",
    }


@pytest.fixture
async def served(node: NodeFixture, clock: FakeClock) -> AsyncIterator[tuple[Recorders, str]]:
    engine = await node.open()
    recorders = Recorders()
    app = create_app(engine, ready=lambda: True, gc_grace_s=60.0, clock=clock)
    app.middlewares.append(latency_middleware(recorders))
    server = TestServer(app)
    await server.start_server()
    try:
        yield recorders, str(server.make_url(""))
    finally:
        await server.close()


async def test_the_middleware_counts_every_add_and_del(
    served: tuple[Recorders, str], node: NodeFixture
) -> None:
    recorders, url = served
    body = {"container_id": "c1", "ifname": "eth0", "network": "k8s-pod-network"}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/allocations", json=body) as empty:
            assert empty.status == 503 and (await empty.json())["code"] == "no_address"
        await node.seed()
        async with session.post(f"{url}/v1/allocations", json=body) as added:
            assert added.status == 200
        delete = f"{url}/v1/allocations/c1/eth0?network=k8s-pod-network"
        async with session.delete(delete) as deleted:
            assert deleted.status == 200
        async with session.get(f"{url}/v1/pool") as other:
            assert other.status == 200
    assert (recorders.add_requests, recorders.no_address) == (2, 1)
    assert recorders.del_requests == {"PodDeleted": 1}
    [family] = recorders.add_latency.collect()
    [adds] = [s for s in family.samples if s.name.endswith("_count")]
    assert adds.value == 2, "every ADD answered is timed"


async def watched(node: NodeFixture) -> tuple[Engine, Recorders]:
    engine = node.engine or await node.open()
    recorders = Recorders()
    engine.subscribe(lambda m, _: recorders.note_commit(engine.state, m))
    return engine, recorders


async def test_units_ec2_takes_from_pods_are_force_removed_ips(node: NodeFixture) -> None:
    [cidrs] = await node.seed(enis=1, per_eni=3)
    engine, recorders = await watched(node)
    record = await engine.assign(key("a"))
    free = [c for c in cidrs if c not in record.unit_cidrs]
    await engine.units_gone([*record.unit_cidrs, free[0]])
    assert (recorders.force_removed_ips, recorders.force_removed_enis) == (1, 0)
    await engine.units_gone(record.unit_cidrs)  # already lost: not taken twice
    assert recorders.force_removed_ips == 1


async def test_an_eni_ec2_takes_from_its_pods_is_a_force_removed_eni(node: NodeFixture) -> None:
    await node.seed(enis=2, per_eni=1)
    engine, recorders = await watched(node)
    records = [await engine.assign(key(c)) for c in ("a", "b")]
    assert {r.eni_id for r in records} == {"eni-0000", "eni-0001"}, "one pod on each ENI"
    await engine.eni_gone("eni-0001")
    assert (recorders.force_removed_enis, recorders.force_removed_ips) == (1, 1)
    await engine.eni_gone("eni-0001")  # nothing more to take
    assert (recorders.force_removed_enis, recorders.force_removed_ips) == (1, 1)
