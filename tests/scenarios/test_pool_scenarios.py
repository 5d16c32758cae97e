"""S19-S22, S24, S25, S31, S32: the pool manager against the embedded EC2 — releases racing ADDs,
addresses coming back, a stale Describe, ENI GC beside a fresh ENI, throttling and errors, an
exhausted subnet, and the instance's limits. Interleavings come from gates (an EC2 call or a commit
held), faults from a seeded injector, time from the fake clock; every test ends with the shared
invariant check, which includes "what EC2 reports equals what ipamd believes".

What each scenario replays, and which tests prove it: docs/failure-scenarios.md."""

from __future__ import annotations

import asyncio
import ipaddress
import random
import threading
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from cloud.embedded.faults import FaultInjector
from cloud.embedded.world import EmbeddedEc2
from cloud.ports import (
    MANAGED_BY,
    TAG_CLUSTER_NAME,
    TAG_CREATED_AT,
    TAG_INSTANCE_ID,
    TAG_MANAGED_BY,
)
from datastore.records import AllocationRecord
from ipamd.clock import Clock
from ipamd.engine.allocator import EngineSettings
from ipamd.engine.engine import Engine
from ipamd.errors import MaxPodsReached, NoAddressAvailable, NodeFull
from ipamd.model import AddressState
from ipamd.policy.model import PoolTargets
from ipamd.policy.modes import PREFIXES, SECONDARY_IPS
from ipamd.reconcile.eni_gc import EniGc
from tests.support.cloudnode import CloudNode, open_cloud_node
from tests.support.ec2_doubles import (
    GatedEc2,
    LaggingEc2,
    check_mixed,
    ec2_units_of_both_kinds,
    retrying_on,
)
from tests.support.invariants import check_invariants
from tests.support.node import key
from tests.support.stores import FaultyStore

# Every pool in this module keeps its ENIs no longer than the test needs them.
EAGER = PoolTargets(min_eni_lifetime_s=0)


@pytest.fixture(scope="module")
def embedded() -> Iterator[EmbeddedEc2]:
    with EmbeddedEc2() as host:
        yield host


def _releasing(node: CloudNode) -> set[str]:
    return {c for c, u in node.engine.state.units().items() if u.state == "releasing"}


def _addresses(cidrs: set[str]) -> set[str]:
    return {str(a) for c in cidrs for a in ipaddress.ip_network(c)}


def _handed_out(allocations: list[AllocationRecord]) -> set[str]:
    return {a for alloc in allocations for a in alloc.addresses}


def _all_ec2_units(node: CloudNode) -> set[str]:
    return {c for units in node.ec2_units().values() for c in units}


async def _fill_then_empty(node: CloudNode, pods: int, tag: str) -> None:
    """Start `pods` pods (growing the pool as needed), then stop them all and let their addresses
    cool down: the pool now holds more than its targets, all of it free."""
    for i in range(pods):
        await node.settle()
        await node.engine.assign(key(f"{tag}-{i}"))
    await node.settle()
    for i in range(pods):
        await node.engine.release(key(f"{tag}-{i}"))
    node.clock.advance(node.engine.settings.cooldown_s + 1)


# -- S19 ---------------------------------------------------------------------------------------


