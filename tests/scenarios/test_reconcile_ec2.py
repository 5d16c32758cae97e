"""S12, S26, S30 and EC2 drift by content: EC2 is the authority, ipamd's own recent changes are given a
grace window, an owned address EC2 drops becomes lost and never free.

What each scenario replays, and which tests prove it: docs/failure-scenarios.md."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from cloud.embedded.world import EmbeddedEc2
from cloud.ports import MANAGED_BY, TAG_INSTANCE_ID, TAG_MANAGED_BY, CallUrgency, Ec2Api
from ipamd.errors import NoAddressAvailable
from ipamd.model import AddressState, PoolSnapshot
from ipamd.node.cloud_node import CloudNode, open_cloud_node
from ipamd.sizing.inputs import PoolTargets
from tests.support.node import key

GRACE_S = 60.0
"""IPAMD_RECONCILE_GRACE's default: the drift grace window of every node here."""


def _unassign_on_ec2(node: CloudNode, eni_id: str, cidr: str) -> None:
    node.world.client().unassign_private_ip_addresses(
        NetworkInterfaceId=eni_id, PrivateIpAddresses=[cidr.removesuffix("/32")]
    )


def _assign_on_ec2(node: CloudNode, eni_id: str, cidr: str) -> None:
    node.world.client().assign_private_ip_addresses(
        NetworkInterfaceId=eni_id, PrivateIpAddresses=[cidr.removesuffix("/32")]
    )


