"""Where addresses come from, on the embedded EC2: subnet-scarcity mode (the warm targets drop to
their minimum while the node's subnet runs out, and come back once it has recovered), and prefix
mode's fallback to secondary IPs on a fragmented subnet, undone once a /28 can be had again. Time
comes from the fake clock; the subnet's free addresses from DescribeSubnets, read by the node's
subnet catalogue (subnet discovery), each read asked for here instead of waited for."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cloud.embedded.fragment import fragment_subnet, free_blocks
from cloud.embedded.world import EmbeddedEc2
from cloud.embedded.world_layout import CNI_ROLE_TAG, Layout, SubnetSpec
from datastore.records import AllocationRecord
from ipamd.config.groups import SubnetSettings
from ipamd.node.cloud_node import CloudNode, open_cloud_node
from ipamd.sizing.inputs import PoolTargets
from ipamd.sizing.modes import PREFIXES, SECONDARY_IPS
from tests.support.ec2_doubles import check_mixed, ec2_units_of_both_kinds
from tests.support.node import key

EAGER = PoolTargets(min_eni_lifetime_s=0)
THRESHOLD = 64
"""IPAMD_SUBNET_SCARCITY_THRESHOLD's default: the mode ends at twice it."""


@pytest.fixture(scope="module")
def embedded() -> Iterator[EmbeddedEc2]:
    with EmbeddedEc2() as host:
        yield host


def _held(node: CloudNode) -> int:
    """Addresses the node holds (not releasing), pods' included."""
    state = node.engine.state
    return sum(len(state.addresses_of(c)) for c, u in state.units().items() if u.state == "active")


def _kinds(node: CloudNode) -> dict[str, int]:
    counts: dict[str, int] = {}
    for unit in node.engine.state.units().values():
        counts[unit.kind] = counts.get(unit.kind, 0) + 1
    return counts


def _on_ec2(node: CloudNode, pods: list[AllocationRecord]) -> bool:
    """Every pod's allocation is still there, and its units still on EC2."""
    held = {c for units in ec2_units_of_both_kinds(node).values() for c in units}
    allocations = node.engine.state.allocations()
    return all(allocations.get(p.key) == p and set(p.unit_cidrs) <= held for p in pods)


def _scarce(node: CloudNode) -> bool:
    return node.pool.report().scarce


def _falling_back(node: CloudNode) -> bool:
    return node.pool.report().prefix_fallback


def _messages(caplog: pytest.LogCaptureFixture, prefix: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(prefix)]


class OtherNodes:
    """Addresses another node takes in the subnet: ENIs of their own, none attached here."""

    def __init__(self, node: CloudNode) -> None:
        self._ec2: Any = node.world.client()
        self._subnet_id = node.world.subnet_id
        self.enis: list[str] = []

    def take(self, addresses: int) -> None:
        while addresses > 0:
            batch = min(addresses, 30)  # well under any ENI's address limit
            answer = self._ec2.create_network_interface(
                SubnetId=self._subnet_id, SecondaryPrivateIpAddressCount=batch - 1
            )
            self.enis.append(answer["NetworkInterface"]["NetworkInterfaceId"])
            addresses -= batch

    def give_back(self, enis: int) -> None:
        for _ in range(enis):
            self._ec2.delete_network_interface(NetworkInterfaceId=self.enis.pop())


async def _read(node: CloudNode) -> int:
    """The subnet catalogue's next read (its refresh period cut short): the free addresses it saw."""
    await node.pool.subnets.refresh()
    free = node.pool.subnets.free_addresses()
    assert free is not None
    return free


async def _read_and_settle(node: CloudNode) -> int:
    """The subnets read, then the pool's rounds until its plan is empty."""
    free = await _read(node)
    await node.settle()
    return free


