"""S1, S4, S18, S16: ADD and DEL racing, cancelled, duplicated and repeated — driven by a commit held at
a gate, never by sleeps.

What each scenario replays, and which tests prove it: docs/failure-scenarios.md."""

from __future__ import annotations

import asyncio
import threading

import pytest

from datastore.readonly import read_disk
from ipamd.errors import DeleteIntentActive
from tests.support.node import NodeFixture, key


@pytest.fixture
def node(node: NodeFixture) -> NodeFixture:
    """The engine writes off the loop's thread: these tests hold its commits at the store's gate."""
    node.inline_writes = False
    return node


async def _hold_commits(node: NodeFixture) -> threading.Event:
    assert node.store is not None
    gate = threading.Event()
    node.store.gate = gate
    node.store.entered.clear()
    return gate


async def _until_commit_entered(node: NodeFixture) -> None:
    assert node.store is not None
    assert await asyncio.to_thread(node.store.entered.wait, 10)


async def _let_others_run() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_s01_del_overlapping_a_slow_add_leaves_one_truth(node: NodeFixture) -> None:
    engine = await node.open()
    await node.seed(enis=1, per_eni=4)
    gate = await _hold_commits(node)
    add = asyncio.create_task(engine.assign(key("X")))
    await _until_commit_entered(node)
    delete = asyncio.create_task(engine.release(key("X")))
    await _let_others_run()
    assert not delete.done(), "DEL must wait for the ADD in flight, not interleave with it"
    gate.set()
    allocation = await add
    released = await delete
    assert released == (allocation,)
    address = allocation.addresses[0]
    assert engine.state.owner_of(address) is None
    assert all(address not in a.addresses for a in read_disk(node.path).allocations)
    with pytest.raises(DeleteIntentActive):
        await engine.assign(key("X"))
    node.check()
    await node.restart()
    assert engine is not node.engine and node.engine is not None
    assert node.engine.state.allocations() == {}
    node.check()


async def test_s01_add_arriving_during_a_slow_del_is_refused(node: NodeFixture) -> None:
    engine = await node.open()
    await node.seed(enis=1, per_eni=4)
    first = await engine.assign(key("X"))
    gate = await _hold_commits(node)
    delete = asyncio.create_task(engine.release(key("X")))
    await _until_commit_entered(node)
    add = asyncio.create_task(engine.assign(key("X")))
    await _let_others_run()
    assert not add.done()
    gate.set()
    assert await delete == (first,)
    with pytest.raises(DeleteIntentActive):
        await add
    node.check()


async def test_s04_add_cancelled_before_its_commit_assigns_nothing(node: NodeFixture) -> None:
    engine = await node.open()
    await node.seed(enis=1, per_eni=4)
    gate = await _hold_commits(node)
    blocker = asyncio.create_task(engine.assign(key("A")))
    await _until_commit_entered(node)
    doomed = asyncio.create_task(engine.assign(key("B")))
    await _let_others_run()
    doomed.cancel()
    gate.set()
    await blocker
    with pytest.raises(asyncio.CancelledError):
        await doomed
    assert key("B") not in engine.state.allocations()
    assert all(a.key != key("B") for a in read_disk(node.path).allocations)
    node.check()


async def test_s04_add_cancelled_during_its_commit_is_whole_in_memory_and_on_disk(
    node: NodeFixture,
) -> None:
    # Once the write is in flight it cannot be recalled; the engine waits for it so memory follows
    # disk. The runtime's DEL (or a retried ADD, answered idempotently) then finds it.
    engine = await node.open()
    await node.seed(enis=1, per_eni=4)
    gate = await _hold_commits(node)
    add = asyncio.create_task(engine.assign(key("A")))
    await _until_commit_entered(node)
    add.cancel()
    await _let_others_run()
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await add
    node.check()
    retried = await engine.assign(key("A"))
    assert engine.state.allocations() == {key("A"): retried}
    node.check()


async def test_s18_duplicate_add_returns_the_same_address(node: NodeFixture) -> None:
    engine = await node.open()
    await node.seed(enis=2, per_eni=4)
    first = await engine.assign(key("X"))
    again = await engine.assign(key("X"))
    concurrent = await asyncio.gather(*(engine.assign(key("X")) for _ in range(5)))
    assert again == first and all(c == first for c in concurrent)
    assert len(engine.state.allocations()) == 1
    assert len(read_disk(node.path).allocations) == 1
    node.check()


async def test_s16_stale_del_for_a_reused_address_leaves_the_new_owner(node: NodeFixture) -> None:
    engine = await node.open()
    await node.seed(enis=1, per_eni=1)
    p1 = await engine.assign(key("P1"))
    await engine.release(key("P1"))
    node.clock.advance(engine.settings.cooldown_s)
    p2 = await engine.assign(key("P2"))
    assert p2.addresses == p1.addresses, "the only address is reused once its cooldown ended"
    assert await engine.release(key("P1")) == ()
    assert engine.state.owner_of(p2.addresses[0]) == key("P2")
    node.check()
    await node.restart()
    assert node.engine is not None
    assert node.engine.state.owner_of(p2.addresses[0]) == key("P2")
    node.check()
