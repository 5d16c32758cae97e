"""The pool manager works its plan out again only when something it is made from changed: at every
step of a node's life its plan is the one worked out afresh, and while nothing changed it is the
same plan, not a recount."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cloud.embedded.world import EmbeddedEc2
from ipamd.node.cloud_node import CloudNode, open_cloud_node
from ipamd.sizing.inputs import PoolTargets
from tests.support.node import key


@pytest.fixture(scope="module")
def embedded() -> Iterator[EmbeddedEc2]:
    with EmbeddedEc2() as host:
        yield host


def _as_fresh(node: CloudNode) -> None:
    pool = node.manager
    assert pool.plan() == pool._plan_on(pool.stats(), pool._targets())


async def test_the_plan_is_the_fresh_one_at_every_step(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    targets = PoolTargets(warm_ip_target=2, minimum_ip_target=4, min_eni_lifetime_s=60)
    async with open_cloud_node(embedded, tmp_path, "m5.large", targets=targets) as node:
        _as_fresh(node)
        await node.settle()
        _as_fresh(node)
        for n in range(12):  # past the first ENI: the pool grows a second one
            await node.engine.assign(key(f"p{n}"))
            _as_fresh(node)
            await node.settle()
            _as_fresh(node)
        for n in range(12):
            await node.engine.release(key(f"p{n}"))
            _as_fresh(node)
        node.clock.advance(node.engine.settings.cooldown_s + 1)  # free again, no commit
        _as_fresh(node)
        node.clock.advance(targets.min_eni_lifetime_s)  # the new ENI is old enough to go
        _as_fresh(node)
        assert node.pool.plan().release_units or node.pool.plan().release_enis, "excess to return"
        await node.settle()
        _as_fresh(node)
        node.check()


async def test_the_plan_is_kept_while_nothing_changed(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    async with open_cloud_node(embedded, tmp_path, "m5.large") as node:
        await node.settle()
        first = node.pool.plan()
        node.clock.advance(5)
        assert node.pool.plan() is first
        await node.engine.assign(key("a"))
        assert node.pool.plan() is not first
        _as_fresh(node)
