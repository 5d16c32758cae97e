"""S19-S22: the pool manager against the embedded EC2 while releases race ADDs — a releasing unit never
handed out, returned addresses allocatable again, a release aborted when excess becomes need, a stale
Describe after an assign, and releases cut short by failures.

Every test ends with the shared invariant check, which includes "what EC2 reports equals what ipamd
believes". What each scenario replays, and which tests prove it: docs/failure-scenarios.md."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from cloud.embedded.faults import FaultInjector
from cloud.embedded.world import EmbeddedEc2
from datastore.records import AllocationRecord
from ipamd.errors import NoAddressAvailable, NodeFull
from ipamd.model import AddressState
from ipamd.node.cloud_node import open_cloud_node
from ipamd.sizing.inputs import PoolTargets
from tests.scenarios.pool_support import (
    EAGER,
    NO_RELEASE_DELAY,
    addresses,
    all_ec2_units,
    faulty_node,
    fill_then_empty,
    handed_out,
    on_faulty_store,
    releasing,
    rounds,
)
from tests.support.ec2_doubles import (
    GatedEc2,
    LaggingEc2,
)
from tests.support.node import key

# -- S19 ---------------------------------------------------------------------------------------


async def test_s19_release_racing_allocate_never_hands_out_a_releasing_unit(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    targets = replace(EAGER, warm_ip_target=4)
    async with open_cloud_node(
        embedded, tmp_path, targets=targets, api_wrapper=GatedEc2, settings=NO_RELEASE_DELAY
    ) as node:
        gated = node.api
        assert isinstance(gated, GatedEc2)
        await fill_then_empty(node, 4, "old")
        excess = set(node.pool.plan().release_units)
        assert len(excess) == 4, "8 free addresses, WARM_IP_TARGET=4: four go back"

        gate = gated.hold("unassign_units")
        shrink = asyncio.create_task(node.pool.run_once())
        await gated.wait_arrival("unassign_units")
        # The unassign is in flight: its units were marked first, and EC2 still lists them.
        assert releasing(node) == excess
        assert excess <= all_ec2_units(node)
        assert node.engine.snapshot().counts[AddressState.RELEASING] == 4

        served: list[AllocationRecord] = []
        refused = 0
        for i in range(6):
            try:
                served.append(await node.engine.assign(key(f"new-{i}")))
            except NoAddressAvailable:
                refused += 1
        assert (len(served), refused) == (4, 2), "the other free addresses, then no address"
        assert handed_out(served).isdisjoint(addresses(excess)), "a releasing unit handed out"

        gate.set()
        await shrink
        assert excess.isdisjoint(all_ec2_units(node)), "gone from EC2"
        assert excess.isdisjoint(node.engine.state.units()), "and from ipamd"
        assert releasing(node) == set()
        node.check()


# -- S20 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix_mode", [False, True], ids=["ip", "prefix"])
async def test_s20_released_address_returned_by_ec2_is_allocatable_again(
    embedded: EmbeddedEc2, tmp_path: Path, prefix_mode: bool
) -> None:
    targets = replace(EAGER, warm_ip_target=1)
    async with open_cloud_node(
        embedded, tmp_path, targets=targets, prefix_mode=prefix_mode, settings=NO_RELEASE_DELAY
    ) as node:
        state = node.engine.state
        size = node.strategy.addresses_per_unit
        await fill_then_empty(node, size, "old")  # two units, both free: one goes back
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
        assert addresses({cidr}) <= handed_out(served), "every address of it is allocatable"
        node.check()


# -- S21 ---------------------------------------------------------------------------------------


async def test_s21_release_aborted_when_excess_becomes_need(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    targets = replace(EAGER, warm_ip_target=2)
    # The addresses EC2 draws decide which free unit the ADD takes (the fullest, then the lowest
    # CIDR) and which the plan gives back; with this seed's draws they differ, the case at issue.
    async with open_cloud_node(
        embedded, tmp_path, targets=targets, seed=10, settings=NO_RELEASE_DELAY
    ) as node:
        store = await on_faulty_store(node, inline_writes=False)
        state = node.engine.state
        await fill_then_empty(node, 1, "old")  # three free addresses, two wanted
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
        assert releasing(node) == set(), "nothing stuck releasing"
        assert unit in all_ec2_units(node)
        assert node.calls.count("UnassignPrivateIpAddresses") == 0
        assert node.engine.snapshot().counts[AddressState.FREE] == 2
        node.check()


# -- S22 ---------------------------------------------------------------------------------------


async def test_s22_stale_describe_after_assign_does_not_over_allocate(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    targets = replace(EAGER, warm_ip_target=3)
    async with open_cloud_node(embedded, tmp_path, targets=targets, api_wrapper=LaggingEc2) as node:
        lagging = node.api
        assert isinstance(lagging, LaggingEc2)
        limits = await node.ec2.instance_limits(node.world.instance_type)
        per_eni, max_enis = limits.units_per_eni, limits.max_enis
        instance_id = node.world.instance_id
        pods = 0
        stale_seen = 0
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


async def test_s21_describe_failing_mid_eni_release_leaves_nothing_releasing(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    faults = FaultInjector(seed=1)
    async with faulty_node(
        embedded, tmp_path, "t3.small", replace(EAGER, warm_ip_target=1), faults
    ) as node:
        await fill_then_empty(node, 4, "old")
        assert node.pool.plan().release_enis, "a whole ENI goes back"
        faults.throttle("DescribeNetworkInterfaces")
        await node.pool.run_once()
        assert node.pool.health.errors_by_code == {"RequestLimitExceeded": 1}
        assert releasing(node) == set(), "a failed Describe changes no state"
        faults.clear()
        await rounds(node)
        assert node.pool.plan().is_empty()
        node.check()


async def test_s21_unassign_failing_on_one_eni_leaves_nothing_releasing_on_the_others(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    # ENIs young enough to be kept: the excess goes back unit by unit, from both ENIs.
    faults = FaultInjector(seed=1)
    async with faulty_node(
        embedded,
        tmp_path,
        "t3.small",
        PoolTargets(warm_ip_target=1, min_eni_lifetime_s=3600),
        faults,
    ) as node:
        await fill_then_empty(node, 5, "old")
        plan = node.pool.plan()
        owners = {node.engine.state.units()[c].eni_id for c in plan.release_units}
        assert len(owners) == 2 and not plan.release_enis
        faults.server_error("UnassignPrivateIpAddresses", times=1)
        await node.pool.run_once()
        assert node.pool.health.errors_by_code == {"InternalError": 1}
        # A 5xx may come after EC2 acted: the failed ENI's units, still listed, stay releasing
        # (never handed out); the other ENI's release went through.
        failed = releasing(node)
        assert failed and failed < set(plan.release_units)
        assert len({node.engine.state.units()[c].eni_id for c in failed}) == 1, "one ENI's units"
        assert failed <= all_ec2_units(node)
        assert set(plan.release_units) - failed == set(node.engine.state.released())
        # Not stuck: past the grace window the drift settles it from EC2's listing.
        node.clock.advance(61.0)
        report = await node.drift.run_once()
        assert set(report.settled_kept) == failed
        assert releasing(node) == set(), "nothing stuck releasing"
        node.check()
