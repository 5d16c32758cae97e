"""S5, S6, S7: a write that fails changes nothing, leaks into nothing, and never lands half-way.

Faults are SQLite's own (a read-only database, a transaction aborted half-way) or a state file moved
away under the daemon.

What each scenario replays, and which tests prove it: docs/failure-scenarios.md."""

from __future__ import annotations

import pytest

from datastore.readonly import read_disk
from ipamd.engine.invariants import normalized
from ipamd.errors import NoAddressAvailable, StoreWriteFailed
from tests.support.node import NodeFixture, key


@pytest.mark.parametrize("fault", ["read_only", "removed", "half_way"])
async def test_s05_failed_commit_of_a_new_add_takes_back_only_its_addresses(
    node: NodeFixture, fault: str
) -> None:
    engine = await node.open()
    await node.seed(enis=1, per_eni=4)
    kept = await engine.assign(key("kept"))
    before = normalized(engine.state.to_image())
    assert node.store is not None
    node.store.fail_next(fault)
    with pytest.raises(StoreWriteFailed):
        await engine.assign(key("new"), count=2)
    assert normalized(engine.state.to_image()) == before
    # The existing assignment, asked for again while the disk is still failing, stays as it was.
    node.store.fail_next(fault)
    assert await engine.assign(key("kept")) == kept
    node.check()
    node.store.faults.clear()
    new = await engine.assign(key("new"))
    assert new.addresses[0] not in kept.addresses
    node.check()


async def test_s05_failed_commit_of_a_del_keeps_the_allocation_and_reports(
    node: NodeFixture,
) -> None:
    engine = await node.open()
    await node.seed(enis=1, per_eni=2)
    alloc = await engine.assign(key("X"))
    assert node.store is not None
    node.store.fail_next("read_only")
    with pytest.raises(StoreWriteFailed):
        await engine.release(key("X"))
    assert engine.state.allocations()[key("X")] == alloc
    assert "X" not in engine.state.intents()
    node.check()
    assert await engine.release(key("X")) == (alloc,), "the retried DEL succeeds"
    node.check()


async def test_s06_failed_write_does_not_leak_into_the_next_one(node: NodeFixture) -> None:
    engine = await node.open()
    await node.seed(enis=1, per_eni=4)
    k_before = await engine.assign(key("K"))
    assert node.store is not None
    node.store.fail_next("read_only")
    with pytest.raises(StoreWriteFailed):
        await engine.release(key("K"))  # the write of K fails...
    node.store.fail_next("removed")
    with pytest.raises(StoreWriteFailed):
        await engine.assign(key("K2"))  # ...and so does a brand-new one
    await engine.assign(key("L"))  # then the write of L succeeds
    on_disk = {a.key: a for a in read_disk(node.path).allocations}
    assert on_disk[key("K")] == k_before, "K on disk in its old form"
    assert key("K2") not in on_disk and key("K2") not in engine.state.allocations()
    assert "K" not in engine.state.intents() and "K" not in (read_disk(node.path).intents)
    node.check()
    await node.restart()
    assert node.engine is not None
    assert node.engine.state.allocations()[key("K")] == k_before
    node.check()


async def test_s07_two_address_allocation_failing_half_way_takes_neither(node: NodeFixture) -> None:
    engine = await node.open()
    await node.seed(enis=1, per_eni=4)
    assert node.store is not None
    node.store.fail_next("half_way")
    with pytest.raises(StoreWriteFailed):
        await engine.assign(key("two"), count=2)
    assert not engine.state.owned_addresses()
    assert read_disk(node.path).allocations == ()
    node.check()
    both = await engine.assign(key("two"), count=2)
    assert len(both.addresses) == 2 and len(set(both.addresses)) == 2
    assert {engine.state.owner_of(a) for a in both.addresses} == {key("two")}
    node.check()


async def test_s07_two_addresses_come_from_one_eni_or_not_at_all(node: NodeFixture) -> None:
    engine = await node.open()
    await node.seed(enis=2, per_eni=1)  # two free addresses, but one per ENI
    with pytest.raises(NoAddressAvailable):
        await engine.assign(key("two"), count=2)
    assert not engine.state.owned_addresses()
    node.check()
