"""S24, S25: ENIs beside the pool manager — ENI GC sparing an ENI being attached and sweeping what
terminated nodes left, attaches applied but answered with an error, a throttled attach reusing the
ENI it created, a kept ENI deleted once no longer wanted, and the device index a new ENI takes.

Every test ends with the shared invariant check, which includes "what EC2 reports equals what ipamd
believes". What each scenario replays, and which tests prove it: docs/failure-scenarios.md."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cloud.embedded.faults import FaultInjector
from cloud.embedded.world import EmbeddedEc2
from cloud.ports import (
    MANAGED_BY,
    TAG_CLUSTER_NAME,
    TAG_CREATED_AT,
    TAG_INSTANCE_ID,
    TAG_MANAGED_BY,
)
from ipamd.model import AddressState
from ipamd.node.cloud_node import CloudNode, open_cloud_node
from ipamd.reconcile.eni_gc import EniGc
from ipamd.sizing.subnets import NO_MANAGE_TAG
from tests.scenarios.pool_support import (
    EAGER,
    NO_RELEASE_DELAY,
    faulty_node,
    rounds,
)
from tests.support.ec2_doubles import (
    GatedEc2,
)
from tests.support.node import key

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
    async with open_cloud_node(
        embedded, tmp_path, "t3.small", targets=targets, api_wrapper=GatedEc2
    ) as node:
        gated = node.api
        assert isinstance(gated, GatedEc2)
        client = node.world.client()
        instance_id = node.world.instance_id

        def spared() -> set[str]:  # as the daemon wires it
            return node.pool.pending_enis | set(node.engine.state.enis())

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


async def test_eni_gc_with_a_cluster_name_sweeps_what_terminated_nodes_left(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    """A node terminated between create and attach never sweeps its own leftovers again: with a
    cluster name, any node of the cluster deletes them once old enough (as VPC CNI's sweep does);
    another cluster's, and anything attached, are never touched."""
    targets = replace(EAGER, warm_ip_target=5)  # t3.small: a second ENI
    async with open_cloud_node(embedded, tmp_path, "t3.small", targets=targets) as node:
        client = node.world.client()
        subnet, now = node.world.subnet_id, node.clock.now()
        old = _created_at(now - 3600)
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


async def test_s25_attach_applied_but_answered_with_an_error_does_not_stall_growth(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    faults = FaultInjector(seed=1)
    async with faulty_node(
        embedded, tmp_path, "t3.small", replace(EAGER, warm_ip_target=5), faults
    ) as node:
        faults.partial_failure("AttachNetworkInterface", times=1)
        await node.pool.run_once()
        await rounds(node)
        assert node.engine.snapshot().counts[AddressState.FREE] >= 5, "the pool reached its target"
        assert node.pool.health.consecutive_failures == 0
        node.check()


async def test_s25_throttled_attach_reuses_the_created_eni_instead_of_creating_another(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    """Under an exhausted mutating budget, an ENI whose attach was throttled is the one attached on
    the next tick: one CreateNetworkInterface, not one per tick (the cluster simulator showed
    creates running far ahead of attaches)."""
    faults = FaultInjector(seed=1)
    async with faulty_node(
        embedded, tmp_path, "t3.small", replace(EAGER, warm_ip_target=5), faults
    ) as node:
        faults.throttle("AttachNetworkInterface")
        for _ in range(3):
            conditions = node.pool.conditions  # past any backoff, and past the throttle's hold
            node.clock.advance(
                max(conditions.backoff_until, conditions.warm_hold_until) - node.clock.now()
            )
            node.clock.advance(1.0)
            await node.pool.run_once()
        assert node.pool.health.errors_by_code == {"RequestLimitExceeded": 3}
        assert node.calls.count("CreateNetworkInterface") == 1, "one ENI created, kept for retry"
        (kept,) = node.pool.pending_enis
        faults.clear()
        await rounds(node)
        assert kept in node.engine.state.enis(), "the kept ENI is the one attached"
        assert node.calls.count("CreateNetworkInterface") == 1
        assert node.engine.snapshot().counts[AddressState.FREE] >= 5
        assert not node.pool.pending_enis
        node.check()


async def test_an_eni_kept_for_another_attach_is_deleted_once_no_longer_wanted(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    faults = FaultInjector(seed=1)
    async with faulty_node(
        embedded, tmp_path, "t3.small", replace(EAGER, warm_ip_target=5), faults
    ) as node:
        faults.throttle("AttachNetworkInterface")
        await node.pool.run_once()
        (kept,) = node.pool.pending_enis
        faults.clear()
        node.manager._settings = replace(
            node.manager._settings, targets=replace(EAGER, warm_ip_target=1)
        )
        node.clock.advance(120)
        assert not (await node.pool.run_once()).new_enis, "no ENI wanted any more"
        assert not node.pool.pending_enis
        client = node.world.client()
        gone = client.describe_network_interfaces(
            Filters=[{"Name": "network-interface-id", "Values": [kept]}]
        )["NetworkInterfaces"]
        assert gone == [], "deleted, not left for ENI GC"
        node.check()


async def test_the_first_new_eni_takes_its_device_index_from_the_drifts_read_at_start(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    """The daemon's start-up drift read the instance's ENIs from EC2: the first new ENI needs no
    DescribeNetworkInterfaces of its own (in a cluster joining at once, each is one more read
    against a saturated budget)."""
    faults = FaultInjector(seed=1)
    async with faulty_node(
        embedded, tmp_path, "t3.small", replace(EAGER, warm_ip_target=5), faults
    ) as node:
        listings = _listings_counted(node)
        await node.drift.run_once()
        assert listings() == 1
        await node.pool.run_once()
        assert len(node.engine.state.enis()) == 2, "a new ENI was made"
        assert listings() == 1, "with no listing of its own"
        node.check()


async def test_a_listing_asked_for_before_an_attach_failed_leaves_the_next_eni_to_describe(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    faults = FaultInjector(seed=1)
    async with faulty_node(
        embedded, tmp_path, "t3.small", replace(EAGER, warm_ip_target=5), faults
    ) as node:
        await node.drift.run_once()
        stale = node.manager.new_enis.listing_ticket()
        faults.partial_failure("AttachNetworkInterface", times=1)
        await node.pool.run_once()  # EC2 attached it, but answered with an error: in doubt
        faults.clear()
        assert len(node.engine.state.enis()) == 2
        node.manager.new_enis.listed(stale, ())  # asked for before the doubt: settles nothing
        for pod in "abc":
            await node.engine.assign(key(pod))  # the warm target wants another ENI now
        listings = _listings_counted(node)
        await rounds(node, 1)
        assert len(node.engine.state.enis()) == 3, "another ENI was made"
        assert listings() == 1, "it listed the instance's ENIs first"
        node.check()


def _listings_counted(node: CloudNode) -> Callable[[], int]:
    """How many times the ENIs are listed from now on: DescribeNetworkInterfaces requests in the
    adapter's call log, whichever view of it (foreground or background) made them."""
    before = node.calls.count("DescribeNetworkInterfaces")
    return lambda: node.calls.count("DescribeNetworkInterfaces") - before


async def test_a_device_index_freed_after_a_restart_is_the_next_new_enis(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    """ENIs at device indexes 0, 1 and 2; ipamd restarts and its start-up drift lists them; the
    ENI at 1 goes back: the next new ENI is attached at 1, the lowest index EC2 shows free (not at
    3, as when the start-up listing kept 1 in use)."""
    async with _small_node(embedded, tmp_path) as node:
        at_1 = await _spare_eni_at_1(node)
        await node.engine.close()
        await node.reopen()
        await node.drift.run_once()  # as the daemon's start-up: EC2's listing shows 0, 1, 2
        await rounds(node, 1)
        assert _device_indexes(node) == {0, 2}, "the ENI at 1 went back"
        await _grow_by_one_eni(node)
        assert _eni_at(node, 1) != at_1, "a new ENI took the freed index"
        node.check()


async def test_a_listing_asked_for_before_an_eni_went_back_leaves_its_index_free(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    async with _small_node(embedded, tmp_path) as node:
        at_1 = await _spare_eni_at_1(node)
        stale = node.manager.new_enis.listing_ticket()
        listing = await node.ec2.describe_enis(node.world.instance_id)
        await rounds(node, 1)
        assert _device_indexes(node) == {0, 2}, "the ENI at 1 went back"
        node.manager.new_enis.listed(stale, listing)  # still shows it at 1: stale, settles nothing
        await _grow_by_one_eni(node)
        assert _eni_at(node, 1) != at_1, "a new ENI took the freed index"
        node.check()


async def test_an_eni_of_another_user_keeps_its_device_index_for_every_new_eni(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    """Another user's ENI (`no_manage`) at device index 1, seen by the start-up drift: the two new
    ENIs the pool wants take 2 and 3, the second as well as the first."""
    async with open_cloud_node(
        embedded, tmp_path, "m5.xlarge", targets=replace(EAGER, warm_ip_target=30)
    ) as node:
        client = node.world.client()
        created = client.create_network_interface(
            SubnetId=node.world.subnet_id,
            TagSpecifications=[
                {
                    "ResourceType": "network-interface",
                    "Tags": [{"Key": NO_MANAGE_TAG, "Value": "true"}],
                }
            ],
        )
        client.attach_network_interface(
            NetworkInterfaceId=created["NetworkInterface"]["NetworkInterfaceId"],
            InstanceId=node.world.instance_id,
            DeviceIndex=1,
        )
        await node.drift.run_once()
        await rounds(node, 3)
        assert _device_indexes(node) == {0, 2, 3}
        assert node.calls.count("AttachNetworkInterface", "InvalidParameterValue") == 0


def _device_indexes(node: CloudNode) -> set[int]:
    return {e.device_index for e in node.engine.state.enis().values()}


def _eni_at(node: CloudNode, device_index: int) -> str:
    (eni_id,) = [e for e, r in node.engine.state.enis().items() if r.device_index == device_index]
    return eni_id


def _small_node(embedded: EmbeddedEc2, tmp_path: Path) -> AbstractAsyncContextManager[CloudNode]:
    """t3.small (3 addresses per ENI), one address kept warm, a spare ENI released at once."""
    targets = replace(EAGER, warm_ip_target=1)
    return open_cloud_node(
        embedded, tmp_path, "t3.small", targets=targets, settings=NO_RELEASE_DELAY
    )


async def _spare_eni_at_1(node: CloudNode) -> str:
    """Pods on the ENIs at device indexes 0, 1 and 2, then the ENI at 1 emptied and its addresses
    cooled: the next pool round releases it. Returns its ID."""
    for i in range(7):  # 3 on the primary ENI, 3 on the one at 1, 1 on the one at 2
        await node.settle()
        await node.engine.assign(key(f"pod-{i}"))
    await node.settle()
    assert _device_indexes(node) == {0, 1, 2}
    at_1 = _eni_at(node, 1)
    on_1 = [a.key for a in node.engine.state.allocations().values() if a.eni_id == at_1]
    for pod in on_1:
        await node.engine.release(pod)
    node.clock.advance(node.engine.settings.cooldown_s + 1)
    return at_1


async def _grow_by_one_eni(node: CloudNode) -> None:
    """Pods until the pool wanted a third ENI again."""
    for i in range(7, 12):
        await node.settle()
        await node.engine.assign(key(f"pod-{i}"))
    await node.settle()
    assert len(node.engine.state.enis()) == 3