async def test_s19_release_racing_allocate_never_hands_out_a_releasing_unit(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    targets = replace(EAGER, warm_ip_target=4)
    node = await open_cloud_node(embedded, tmp_path, targets=targets, api_wrapper=GatedEc2)
    gated = node.api
    assert isinstance(gated, GatedEc2)
    try:
        await _fill_then_empty(node, 4, "old")
        excess = set(node.pool.plan().release_units)
        assert len(excess) == 4, "8 free addresses, WARM_IP_TARGET=4: four go back"

        gate = gated.hold("unassign_units")
        shrink = asyncio.create_task(node.pool.run_once())
        await gated.wait_arrival("unassign_units")
        # The unassign is in flight: its units were marked first, and EC2 still lists them.
        assert _releasing(node) == excess
        assert excess <= _all_ec2_units(node)
        assert node.engine.snapshot().counts[AddressState.RELEASING] == 4

        served: list[AllocationRecord] = []
        refused = 0
        for i in range(6):
            try:
                served.append(await node.engine.assign(key(f"new-{i}")))
            except NoAddressAvailable:
                refused += 1
        assert (len(served), refused) == (4, 2), "the other free addresses, then no address"
        assert _handed_out(served).isdisjoint(_addresses(excess)), "a releasing unit handed out"

        gate.set()
        await shrink
        assert excess.isdisjoint(_all_ec2_units(node)), "gone from EC2"
        assert excess.isdisjoint(node.engine.state.units()), "and from ipamd"
        assert _releasing(node) == set()
        node.check()
    finally:
        await node.engine.close()


# -- S20 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix_mode", [False, True], ids=["ip", "prefix"])
async def test_s20_released_address_returned_by_ec2_is_allocatable_again(
    embedded: EmbeddedEc2, tmp_path: Path, prefix_mode: bool
) -> None:
    targets = replace(EAGER, warm_ip_target=1)
    node = await open_cloud_node(embedded, tmp_path, targets=targets, prefix_mode=prefix_mode)
    state = node.engine.state
    size = node.strategy.addresses_per_unit
    try:
        await _fill_then_empty(node, size, "old")  # two units, both free: one goes back
        await node.settle()
        assert len(state.released()) == 1
        released = next(iter(state.released().values()))
        cidr, eni_id = released.cidr, released.eni_id
        assert cidr not in node.ec2_units()[eni_id]
        assert cidr not in state.units()

        # EC2 hands the same unit to the same ENI again (another assign, another tool).
        client = node.world.client()
        if prefix_mode:
            client.assign_private_ip_addresses(NetworkInterfaceId=eni_id, Ipv4Prefixes=[cidr])
        else:
            host = cidr.removesuffix("/32")
            client.assign_private_ip_addresses(NetworkInterfaceId=eni_id, PrivateIpAddresses=[host])
        # Within the grace window EC2's listing of a unit ipamd just returned may be a lag, so
        # nothing adopts it yet; past the window the listing is news.
        assert await node.pool.adopt() == 0, "within the grace window: maybe a lagging listing"
        node.clock.advance(61.0)  # past the default 60 s grace
        assert await node.pool.adopt() == 1, "learned from EC2's own listing"
        assert state.units()[cidr].state == "active"
        assert cidr not in state.released()
        view = next(u for e in node.engine.snapshot().enis for u in e.units if u.cidr == cidr)
        assert {s for _, s in view.addresses} == {AddressState.FREE}

        served = [await node.engine.assign(key(f"new-{i}")) for i in range(2 * size)]
        assert _addresses({cidr}) <= _handed_out(served), "every address of it is allocatable"
        node.check()
    finally:
        await node.engine.close()


# -- S21 ---------------------------------------------------------------------------------------


async def _on_faulty_store(node: CloudNode) -> FaultyStore:
    """The node's parts reopened with the engine on a `FaultyStore` (a commit can be held at a
    gate)."""
    await node.engine.close()
    stores: list[FaultyStore] = []

    def opener(path: Path) -> FaultyStore:
        store = FaultyStore.open(path)
        assert isinstance(store, FaultyStore)
        stores.append(store)
        return store

    async def open_engine(path: Path, clock: Clock, settings: EngineSettings) -> Engine:
        return await Engine.open(path, clock, settings, store_opener=opener)

    await node.reopen(open_engine=open_engine)
    return stores[0]


async def test_s21_release_aborted_when_excess_becomes_need(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    targets = replace(EAGER, warm_ip_target=2)
    node = await open_cloud_node(embedded, tmp_path, targets=targets)
    store = await _on_faulty_store(node)
    state = node.engine.state
    try:
        await _fill_then_empty(node, 1, "old")  # three free addresses, two wanted
        free_before = {c for c, u in state.units().items() if u.state == "active"}
        assert len(free_before) == 3

        # An ADD decides and holds the engine's lock while its commit waits at the gate: the pool
        # plans from memory without it, and its marking must wait for the ADD to commit.
        gate = threading.Event()
        store.gate = gate
        store.entered.clear()
        add = asyncio.create_task(node.engine.assign(key("late")))
        assert await asyncio.to_thread(store.entered.wait, 10)
        planned = node.pool.plan().release_units
        assert len(planned) == 1
        shrink = asyncio.create_task(node.pool.run_once())
        for _ in range(5):
            await asyncio.sleep(0)
        assert not shrink.done(), "the pool's marking waits behind the ADD's commit"
        gate.set()
        allocation = await add
        await shrink
        store.gate = None

        (unit,) = planned
        assert allocation.unit_cidrs != (unit,), "the ADD took another free address"
        assert state.units()[unit].state == "active", "release aborted: needed again"
        assert _releasing(node) == set(), "nothing stuck releasing"
        assert unit in _all_ec2_units(node)
        assert node.calls.count("UnassignPrivateIpAddresses") == 0
        assert node.engine.snapshot().counts[AddressState.FREE] == 2
        node.check()
    finally:
        await node.engine.close()


# -- S22 ---------------------------------------------------------------------------------------


async def test_s22_stale_describe_after_assign_does_not_over_allocate(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    targets = replace(EAGER, warm_ip_target=3)
    node = await open_cloud_node(embedded, tmp_path, targets=targets, api_wrapper=LaggingEc2)
    lagging = node.api
    assert isinstance(lagging, LaggingEc2)
    limits = await node.ec2.instance_limits(node.world.instance_type)
    per_eni, max_enis = limits.units_per_eni, limits.max_enis
    instance_id = node.world.instance_id
    pods = 0
    stale_seen = 0
    try:
        for _ in range(16):
            for _ in range(2):
                try:
                    await node.engine.assign(key(f"pod-{pods}"))
                    pods += 1
                except (NoAddressAvailable, NodeFull):  # full: every address is a pod's
                    pass
            # Two ticks in a row, and between them the EC2 check reading the lagging Describe.
            await node.pool.run_once()
            view = await node.api.describe_enis(instance_id)
            held = {e.eni_id: len(e.secondary_ips) for e in view}
            ours = {e: len(u) for e, u in node.ipamd_units().items()}
            stale_seen += held != ours
            assert await node.pool.adopt() == 0, "a stale view adds nothing ipamd lacks"
            await node.pool.run_once()
            for eni_id, units in node.ec2_units().items():
                assert len(units) <= per_eni, f"{eni_id} over its limit"
            assert len(node.ec2_units()) <= max_enis
            node.check()
        assert lagging.stale_answers > 0 and stale_seen > 0, "the lag was exercised"
        assert pods == max_enis * per_eni, "the node filled up to its limits"
        for code in ("PrivateIpAddressLimitExceeded", "AttachmentLimitExceeded"):
            assert node.calls.count(outcome=code) == 0
        assert node.calls.count("UnassignPrivateIpAddresses") == 0, "no new unit released"
        assert node.calls.count("DetachNetworkInterface") == 0
        node.check()
    finally:
        await node.engine.close()


# -- S24 ---------------------------------------------------------------------------------------


def _created_at(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _leftover_eni(
    client: Any, subnet_id: str, instance_id: str, created_at: str, cluster: str = ""
) -> str:
    tags = {TAG_INSTANCE_ID: instance_id, TAG_MANAGED_BY: MANAGED_BY, TAG_CREATED_AT: created_at}
    if cluster:
        tags[TAG_CLUSTER_NAME] = cluster
    answer = client.create_network_interface(
        SubnetId=subnet_id,
        TagSpecifications=[
            {
                "ResourceType": "network-interface",
                "Tags": [{"Key": k, "Value": v} for k, v in tags.items()],
            }
        ],
    )
    return str(answer["NetworkInterface"]["NetworkInterfaceId"])


def _eni_status(client: Any) -> dict[str, str]:
    answer = client.describe_network_interfaces()
    return {e["NetworkInterfaceId"]: e["Status"] for e in answer["NetworkInterfaces"]}


async def test_s24_eni_gc_spares_an_eni_being_attached(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    # t3.small: 3 addresses per ENI, so 5 warm addresses need a second ENI.
    targets = replace(EAGER, warm_ip_target=5)
    node = await open_cloud_node(
        embedded, tmp_path, "t3.small", targets=targets, api_wrapper=GatedEc2
    )
    gated = node.api
    assert isinstance(gated, GatedEc2)
    client = node.world.client()
    instance_id = node.world.instance_id

    def spared() -> set[str]:  # as the daemon wires it
        return node.pool.pending_enis | set(node.engine.state.enis())

    try:
        gate = gated.hold("attach_eni")
        grow = asyncio.create_task(node.pool.run_once())
        await gated.wait_arrival("attach_eni")
        (fresh,) = node.pool.pending_enis
        assert _eni_status(client)[fresh] == "available", "created, not attached yet"
        node.clock.advance(3600)
        gc = EniGc(node.api, instance_id, 0.0, node.clock, spared)
        assert await gc.run_once() == ()
        assert fresh in _eni_status(client), "not deleted while being attached"
        gate.set()
        await grow
        assert _eni_status(client)[fresh] == "in-use"
        assert fresh in node.engine.state.enis() and fresh in node.ec2_units()
        assert node.pool.pending_enis == set()
        node.check()

        # Leftovers: ours and old, ours and fresh, and another instance's.
        now = node.clock.now()
        subnet = node.world.subnet_id
        old = _leftover_eni(client, subnet, instance_id, _created_at(now - 3600))
        young = _leftover_eni(client, subnet, instance_id, _created_at(now))
        foreign = _leftover_eni(client, subnet, "i-0123456789abcdef0", _created_at(now - 3600))
        gc = EniGc(node.api, instance_id, 600.0, node.clock, spared)
        assert await gc.run_once() == (old,)
        assert {young, foreign, fresh} <= set(_eni_status(client))
        assert old not in _eni_status(client)
        node.clock.advance(601)
        assert await gc.run_once() == (young,), "once past the grace window"
        assert _eni_status(client)[foreign] == "available", "never another instance's"
        assert _eni_status(client)[fresh] == "in-use"
        node.check()
    finally:
        await node.engine.close()


async def test_eni_gc_with_a_cluster_name_sweeps_what_terminated_nodes_left(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    """A node terminated between create and attach never sweeps its own leftovers again: with a
    cluster name, any node of the cluster deletes them once old enough (as VPC CNI's sweep does);
    another cluster's, and anything attached, are never touched."""
    targets = replace(EAGER, warm_ip_target=5)  # t3.small: a second ENI
    node = await open_cloud_node(embedded, tmp_path, "t3.small", targets=targets)
    client = node.world.client()
    subnet, now = node.world.subnet_id, node.clock.now()
    old = _created_at(now - 3600)
    try:
        await node.settle()
        dead_node = _leftover_eni(client, subnet, "i-0dead00000000000a", old, cluster="prod")
        fresh = _leftover_eni(client, subnet, "i-0dead00000000000b", _created_at(now), "prod")
        other_cluster = _leftover_eni(client, subnet, "i-0dead00000000000c", old, cluster="dev")
        attached = set(node.engine.state.enis())
        ours = await node.api.find_enis({TAG_MANAGED_BY: MANAGED_BY})
        detached = await node.api.find_enis({TAG_MANAGED_BY: MANAGED_BY}, available_only=True)
        assert {e.status for e in ours} == {"in-use", "available"}, "the pool attached one"
        assert {e.status for e in detached} == {"available"}, "EC2 filters by status"

        def spared() -> set[str]:
            return node.pool.pending_enis | set(node.engine.state.enis())

        gc = EniGc(node.api, node.world.instance_id, 600.0, node.clock, spared, "prod")
        assert await gc.run_once() == (dead_node,)
        left = _eni_status(client)
        assert dead_node not in left
        assert left[fresh] == "available" and left[other_cluster] == "available"
        assert attached <= set(left), "attached ENIs untouched"

        scoped = EniGc(node.api, node.world.instance_id, 0.0, node.clock, spared)
        assert await scoped.run_once() == (), "without a cluster name: this instance's only"
        node.check()
    finally:
        await node.engine.close()


# -- S25 ---------------------------------------------------------------------------------------

# Partial failures (EC2 acts, the caller sees a timeout) on every call type but the unassign, whose
# handling is the subject of its own test below.
PARTIAL_FAILURES = (
    "AssignPrivateIpAddresses",
    "CreateNetworkInterface",
    "AttachNetworkInterface",
    "ModifyNetworkInterfaceAttribute",
    "DetachNetworkInterface",
    "DeleteNetworkInterface",
    "DescribeNetworkInterfaces",
)


def _inject_churn_faults(faults: FaultInjector) -> None:
    faults.throttle(rate=0.3)
    faults.server_error(code="Unavailable", rate=0.05)
    faults.server_error(code="InternalError", rate=0.03)
    faults.timeout(rate=0.03)
    faults.partial_failure(*PARTIAL_FAILURES, rate=0.1)


async def test_s25_throttling_and_errors_during_churn(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    faults = FaultInjector(seed=25)
    targets = replace(EAGER, warm_ip_target=3, minimum_ip_target=4)
    node = await open_cloud_node(
        embedded, tmp_path, "m5.large", targets=targets, api_wrapper=retrying_on(faults)
    )
    rng = random.Random(2025)
    live: list[str] = []
    served = refused = 0
    try:
        await node.settle()
        _inject_churn_faults(faults)
        for step in range(200):
            # Waves: pods come (ENIs attach), then go (ENIs detach and are deleted).
            leaving = 0.3 if (step // 50) % 2 == 0 else 0.75
            if live and rng.random() < leaving:
                await node.engine.release(key(live.pop(rng.randrange(len(live)))))
            else:
                free = node.engine.snapshot().counts[AddressState.FREE]
                try:
                    await node.engine.assign(key(f"pod-{step}"))
                    live.append(f"pod-{step}")
                    served += 1
                except NoAddressAvailable:
                    assert free == 0, f"step {step}: {free} free addresses, yet refused"
                    refused += 1
            node.clock.advance(rng.uniform(0, 5))
            await node.pool.run_once()
            # EC2 and ipamd may disagree mid-churn (a partial failure); ipamd's own state may not.
            check_invariants(node.engine, node.path, node.clock.now())
        injected = faults.injected
        assert {"throttle", "server_error", "timeout", "partial_failure"} <= set(injected)
        assert node.calls.count(outcome="RequestLimitExceeded") > 0
        assert node.calls.retries > 0
        assert node.pool.health.failures > 0
        assert {
            "AssignPrivateIpAddresses",
            "UnassignPrivateIpAddresses",
            "CreateNetworkInterface",
            "AttachNetworkInterface",
            "DetachNetworkInterface",
            "DeleteNetworkInterface",
        } <= node.calls.operations(), "every call type went through the faults"
        assert served > refused, "ADDs are served from the warm pool"

        faults.clear()
        node.clock.advance(120)  # past any backoff and cooldown, and the grace window
        # A partial failure of an assign or attach leaves units (or an ENI) on EC2 that ipamd
        # never heard of, and a release of unknown outcome leaves units releasing: the EC2 drift
        # settles both, as in the daemon.
        await node.drift.run_once()
        await node.settle()
        assert _releasing(node) == set(), "nothing stuck releasing"
        node.check()
    finally:
        await node.engine.close()


# -- S31 ---------------------------------------------------------------------------------------


def _allocations(node: CloudNode) -> dict[Any, AllocationRecord]:
    return dict(node.engine.state.allocations())


def _on_ec2(node: CloudNode, allocations: dict[Any, AllocationRecord]) -> bool:
    held = {c for units in ec2_units_of_both_kinds(node).values() for c in units}
    return all(set(a.unit_cidrs) <= held for a in allocations.values())


async def test_s31_subnet_exhausted_pauses_growth_and_spares_existing_pods(
    embedded: EmbeddedEc2, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A /28: 11 usable addresses, the instance's primary holds one; one ENI can take all ten.
    targets = replace(EAGER, warm_ip_target=4)
    node = await open_cloud_node(
        embedded, tmp_path, "c5.18xlarge", targets=targets, subnet_cidr="10.0.0.0/28"
    )
    health = node.pool.health
    try:
        for i in range(6):
            await node.settle()
            await node.engine.assign(key(f"pod-{i}"))
        await node.settle()
        assert sum(len(u) for u in node.ec2_units().values()) == 10, "the subnet is full"
        await node.engine.assign(key("pod-6"))
        pods = _allocations(node)
        asked = node.calls.count("AssignPrivateIpAddresses")

        now = node.clock.now()
        await node.pool.run_once()
        assert node.calls.count("AssignPrivateIpAddresses") == asked + 1
        assert health.errors_by_code == {"InsufficientFreeAddressesInSubnet": 1}
        assert health.subnet_exhausted_until == now + 120.0
        assert health.backoff_until > now
        assert any("pool.subnet_exhausted" in r.getMessage() for r in caplog.records)
        assert _allocations(node) == pods and _on_ec2(node, pods), "existing pods untouched"

        # Past the backoff, within the cooldown: no growth is attempted.
        for _ in range(10):
            node.clock.advance(10)
            assert (await node.pool.run_once()).is_empty()
        assert node.calls.count("AssignPrivateIpAddresses") == asked + 1
        assert node.pool.plan().assign, "the pool is still short"

        node.clock.advance(health.subnet_exhausted_until - node.clock.now() + 1)
        await node.pool.run_once()
        assert node.calls.count("AssignPrivateIpAddresses") == asked + 2, "tried again after it"
        assert health.errors_by_code == {"InsufficientFreeAddressesInSubnet": 2}
        assert _allocations(node) == pods and _on_ec2(node, pods)
        node.check()
    finally:
        await node.engine.close()


async def test_s31_subnet_exhausted_backs_off_and_falls_back_in_prefix_mode(
    embedded: EmbeddedEc2, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A /27 has free addresses but no /28 free of reserved ones: no prefix can be delegated.
    node = await open_cloud_node(
        embedded, tmp_path, prefix_mode=True, subnet_cidr="10.0.0.0/27", fallback=True
    )
    health = node.pool.health
    state = node.engine.state
    try:
        now = node.clock.now()
        await node.pool.run_once()
        assert health.errors_by_code == {"InsufficientCidrBlocks": 1}
        assert health.subnet_exhausted_until == now + 120.0
        assert health.backoff_until > now
        assert any("pool.subnet_exhausted" in r.getMessage() for r in caplog.records)
        assert state.units() == {}

        node.clock.advance(health.backoff_until - now + 0.01)
        assert node.pool.strategy is SECONDARY_IPS, "falling back while the subnet is exhausted"
        await node.settle()
        assert state.units() and {u.kind for u in state.units().values()} == {"ip"}
        pods = [await node.engine.assign(key(f"pod-{i}")) for i in range(3)]
        assert all(a.unit_cidrs[0].endswith("/32") for a in pods)
        before = _allocations(node)

        # No prefix is asked for again until the cooldown has passed.
        while node.clock.now() + 10 < health.subnet_exhausted_until:
            node.clock.advance(10)
            await node.pool.run_once()
        assert health.errors_by_code == {"InsufficientCidrBlocks": 1}
        node.clock.advance(health.subnet_exhausted_until - node.clock.now() + 1)
        assert node.pool.strategy is PREFIXES
        await node.pool.run_once()
        assert health.errors_by_code == {"InsufficientCidrBlocks": 2}, "tried prefixes again"
        assert _allocations(node) == before and _on_ec2(node, before), "existing pods untouched"
        assert _releasing(node) == set()
        check_mixed(node)
    finally:
        await node.engine.close()


# -- S32 ---------------------------------------------------------------------------------------


async def test_s32_limits_no_call_ec2_would_reject_and_max_pods_is_clear(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    # t3.small: 3 ENIs of 4 IPv4 addresses, the primary one included: 9 pod addresses.
    node = await open_cloud_node(embedded, tmp_path, "t3.small")
    served: list[AllocationRecord] = []
    try:
        error: Exception | None = None
        for i in range(20):
            await node.settle()
            try:
                served.append(await node.engine.assign(key(f"pod-{i}")))
            except (NoAddressAvailable, MaxPodsReached, NodeFull) as err:
                error = err
                break
        for _ in range(3):  # the refused ADD woke the pool: it has nothing it may ask for
            node.clock.advance(60)
            assert (await node.pool.run_once()).is_empty()
        assert len(served) == 9
        # Max pods is 3 x 3 + 2 = 11, the 2 being host-network pods that never ask ipamd: the
        # addresses run out first, so the 10th ADD is refused as "node full" (every address the
        # node can hold is a pod's: only a DEL frees one, waiting does not), never as max pods.
        assert node.engine.settings.max_pods == 11
        assert node.engine.settings.max_addresses == 9
        assert isinstance(error, NodeFull)
        assert (error.code, error.status, error.retryable) == ("node_full", 503, False)
        assert "9 of the 9 addresses" in str(error)
        enis = node.ec2_units()
        assert len(enis) == 3 and all(len(units) == 3 for units in enis.values())
        for code in ("PrivateIpAddressLimitExceeded", "AttachmentLimitExceeded"):
            assert node.calls.count(outcome=code) == 0
        assert node.calls.errors() == 0, "no call EC2 rejected"
        node.check()
    finally:
        await node.engine.close()


async def test_s32_add_past_a_max_pods_override_fails_with_max_pods_reached(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    targets = replace(EAGER, max_pods=5)
    node = await open_cloud_node(embedded, tmp_path, targets=targets)
    try:
        for i in range(5):
            await node.settle()
            await node.engine.assign(key(f"pod-{i}"))
        await node.settle()
        assert sum(len(u) for u in node.ec2_units().values()) == 5, "growth stops at max pods"
        with pytest.raises(MaxPodsReached) as refused:
            await node.engine.assign(key("pod-5"))
        assert (refused.value.code, refused.value.retryable) == ("max_pods", False)
        assert "5" in str(refused.value) and "max pods" in str(refused.value)
        node.check()
    finally:
        await node.engine.close()


# -- failures whose outcome EC2 alone can tell -----------------------------------------


async def _faulty_node(
    embedded: EmbeddedEc2, tmp_path: Path, instance_type: str, targets: PoolTargets
) -> tuple[CloudNode, FaultInjector]:
    faults = FaultInjector(seed=1)
    node = await open_cloud_node(
        embedded, tmp_path, instance_type, targets=targets, api_wrapper=retrying_on(faults)
    )
    return node, faults


async def _rounds(node: CloudNode, count: int = 5) -> None:
    """Pool ticks far enough apart that no backoff skips one."""
    for _ in range(count):
        node.clock.advance(61)
        await node.pool.run_once()


async def test_s25_unassign_applied_but_answered_with_an_error_hands_out_none_of_its_units(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    node, faults = await _faulty_node(
        embedded, tmp_path, "m5.large", replace(EAGER, warm_ip_target=2)
    )
    try:
        await _fill_then_empty(node, 3, "old")
        excess = set(node.pool.plan().release_units)
        assert len(excess) == 3
        faults.partial_failure("UnassignPrivateIpAddresses", times=1)
        await node.pool.run_once()
        assert excess.isdisjoint(_all_ec2_units(node)), "EC2 did unassign them"
        served: list[AllocationRecord] = []
        with pytest.raises(NoAddressAvailable):
            for i in range(10):
                served.append(await node.engine.assign(key(f"new-{i}")))
        assert _handed_out(served).isdisjoint(_addresses(excess)), "gone from EC2, handed out"
        await _rounds(node)
        assert _releasing(node) == set()
        node.check()
    finally:
        await node.engine.close()


async def test_s25_attach_applied_but_answered_with_an_error_does_not_stall_growth(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    node, faults = await _faulty_node(
        embedded, tmp_path, "t3.small", replace(EAGER, warm_ip_target=5)
    )
    try:
        faults.partial_failure("AttachNetworkInterface", times=1)
        await node.pool.run_once()
        await _rounds(node)
        assert node.engine.snapshot().counts[AddressState.FREE] >= 5, "the pool reached its target"
        assert node.pool.health.consecutive_failures == 0
        node.check()
    finally:
        await node.engine.close()


async def test_s21_describe_failing_mid_eni_release_leaves_nothing_releasing(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    node, faults = await _faulty_node(
        embedded, tmp_path, "t3.small", replace(EAGER, warm_ip_target=1)
    )
    try:
        await _fill_then_empty(node, 4, "old")
        assert node.pool.plan().release_enis, "a whole ENI goes back"
        faults.throttle("DescribeNetworkInterfaces")
        await node.pool.run_once()
        assert node.pool.health.errors_by_code == {"RequestLimitExceeded": 1}
        assert _releasing(node) == set(), "a failed Describe changes no state"
        faults.clear()
        await _rounds(node)
        assert node.pool.plan().is_empty()
        node.check()
    finally:
        await node.engine.close()


async def test_s21_unassign_failing_on_one_eni_leaves_nothing_releasing_on_the_others(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    # ENIs young enough to be kept: the excess goes back unit by unit, from both ENIs.
    node, faults = await _faulty_node(
        embedded, tmp_path, "t3.small", PoolTargets(warm_ip_target=1, min_eni_lifetime_s=3600)
    )
    try:
        await _fill_then_empty(node, 5, "old")
        plan = node.pool.plan()
        owners = {node.engine.state.units()[c].eni_id for c in plan.release_units}
        assert len(owners) == 2 and not plan.release_enis
        faults.server_error("UnassignPrivateIpAddresses", times=1)
        await node.pool.run_once()
        assert node.pool.health.errors_by_code == {"InternalError": 1}
        # A 5xx may come after EC2 acted: the failed ENI's units, still listed, stay releasing
        # (never handed out); the other ENI's release went through.
        failed = _releasing(node)
        assert failed and failed < set(plan.release_units)
        assert len({node.engine.state.units()[c].eni_id for c in failed}) == 1, "one ENI's units"
        assert failed <= _all_ec2_units(node)
        assert set(plan.release_units) - failed == set(node.engine.state.released())
        # Not stuck: past the grace window the drift settles it from EC2's listing.
        node.clock.advance(61.0)
        report = await node.drift.run_once()
        assert set(report.settled_kept) == failed
        assert _releasing(node) == set(), "nothing stuck releasing"
        node.check()
    finally:
        await node.engine.close()


async def test_s32_add_at_full_capacity_does_not_claim_the_pool_is_growing(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    node = await open_cloud_node(embedded, tmp_path, "t3.small")
    try:
        for i in range(9):
            await node.settle()
            await node.engine.assign(key(f"pod-{i}"))
        await node.settle()
        with pytest.raises(NodeFull) as refused:
            await node.engine.assign(key("pod-9"))
        assert "growing" not in str(refused.value)
        node.check()
    finally:
        await node.engine.close()


@pytest.mark.parametrize("direction", ["grow", "shrink"])
async def test_pool_tick_on_a_failing_disk_backs_off_and_the_drift_catches_up(
    embedded: EmbeddedEc2, tmp_path: Path, direction: str
) -> None:
    """A full state disk during pool work (the chaos runner found the daemon exiting on it): the tick
    fails like a failed EC2 call, with backoff, memory unchanged; what EC2 did meanwhile the drift
    reconciles once the disk takes writes again."""
    targets = replace(EAGER, warm_ip_target=2)
    node = await open_cloud_node(embedded, tmp_path, targets=targets)
    store = await _on_faulty_store(node)
    try:
        if direction == "shrink":
            await _fill_then_empty(node, 3, "old")  # one free address more than wanted
        plan = node.pool.plan()
        assert plan.assign if direction == "grow" else plan.release_units
        before = node.engine.state.to_image()
        store.fail_next("read_only")
        await node.pool.run_once()  # raises nothing: the daemon's pool loop keeps going
        assert not store.faults, "the tick's first commit met the failing disk"
        assert node.pool.health.errors_by_code == {"store_write_failed": 1}
        assert node.pool.health.backoff_until >= node.clock.now()
        assert node.engine.state.to_image() == before, "nothing half-applied in memory"

        node.clock.advance(61.0)  # past the backoff and the grace window
        await node.drift.run_once()
        await node.settle()
        node.check()  # EC2's view and ipamd's agree again
    finally:
        await node.engine.close()


async def test_s25_throttled_attach_reuses_the_created_eni_instead_of_creating_another(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    """Under an exhausted mutating budget, an ENI whose attach was throttled is the one attached on
    the next tick: one CreateNetworkInterface, not one per tick (the cluster simulator showed
    creates running far ahead of attaches)."""
    node, faults = await _faulty_node(
        embedded, tmp_path, "t3.small", replace(EAGER, warm_ip_target=5)
    )
    try:
        faults.throttle("AttachNetworkInterface")
        for _ in range(3):
            node.clock.advance(120)  # past any backoff
            await node.pool.run_once()
        assert node.pool.health.errors_by_code == {"RequestLimitExceeded": 3}
        assert node.calls.count("CreateNetworkInterface") == 1, "one ENI created, kept for retry"
        (kept,) = node.pool.pending_enis
        faults.clear()
        await _rounds(node)
        assert kept in node.engine.state.enis(), "the kept ENI is the one attached"
        assert node.calls.count("CreateNetworkInterface") == 1
        assert node.engine.snapshot().counts[AddressState.FREE] >= 5
        assert not node.pool.pending_enis
        node.check()
    finally:
        await node.engine.close()


async def test_an_eni_kept_for_another_attach_is_deleted_once_no_longer_wanted(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    node, faults = await _faulty_node(
        embedded, tmp_path, "t3.small", replace(EAGER, warm_ip_target=5)
    )
    try:
        faults.throttle("AttachNetworkInterface")
        await node.pool.run_once()
        (kept,) = node.pool.pending_enis
        faults.clear()
        node.pool._settings = replace(node.pool._settings, targets=replace(EAGER, warm_ip_target=1))
        node.clock.advance(120)
        assert not (await node.pool.run_once()).new_enis, "no ENI wanted any more"
        assert not node.pool.pending_enis
        client = node.world.client()
        gone = client.describe_network_interfaces(
            Filters=[{"Name": "network-interface-id", "Values": [kept]}]
        )["NetworkInterfaces"]
        assert gone == [], "deleted, not left for ENI GC"
        node.check()
    finally:
        await node.engine.close()
