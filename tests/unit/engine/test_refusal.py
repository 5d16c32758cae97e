"""An ADD that finds no address changes nothing: with nothing queued or being written it is refused
at once, without a write; otherwise it is decided in its turn, after the changes ahead of it
(docs/architecture.md §2.1)."""

from __future__ import annotations

import asyncio

import pytest

from ipamd.errors import NoAddressAvailable
from tests.support.node import NodeFixture, key


async def test_a_refused_add_writes_nothing_and_wakes_the_pool(node: NodeFixture) -> None:
    engine = await node.open()
    await node.seed(enis=1, per_eni=2)
    for pod in ("a", "b"):
        await engine.assign(key(pod))
    assert node.store is not None
    commits = node.store.commits
    for _ in range(3):
        with pytest.raises(NoAddressAvailable):
            await engine.assign(key("c"))
    assert node.store.commits == commits, "nothing to write"
    assert engine.pool_wanted and engine.starved_at == node.clock.now()
    assert engine.state.allocation(key("c")) is None
    node.check()


async def test_an_add_behind_queued_changes_is_decided_after_them(node: NodeFixture) -> None:
    engine = await node.open()
    await node.seed(enis=1, per_eni=2)
    await engine.assign(key("a"))
    # Two ADDs for the last address at once: the second arrives while the first is queued, so it
    # is decided in its turn, after the first took the address, and refused there.
    first, second = await asyncio.gather(
        engine.assign(key("b")), engine.assign(key("c")), return_exceptions=True
    )
    assert not isinstance(first, BaseException) and first.addresses
    assert isinstance(second, NoAddressAvailable)
    assert engine.state.allocation(key("b")) == first
    node.check()
