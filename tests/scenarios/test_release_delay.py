"""IPAMD_RELEASE_DELAY: what the pool could spare (an ENI, a prefix) goes back to EC2 only once it
has been spare that long without a break, so a node whose pods hover at an edge keeps it instead of
paying to give it back and ask for it again every few minutes (for an ENI: create, attach,
DeleteOnTermination, detach and delete). On the embedded EC2, an m5.large with WARM_ENI_TARGET=1
(9 addresses an ENI): one pod past the primary ENI's 9 free addresses brings a second ENI, which is
spare again once the pod has gone; in prefix mode with WARM_PREFIX_TARGET=1, the pod that takes the
warm /28's first address brings a second prefix."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cloud.embedded.world import EmbeddedEc2
from ipamd.config.groups import PoolSettings
from ipamd.node.cloud_node import CloudNode, open_cloud_node
from ipamd.sizing.inputs import PoolTargets
from tests.support.node import key

EAGER = PoolTargets(min_eni_lifetime_s=0)
"""No least ENI lifetime: the delay alone holds a spare ENI back."""


@pytest.fixture(scope="module")
def embedded() -> Iterator[EmbeddedEc2]:
    with EmbeddedEc2() as host:
        yield host


async def _come_and_go(node: CloudNode, name: str) -> None:
    """A pod takes the ninth address, the pool grows an ENI, the pod leaves and its address cools."""
    await node.engine.assign(key(name))
    await node.settle()
    await node.engine.release(key(name))
    node.clock.advance(node.engine.settings.cooldown_s + 1)


async def test_a_spare_eni_goes_only_after_the_delay_and_a_break_starts_it_over(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    async with open_cloud_node(embedded, tmp_path, "m5.large", targets=EAGER) as node:
        delay_s = node.config.pool.release_delay_s
        assert delay_s == 300.0, "the default"
        await node.settle()
        assert len(node.ec2_units()) == 1, "the primary's 9 free addresses meet the target"
        await _come_and_go(node, "pod-0")
        assert len(node.ec2_units()) == 2

        await node.pool.run_once()
        assert node.pool.plan().release_enis, "the second ENI is spare"
        node.clock.advance(delay_s - 1)
        await node.pool.run_once()
        assert len(node.ec2_units()) == 2, "one second short of the delay: kept"

        # A pod comes (the ENI is needed: a break) and goes again.
        await _come_and_go(node, "pod-1")
        await node.pool.run_once()
        node.clock.advance(2)
        await node.pool.run_once()
        assert len(node.ec2_units()) == 2, "past the first deadline, but the break started it over"

        node.clock.advance(delay_s)
        await node.pool.run_once()
        assert len(node.ec2_units()) == 1, "spare for the whole delay: gone"
        assert not node.pool.plan().release_enis
        node.check()


async def test_a_delay_of_zero_frees_a_spare_eni_at_the_first_round(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    async with open_cloud_node(
        embedded,
        tmp_path,
        "m5.large",
        targets=EAGER,
        settings={"pool": PoolSettings(release_delay_s=0.0)},
    ) as node:
        await node.settle()
        await _come_and_go(node, "pod-0")
        assert len(node.ec2_units()) == 2
        await node.pool.run_once()
        assert len(node.ec2_units()) == 1, "as VPC CNI does"
        node.check()


async def test_a_spare_prefix_goes_only_after_the_delay(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    async with open_cloud_node(
        embedded, tmp_path, "m5.large", targets=EAGER, prefix_mode=True
    ) as node:
        await node.settle()
        prefixes = sum(len(units) for units in node.ec2_units().values())
        await _come_and_go(node, "pod-0")
        assert sum(len(units) for units in node.ec2_units().values()) == prefixes + 1
        await node.pool.run_once()
        assert node.pool.plan().release_units, "the pod's prefix is wholly free again: spare"
        node.clock.advance(node.config.pool.release_delay_s - 1)
        await node.pool.run_once()
        assert sum(len(units) for units in node.ec2_units().values()) == prefixes + 1, "kept"
        node.clock.advance(1)
        await node.pool.run_once()
        assert sum(len(units) for units in node.ec2_units().values()) == prefixes, "given back"
        node.check()
