"""S31, S32: the pool manager at the edge of what it may have — an exhausted subnet pausing growth
(and, in prefix mode, falling back), the instance's limits and max pods, and a node at full
capacity.

Every test ends with the shared invariant check, which includes "what EC2 reports equals what ipamd
believes". What each scenario replays, and which tests prove it: docs/failure-scenarios.md."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cloud.embedded.world import EmbeddedEc2
from datastore.records import AllocationRecord
from ipamd.config.groups import SubnetSettings
from ipamd.errors import MaxPodsReached, NoAddressAvailable, NodeFull
from ipamd.node.cloud_node import CloudNode, open_cloud_node
from ipamd.sizing.modes import PREFIXES, SECONDARY_IPS
from tests.scenarios.pool_support import (
    EAGER,
    releasing,
)
from tests.support.ec2_doubles import (
    check_mixed,
    ec2_units_of_both_kinds,
)
from tests.support.node import key

# -- S31 ---------------------------------------------------------------------------------------

EXHAUSTION_ALONE = {"subnets": SubnetSettings(scarcity_threshold=0)}
"""Subnets this small are scarce too (tests/scenarios/test_subnet_scarcity.py): these tests are
about exhaustion, with the warm targets as configured."""


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
    async with open_cloud_node(
        embedded,
        tmp_path,
        "c5.18xlarge",
        targets=targets,
        subnet_cidr="10.0.0.0/28",
        settings=EXHAUSTION_ALONE,
    ) as node:
        health = node.pool.health
        conditions = node.pool.conditions
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
        assert conditions.subnet_exhausted_until == now + 120.0
        assert conditions.backoff_until > now
        assert any("pool.subnet_exhausted" in r.getMessage() for r in caplog.records)
        assert _allocations(node) == pods and _on_ec2(node, pods), "existing pods untouched"

        # Past the backoff, within the cooldown: no growth is attempted.
        for _ in range(10):
            node.clock.advance(10)
            assert (await node.pool.run_once()).is_empty()
        assert node.calls.count("AssignPrivateIpAddresses") == asked + 1
        assert node.pool.plan().assign, "the pool is still short"

        node.clock.advance(conditions.subnet_exhausted_until - node.clock.now() + 1)
        await node.pool.run_once()
        assert node.calls.count("AssignPrivateIpAddresses") == asked + 2, "tried again after it"
        assert health.errors_by_code == {"InsufficientFreeAddressesInSubnet": 2}
        assert _allocations(node) == pods and _on_ec2(node, pods)
        node.check()


async def test_s31_subnet_exhausted_backs_off_and_falls_back_in_prefix_mode(
    embedded: EmbeddedEc2, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A /27 has free addresses but no /28 free of reserved ones: no prefix can be delegated.
    async with open_cloud_node(
        embedded,
        tmp_path,
        prefix_mode=True,
        subnet_cidr="10.0.0.0/27",
        fallback=True,
        settings=EXHAUSTION_ALONE,
    ) as node:
        health = node.pool.health
        conditions = node.pool.conditions
        state = node.engine.state
        now = node.clock.now()
        await node.pool.run_once()
        assert health.errors_by_code == {"InsufficientCidrBlocks": 1}
        assert conditions.subnet_exhausted_until == now + 120.0
        assert conditions.backoff_until > now
        assert any("pool.subnet_exhausted" in r.getMessage() for r in caplog.records)
        assert state.units() == {}

        node.clock.advance(conditions.backoff_until - now + 0.01)
        assert node.pool.strategy is SECONDARY_IPS, "falling back while the subnet is exhausted"
        await node.settle()
        assert state.units() and {u.kind for u in state.units().values()} == {"ip"}
        pods = [await node.engine.assign(key(f"pod-{i}")) for i in range(3)]
        assert all(a.unit_cidrs[0].endswith("/32") for a in pods)
        before = _allocations(node)

        # No prefix is asked for again until the cooldown has passed.
        while node.clock.now() + 10 < conditions.subnet_exhausted_until:
            node.clock.advance(10)
            await node.pool.run_once()
        assert health.errors_by_code == {"InsufficientCidrBlocks": 1}
        node.clock.advance(conditions.subnet_exhausted_until - node.clock.now() + 1)
        assert node.pool.strategy is PREFIXES
        await node.pool.run_once()
        assert health.errors_by_code == {"InsufficientCidrBlocks": 2}, "tried prefixes again"
        assert _allocations(node) == before and _on_ec2(node, before), "existing pods untouched"
        assert releasing(node) == set()
        check_mixed(node)


# -- S32 ---------------------------------------------------------------------------------------


async def test_s32_limits_no_call_ec2_would_reject_and_max_pods_is_clear(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    # t3.small: 3 ENIs of 4 IPv4 addresses, the primary one included: 9 pod addresses.
    async with open_cloud_node(embedded, tmp_path, "t3.small") as node:
        served: list[AllocationRecord] = []
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


async def test_s32_add_past_a_max_pods_override_fails_with_max_pods_reached(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    targets = replace(EAGER, max_pods=5)
    async with open_cloud_node(embedded, tmp_path, targets=targets) as node:
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


async def test_s32_add_at_full_capacity_does_not_claim_the_pool_is_growing(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    async with open_cloud_node(embedded, tmp_path, "t3.small") as node:
        for i in range(9):
            await node.settle()
            await node.engine.assign(key(f"pod-{i}"))
        await node.settle()
        with pytest.raises(NodeFull) as refused:
            await node.engine.assign(key("pod-9"))
        assert "growing" not in str(refused.value)
        node.check()
