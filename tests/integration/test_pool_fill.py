"""The warm pool against the embedded EC2: from an empty node to its targets, held under churn, and
given back once pods leave — in both modes, on small, common and large instance types."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloud.embedded.world import EmbeddedEc2
from ipamd.errors import NoAddressAvailable
from ipamd.node.cloud_node import CloudNode, open_cloud_node
from ipamd.sizing.inputs import PoolTargets
from tests.support.node import key

CASES = [
    ("t3.small", False),
    ("m5.large", False),
    ("c5.18xlarge", False),
    ("t3.small", True),
    ("m5.large", True),
    ("c5.18xlarge", True),
]


@pytest.fixture(scope="module")
def embedded() -> Iterator[EmbeddedEc2]:
    with EmbeddedEc2() as host:
        yield host


def _free(node: CloudNode) -> int:
    stats = node.manager.stats()
    return sum(u.free for e in stats.enis for u in e.units)


@pytest.mark.parametrize(("instance_type", "prefix_mode"), CASES)
async def test_pool_reaches_targets_from_empty_node(
    embedded: EmbeddedEc2, tmp_path: Path, instance_type: str, prefix_mode: bool
) -> None:
    async with open_cloud_node(embedded, tmp_path, instance_type, prefix_mode=prefix_mode) as node:
        await node.settle()
        limits = node.facts.limits
        per_eni = limits.units_per_eni * node.strategy.addresses_per_unit
        if prefix_mode:
            assert _free(node) >= 16, "WARM_PREFIX_TARGET=1: one whole free prefix"
        else:
            assert _free(node) >= per_eni, "WARM_ENI_TARGET=1: one ENI's worth free"
        node.check()


@pytest.mark.parametrize(("instance_type", "prefix_mode"), CASES[:2] + CASES[3:5])
async def test_targets_hold_under_churn_and_units_go_back_after(
    embedded: EmbeddedEc2, tmp_path: Path, instance_type: str, prefix_mode: bool
) -> None:
    targets = PoolTargets(warm_ip_target=3, minimum_ip_target=4, min_eni_lifetime_s=0)
    async with open_cloud_node(
        embedded, tmp_path, instance_type, targets=targets, prefix_mode=prefix_mode
    ) as node:
        rng = random.Random(11)
        live: list[str] = []
        await node.settle()
        for step in range(120):
            if live and rng.random() < 0.45:
                await node.engine.release(key(live.pop(rng.randrange(len(live)))))
            else:
                try:
                    await node.engine.assign(key(f"pod-{step}"))
                    live.append(f"pod-{step}")
                except NoAddressAvailable:
                    pass
            node.clock.advance(rng.uniform(0, 5))
            await node.settle()
            node.check()
            node.peak_enis = max(node.peak_enis, len(node.ec2_units()))
        for cid in live:
            await node.engine.release(key(cid))
        node.clock.advance(node.engine.settings.cooldown_s + 1)
        await node.settle()  # the spare units go back; the spare ENIs wait out their delay
        node.clock.advance(node.config.pool.release_delay_s)
        await node.settle()
        node.check()
        total = sum(len(units) for units in node.ec2_units().values())
        expected = node.strategy.units_for(max(targets.minimum_ip_target, targets.warm_ip_target))
        assert total == expected, "back to the resting pool, and EC2 agrees"
        enis_needed = -(-expected // node.facts.limits.units_per_eni)
        assert len(node.ec2_units()) == enis_needed, "ENIs that were needed only for pods went back"
        if instance_type == "t3.small" and not prefix_mode:
            assert node.peak_enis > enis_needed, "the churn did need extra ENIs on the way"
