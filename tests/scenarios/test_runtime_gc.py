"""S11, S13, S14, S15, S29 and seed 003: allocations whose sandbox is gone are found against the
runtime's own list (a real gRPC CRI server double) and released — never a live pod's.

What each scenario replays, and which tests prove it: docs/failure-scenarios.md."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from ipamd.errors import DeleteIntentActive, NoAddressAvailable
from ipamd.model import PodRef
from ipamd.reconcile.jobs import Job, Jobs
from ipamd.reconcile.leaks import LeakGc, release_invalid_attachments
from ipamd.runtime.cri import GrpcCriRuntime
from ipamd.runtime.ports import RuntimeUnavailable
from tests.support.cri_server import FakeCriServer
from tests.support.families import Family, open_node
from tests.support.node import NodeFixture, key

GRACE_S = 120.0


@pytest.fixture
async def cri() -> AsyncIterator[FakeCriServer]:
    async with FakeCriServer() as server:
        yield server


@pytest.fixture
async def runtime(cri: FakeCriServer) -> AsyncIterator[GrpcCriRuntime]:
    async with GrpcCriRuntime(cri.endpoint) as client:
        yield client


async def test_s11_restart_with_dead_sandboxes_releases_them_after_grace(
    node: NodeFixture, cri: FakeCriServer, runtime: GrpcCriRuntime, family: Family
) -> None:
    """On a node of either family."""
    engine = await open_node(node, family)
    for name in ("alive", "dead-1", "dead-2"):
        await engine.assign(key(name))
    cri.add("alive")  # only this sandbox survived the node's restart
    engine = await node.restart()
    gc = LeakGc(engine, runtime, GRACE_S, node.clock)
    assert await gc.run_once() == ()
    assert await gc.run_once() == (), "two misses, but younger than the grace period"
    node.clock.advance(GRACE_S)
    assert set(await gc.run_once()) == {"dead-1", "dead-2"}
    assert {k.container_id for k in engine.state.allocations()} == {"alive"}
    with pytest.raises(DeleteIntentActive):
        await engine.assign(key("dead-1"))  # released with a delete intent, like a DEL
    node.check()


async def test_s11_live_sandbox_kept_even_before_the_pod_is_published(
    node: NodeFixture, cri: FakeCriServer, runtime: GrpcCriRuntime
) -> None:
    engine = await node.open()
    await node.seed(enis=1, per_eni=2)
    await engine.assign(key("s1"), PodRef("", "", ""))  # no pod metadata known yet
    cri.add("s1", namespace="", name="", uid="")
    gc = LeakGc(engine, runtime, GRACE_S, node.clock)
    for _ in range(3):
        node.clock.advance(GRACE_S)
        assert await gc.run_once() == ()
    assert engine.state.allocations_of("s1")
    node.check()


async def test_s13_allocation_newer_than_the_snapshot_is_kept(
    node: NodeFixture, cri: FakeCriServer, runtime: GrpcCriRuntime
) -> None:
    engine = await node.open()
    await node.seed(enis=1, per_eni=4)
    gc = LeakGc(engine, runtime, 0.0, node.clock)
    cri.delay_s = 0.05  # the listing is slow; an ADD lands while it is in flight
    listing = asyncio.create_task(gc.run_once())
    await asyncio.sleep(0)
    await engine.assign(key("late"))  # its sandbox is not in the listing being taken
    assert await listing == ()
    cri.delay_s = 0.0
    assert await gc.run_once() == (), "one miss is not enough"
    assert engine.state.allocations_of("late")
    node.check()


async def test_s14_sandbox_not_yet_listed_survives_one_miss(
    node: NodeFixture, cri: FakeCriServer, runtime: GrpcCriRuntime
) -> None:
    engine = await node.open()
    await node.seed(enis=1, per_eni=4)
    await engine.assign(key("new"))
    cri.add("new")
    cri.hide("new", listings=1)  # the runtime lists it a moment after ADD returned
    gc = LeakGc(engine, runtime, 0.0, node.clock)
    assert await gc.run_once() == ()
    assert await gc.run_once() == ()
    assert await gc.run_once() == ()
    assert engine.state.allocations_of("new")
    node.check()


async def test_s14_unreachable_runtime_releases_nothing(
    node: NodeFixture, cri: FakeCriServer, runtime: GrpcCriRuntime
) -> None:
    engine = await node.open()
    await node.seed(enis=1, per_eni=4)
    await engine.assign(key("pod"))
    cri.unavailable = True
    gc = LeakGc(engine, runtime, 0.0, node.clock)
    for _ in range(4):
        with pytest.raises(RuntimeUnavailable):  # a failed round, counted as one by the schedule
            await gc.run_once()
    assert gc.unreachable == 4 and engine.state.allocations_of("pod")
    node.check()


async def test_s15_same_pod_name_new_sandbox(
    node: NodeFixture, cri: FakeCriServer, runtime: GrpcCriRuntime
) -> None:
    engine = await node.open()
    await node.seed(enis=1, per_eni=4)
    pod = PodRef("web", "frontend-0", "uid-1")
    old = await engine.assign(key("sandbox-old"), pod)
    new = await engine.assign(key("sandbox-new"), pod)  # the pod restarted: a new sandbox
    cri.add("sandbox-new", namespace="web", name="frontend-0", uid="uid-1")
    gc = LeakGc(engine, runtime, 0.0, node.clock)
    await gc.run_once()
    assert await gc.run_once() == ("sandbox-old",)
    assert engine.state.allocations() == {key("sandbox-new"): new}
    assert engine.state.owner_of(old.addresses[0]) is None
    node.check()


async def test_seed_003_full_node_of_long_gone_sandboxes_recovers_in_two_rounds(
    node: NodeFixture, cri: FakeCriServer, runtime: GrpcCriRuntime
) -> None:
    engine = await node.open()
    await node.seed(enis=2, per_eni=32)
    for i in range(64):
        await engine.assign(key(f"pod-{i}"))
    live = {f"pod-{i}" for i in range(0, 64, 5)}  # 13 pods still run; 51 DELs were missed
    for cid in live:
        cri.add(cid)
    with pytest.raises(NoAddressAvailable):
        await engine.assign(key("new-pod"))  # the node can start no pods
    live_addresses = {a for cid in live for a in engine.state.allocations()[key(cid)].addresses}
    node.clock.advance(GRACE_S)
    gc = LeakGc(engine, runtime, GRACE_S, node.clock)
    assert await gc.run_once() == ()
    released = await gc.run_once()
    assert len(released) == 51 and not set(released) & live
    assert {a for cid in live for a in engine.state.allocations()[key(cid)].addresses} == (
        live_addresses
    ), "no live pod's address is touched"
    node.clock.advance(engine.settings.cooldown_s)
    assert (await engine.assign(key("new-pod"))).addresses
    node.check()


async def test_s29_cni_gc_releases_only_what_is_absent_and_past_grace(node: NodeFixture) -> None:
    engine = await node.open()
    await node.seed(enis=1, per_eni=8)
    for name in ("a", "b", "c"):
        await engine.assign(key(name))
    await engine.assign(key("other-net", network="other"))
    node.clock.advance(GRACE_S)
    racing = await engine.assign(key("racing"))  # an ADD concurrent with the GC call
    valid = [("a", "eth0"), ("unknown", "eth0")]  # names an attachment ipamd never had
    released = await release_invalid_attachments(
        engine, "k8s-pod-network", valid, GRACE_S, node.clock
    )
    assert set(released) == {key("b"), key("c")}
    assert set(engine.state.allocations()) == {
        key("a"),
        key("racing"),
        key("other-net", network="other"),
    }
    assert engine.state.allocations()[key("racing")] == racing
    # An empty list: everything of the network past grace goes; a partial one spares what it names.
    assert await release_invalid_attachments(
        engine, "k8s-pod-network", [], GRACE_S, node.clock
    ) == (key("a"),)
    node.check()


async def test_s14_an_unreachable_runtime_is_a_failed_gc_round_not_an_ok_one(
    node: NodeFixture, cri: FakeCriServer, runtime: GrpcCriRuntime
) -> None:
    """The outcome the metrics and the alert of docs/operations.md read."""
    engine = await node.open()
    await node.seed(enis=1, per_eni=2)
    await engine.assign(key("pod"))
    gc = LeakGc(engine, runtime, 0.0, node.clock)
    jobs = Jobs()
    cri.unavailable = True
    assert await jobs.run_now(Job("leak_gc", gc.run_once, 60.0)) is False
    assert jobs.outcomes == {("leak_gc", "RuntimeUnavailable"): 1}
    assert jobs.fatal is None, "expected, not a crash"
    cri.unavailable = False
    assert await jobs.run_now(Job("leak_gc", gc.run_once, 60.0)) is True
    assert jobs.outcomes[("leak_gc", "ok")] == 1
    assert engine.state.allocations_of("pod")