async def test_owned_address_ec2_drops_becomes_lost_and_comes_back_assigned(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    async with open_cloud_node(embedded, tmp_path) as node:
        await node.settle()
        alloc = await node.engine.assign(key("pod"))
        cidr, eni_id = alloc.unit_cidrs[0], alloc.eni_id
        _unassign_on_ec2(node, eni_id, cidr)  # EC2 takes the address away behind ipamd's back
        drift = node.drift
        assert (await drift.run_once()).lost == [], "inside the grace window: left alone"
        node.clock.advance(GRACE_S)
        report = await drift.run_once()
        assert report.lost == [cidr]
        assert node.engine.snapshot().counts[AddressState.LOST] == 1
        # S3: EC2 gives it back while the record still claims it: assigned again, never free.
        _assign_on_ec2(node, eni_id, cidr)
        report = await drift.run_once()
        assert report.found_again == [cidr]
        assert node.engine.state.owner_of(alloc.addresses[0]) == key("pod")
        node.check()


async def test_units_ec2_lists_and_ipamd_lacks_are_added_free_outside_grace(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    targets = PoolTargets(warm_ip_target=2, minimum_ip_target=2)
    async with open_cloud_node(embedded, tmp_path, targets=targets) as node:
        await node.settle()
        eni_id = next(iter(node.engine.state.enis()))
        answer = node.world.client().assign_private_ip_addresses(
            NetworkInterfaceId=eni_id, SecondaryPrivateIpAddressCount=1
        )
        new = f"{answer['AssignedPrivateIpAddresses'][0]['PrivateIpAddress']}/32"
        report = await node.drift.run_once()
        assert report.added == [new]
        node.check()


async def test_s12_restart_during_scale_down_waits_for_ec2_to_settle(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    targets = PoolTargets(warm_ip_target=2, minimum_ip_target=2)
    async with open_cloud_node(embedded, tmp_path, targets=targets) as node:
        await node.settle()
        free = [c for c, u in node.engine.state.units().items() if u.state == "active"]
        # ipamd marked two units for release, unassigned only the first, and died.
        marked = await node.engine.begin_release(free[:2])
        _unassign_on_ec2(node, node.engine.state.units()[marked[0]].eni_id, marked[0])
        await node.engine.close()
        await node.reopen()
        assert node.engine.snapshot().counts[AddressState.RELEASING] == 2
        with pytest.raises(NoAddressAvailable):
            await node.engine.assign(key("a"))  # the releasing ones are never handed out
        drift = node.drift
        assert (await drift.run_once()).settled_released == [], "not before the grace window"
        node.clock.advance(GRACE_S)
        report = await drift.run_once()
        assert report.settled_released == [marked[0]], "EC2 no longer lists it: released"
        assert report.settled_kept == [marked[1]], "EC2 still lists it: free again"
        assert node.engine.state.units()[marked[1]].state == "active"
        node.check()


async def test_s26_state_from_another_instance_is_set_aside_and_reread(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    async with open_cloud_node(embedded, tmp_path) as node:
        await node.settle()
        await node.engine.claim_instance("i-0000000000000dead")  # the volume's first life
        await node.engine.assign(key("old-pod"))
        await node.engine.close()
        await node.reopen()
        assert await node.engine.claim_instance(node.world.instance_id)
        state = node.engine.state
        assert state.instance_id == node.world.instance_id
        assert state.enis() == {} and state.allocations() == {}
        assert [q.key for q in state.quarantine().values()] == [key("old-pod")]
        assert (
            "belongs to instance i-0000000000000dead" in state.quarantine()[key("old-pod")].reason
        )
        report = await node.drift.run_once()
        assert report.enis_added, "the inventory is read afresh from EC2"
        node.check()
        assert not await node.engine.claim_instance(node.world.instance_id), "idempotent"


def _consistent(snapshot: PoolSnapshot) -> None:
    per_eni: dict[AddressState, int] = {s: 0 for s in AddressState}
    seen: set[str] = set()
    for eni in snapshot.enis:
        addresses = [a for u in eni.units for a, _ in u.addresses]
        assert not seen & set(addresses), "no address on two ENIs"
        seen.update(addresses)
        for state in AddressState:
            assert eni.counts[state] == sum(
                1 for u in eni.units for _, s in u.addresses if s == state
            )
            per_eni[state] += eni.counts[state]
    assert per_eni == snapshot.counts, "the counts add up"
    owned = snapshot.counts[AddressState.ASSIGNED] + snapshot.counts[AddressState.LOST]
    assert owned == snapshot.allocations, "one address per allocation in this test, all accounted"


class _SnapshottingEc2:
    """Wraps the node's EC2 port: a snapshot as each call starts and as it returns, the moments the
    pool manager is between deciding and applying."""

    def __init__(self, inner: Ec2Api) -> None:
        self._inner = inner
        self.take: Callable[[], None] = lambda: None

    def with_urgency(self, policy: CallUrgency) -> _SnapshottingEc2:
        view = _SnapshottingEc2(self._inner.with_urgency(policy))

        def take() -> None:
            self.take()  # this wrapper's, as the test sets it later

        view.take = take
        return view

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not asyncio.iscoroutinefunction(attr):
            return attr

        async def observed(*args: Any, **kwargs: Any) -> Any:
            self.take()
            try:
                return await attr(*args, **kwargs)
            finally:
                self.take()

        return observed


async def test_s30_snapshots_during_churn_and_growth_are_consistent(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    wrappers: list[_SnapshottingEc2] = []

    def wrap(inner: Ec2Api) -> _SnapshottingEc2:
        wrappers.append(_SnapshottingEc2(inner))
        return wrappers[-1]

    async with open_cloud_node(embedded, tmp_path, "t3.small", api_wrapper=wrap) as node:
        snapshots: list[PoolSnapshot] = []
        wrappers[0].take = lambda: snapshots.append(node.engine.snapshot())

        async def observed(operation: Awaitable[object]) -> None:
            # Snapshots while the engine has decided and its commit is in flight on the store thread.
            # (A few turns of the loop, not a spin: a spinning observer starves the store thread of
            # the GIL and one commit then takes a second.)
            task = asyncio.ensure_future(operation)
            for _ in range(3):
                await asyncio.sleep(0)
                snapshots.append(node.engine.snapshot())
            with contextlib.suppress(NoAddressAvailable):
                await task

        for i in range(40):
            await observed(node.engine.assign(key(f"p{i}")))
            if i % 3 == 0:
                await observed(node.engine.release(key(f"p{i // 2}")))
            await node.pool.run_once()
        assert node.calls.count("AttachNetworkInterface") >= 1, "the pool grew during the churn"
        assert len(snapshots) > 80
        for snapshot in snapshots:
            _consistent(snapshot)
        node.check()


def _attach_raw(node: CloudNode, device_index: int, tags: dict[str, str]) -> str:
    """An ENI created and attached with the raw client, as a process killed before setting
    DeleteOnTermination (or another tool) leaves it: attached, DeleteOnTermination false."""
    client = node.world.client()
    created = client.create_network_interface(
        SubnetId=node.world.subnet_id,
        TagSpecifications=[
            {
                "ResourceType": "network-interface",
                "Tags": [{"Key": k, "Value": v} for k, v in tags.items()],
            }
        ],
    )
    eni_id: str = created["NetworkInterface"]["NetworkInterfaceId"]
    client.attach_network_interface(
        NetworkInterfaceId=eni_id, InstanceId=node.world.instance_id, DeviceIndex=device_index
    )
    return eni_id


async def test_drift_gives_our_attached_eni_delete_on_termination_and_leaves_others_alone(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    async with open_cloud_node(embedded, tmp_path, "m5.large") as node:
        ours = _attach_raw(
            node, 1, {TAG_INSTANCE_ID: node.world.instance_id, TAG_MANAGED_BY: MANAGED_BY}
        )
        foreign = _attach_raw(node, 2, {"team": "someone-else"})
        before = {e.eni_id: e for e in await node.ec2.describe_enis(node.world.instance_id)}
        assert not before[ours].delete_on_termination and not before[foreign].delete_on_termination

        report = await node.drift.run_once()
        assert report.enis_bound_to_instance == [ours]
        after = {e.eni_id: e for e in await node.ec2.describe_enis(node.world.instance_id)}
        assert after[ours].delete_on_termination, "ours now goes with the instance"
        assert not after[foreign].delete_on_termination, "not ipamd's to decide"
        assert not (await node.drift.run_once()).enis_bound_to_instance, "set once"