async def test_scarcity_mode_turns_on_and_off_around_its_threshold_and_returns_addresses(
    embedded: EmbeddedEc2, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ipamd.pool.conditions")
    targets = replace(EAGER, warm_ip_target=8, minimum_ip_target=4)
    async with open_cloud_node(
        embedded, tmp_path, targets=targets, subnet_cidr="10.0.0.0/24"
    ) as node:
        others = OtherNodes(node)
        await node.settle()
        pods = []
        for i in range(2):
            pods.append(await node.engine.assign(key(f"pod-{i}")))
            await node.settle()
        free = await _read_and_settle(node)
        assert not _scarce(node) and node.pool.report().subnet_free == free
        assert _held(node) == 2 + 8, "WARM_IP_TARGET free addresses beside the pods"

        # Other nodes take the subnet below the threshold.
        others.take(free - (THRESHOLD - 10))
        scarce_at = await _read_and_settle(node)
        assert scarce_at == THRESHOLD - 10
        assert _scarce(node)
        assert _messages(caplog, "pool.subnet_scarce on") == [
            "pool.subnet_scarce on free=54 threshold=64: warm targets at their minimum"
        ]
        assert _held(node) == 4, "MINIMUM_IP_TARGET, of which the pods hold 2"
        assert _on_ec2(node, pods), "pods' addresses untouched"
        assert len(node.engine.state.enis()) == 1, "the emptied second ENI went back too"
        returned = (await _read(node)) - scarce_at
        assert returned == 6 + 1, "what lay above the minimum, and the second ENI's own address"
        node.check()

        # Scarce, the pool still serves: it keeps one address free above the minimum.
        for i in range(2, 5):
            pods.append(await node.engine.assign(key(f"pod-{i}")))
            await node.settle()
        assert _held(node) == 5 + 1
        # A pod's address cools before it goes back.
        await node.engine.release(pods.pop().key)
        await node.settle()
        assert _held(node) == 6, "the cooling address stays"
        node.clock.advance(node.engine.settings.cooldown_s + 1)
        await node.settle()
        assert _held(node) == 5 and _on_ec2(node, pods)

        # Above the threshold, below twice it: still scarce.
        others.give_back(2)
        free = await _read_and_settle(node)
        assert THRESHOLD <= free < 2 * THRESHOLD
        assert _scarce(node) and _held(node) == 5
        # At twice the threshold it ends, and the warm targets are back.
        others.give_back(len(others.enis))
        free = await _read_and_settle(node)
        assert free >= 2 * THRESHOLD and not _scarce(node)
        assert _messages(caplog, "pool.subnet_scarce off") == [
            f"pool.subnet_scarce off free={free} recovered_at=128: warm targets as configured"
        ]
        assert _held(node) == 4 + 8
        assert _on_ec2(node, pods)
        node.check()


async def test_a_fragmented_subnet_sends_prefix_growth_to_secondary_ips_and_the_fallback_to_32_reverses_when_prefixes_return(  # noqa: E501
    embedded: EmbeddedEc2, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ipamd.pool.conditions")
    async with open_cloud_node(
        embedded,
        tmp_path,
        targets=replace(EAGER, warm_ip_target=4),
        prefix_mode=True,
        subnet_cidr="10.0.0.0/24",
        fallback=True,
    ) as node:
        health = node.pool.health
        conditions = node.pool.conditions
        client: Any = node.world.client()
        fragmented = fragment_subnet(client, node.world.subnet_id)
        # No /28 to be had: InsufficientCidrBlocks, and the fallback to secondary IPs.
        await node.pool.run_once()
        assert health.errors_by_code == {"InsufficientCidrBlocks": 1}
        assert _falling_back(node)
        assert _messages(caplog, "pool.prefix_fallback on") == [
            "pool.prefix_fallback on: secondary IPs for 120 s, then prefixes"
        ]
        node.clock.advance(conditions.backoff_until - node.clock.now() + 0.01)
        assert node.pool.strategy is SECONDARY_IPS
        await node.settle()
        pods = []
        for i in range(3):
            pods.append(await node.engine.assign(key(f"ip-pod-{i}")))
            await node.settle()
        assert all(p.unit_cidrs[0].endswith("/32") for p in pods)
        assert _kinds(node) == {"ip": 3 + 4}

        # Past the cooldown prefixes are asked for again; still fragmented, the plan's releases
        # of free /32s wait behind the refused prefix, so nothing is lost.
        node.clock.advance(conditions.subnet_exhausted_until - node.clock.now() + 1)
        assert node.pool.strategy is PREFIXES
        assert not (await node.pool.run_once()).is_empty()
        assert health.errors_by_code == {"InsufficientCidrBlocks": 2}
        assert _falling_back(node) and _kinds(node) == {"ip": 7}
        check_mixed(node)

        # Blocks free again: the next prefix is granted, and the free /32s go back with it.
        fragmented.remove(client)
        assert free_blocks(client, node.world.subnet_id)
        node.clock.advance(conditions.subnet_exhausted_until - node.clock.now() + 1)
        await node.settle()
        assert not _falling_back(node)
        assert _messages(caplog, "pool.prefix_fallback off") == [
            "pool.prefix_fallback off: prefixes again, the free /32s go back"
        ]
        assert _kinds(node) == {"prefix": 1, "ip": 3}, "only the pods' /32s stay"
        assert _on_ec2(node, pods)
        check_mixed(node)

        # New pods take the prefix; the /32s go back once their pods are gone and cooled.
        later = [await node.engine.assign(key(f"prefix-pod-{i}")) for i in range(2)]
        assert all(p.unit_cidrs[0].endswith("/28") for p in later)
        for pod in pods:
            await node.engine.release(pod.key)
        await node.settle()
        assert _kinds(node)["ip"] == 3, "cooling /32s stay"
        node.clock.advance(node.engine.settings.cooldown_s + 1)
        await node.settle()
        assert _kinds(node) == {"prefix": 1}
        assert health.errors_by_code == {"InsufficientCidrBlocks": 2}
        assert _on_ec2(node, later)
        check_mixed(node)


async def test_prefixes_take_the_slots_of_free_32s_when_the_fallback_filled_the_node(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    # t3.small: 3 slots per ENI; MAX_ENI=1 leaves the primary only, which the fallback fills.
    async with open_cloud_node(
        embedded,
        tmp_path,
        "t3.small",
        targets=replace(EAGER, warm_ip_target=4, max_eni=1),
        prefix_mode=True,
        subnet_cidr="10.0.0.0/24",
        fallback=True,
    ) as node:
        conditions = node.pool.conditions
        client: Any = node.world.client()
        fragmented = fragment_subnet(client, node.world.subnet_id)
        await node.pool.run_once()
        node.clock.advance(conditions.backoff_until - node.clock.now() + 0.01)
        await node.settle()
        pods = [await node.engine.assign(key(f"pod-{i}")) for i in range(2)]
        assert _kinds(node) == {"ip": 3}, "every slot a /32"

        fragmented.remove(client)
        node.clock.advance(conditions.subnet_exhausted_until - node.clock.now() + 1)
        plan = node.pool.plan()
        assert len(plan.replace_units) == 1 and plan.assign and not plan.new_enis
        await node.settle()
        assert not _falling_back(node)
        assert _kinds(node) == {"prefix": 1, "ip": 2}, "the free /32's slot holds a prefix"
        assert _on_ec2(node, pods)
        check_mixed(node)


POD_SUBNET = "100.64.0.0/19"
POD_LAYOUT = Layout(
    secondary_cidrs=("100.64.0.0/16",),
    subnets=(SubnetSpec(POD_SUBNET, tags={CNI_ROLE_TAG: "1"}),),
)


async def test_a_fragmented_subnet_sends_prefix_growth_to_another_subnet_before_any_fallback(
    embedded: EmbeddedEc2, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The node's /24 has no /28 left; a tagged pod subnet of the zone does. The prefixes the
    primary ENI cannot get go on a new ENI there, with no /32 drawn anywhere."""
    caplog.set_level(logging.INFO, logger="ipamd.pool.manager")
    async with open_cloud_node(
        embedded,
        tmp_path,
        targets=replace(EAGER, warm_prefix_target=2),
        prefix_mode=True,
        subnet_cidr="10.0.0.0/24",
        fallback=True,
        layout=POD_LAYOUT,
        settings={"subnets": SubnetSettings(scarcity_threshold=0)},
    ) as node:
        client: Any = node.world.client()
        fragment_subnet(client, node.world.subnet_id)
        await node.settle()
        pod_subnet = node.world.subnet(POD_SUBNET).subnet_id
        enis = node.engine.state.enis()
        secondary = [e for e in enis.values() if not e.is_primary]
        assert [e.subnet_id for e in secondary] == [pod_subnet]
        assert _kinds(node) == {"prefix": 2}, "prefixes only, all of them in the pod subnet"
        assert not node.engine.state.units_on(node.world.primary_eni_id)
        assert not _falling_back(node)
        assert node.pool.subnets.avoids(node.world.subnet_id)
        assert any(m.startswith("pool.prefixes_elsewhere") for m in _messages(caplog, "pool."))
        pod = await node.engine.assign(key("pod"))
        assert pod.unit_cidrs[0].endswith("/28") and pod.eni_id == secondary[0].eni_id
        check_mixed(node)
