"""S2, S17, S27, S28: delete intents — DEL before ADD, unknown and repeated DELs, every key form of
one container, and intents that grow without making DEL slower.

What each scenario replays, and which tests prove it: docs/failure-scenarios.md."""

from __future__ import annotations

import pytest

from datastore.readonly import read_disk
from datastore.records import IntentRecord, Mutation
from ipamd.errors import DeleteIntentActive
from tests.support.node import NodeFixture, key


async def test_s02_del_before_add_refuses_the_late_add(node: NodeFixture) -> None:
    engine = await node.open()
    await node.seed(enis=1, per_eni=4)
    assert await engine.release(key("X")) == ()
    first_del = engine.state.intents()["X"]
    ttl = engine.settings.intent_ttl_s
    with pytest.raises(DeleteIntentActive) as refused:
        await engine.assign(key("X"))
    assert refused.value.code == "delete_intent" and refused.value.status == 409
    assert engine.state.allocations() == {}
    # Retried DELs do not extend the window...
    node.clock.advance(ttl / 2)
    await engine.release(key("X"))
    assert engine.state.intents()["X"] == first_del
    assert read_disk(node.path).intents["X"] == first_del
    node.clock.advance(ttl / 2 - 1)
    with pytest.raises(DeleteIntentActive):
        await engine.assign(key("X"))
    # ...a new container ID is unaffected at all times...
    assert (await engine.assign(key("Y"))).addresses
    # ...and after the TTL counted from the first DEL, ADD for X is served again.
    node.clock.advance(1)
    assert (await engine.assign(key("X"))).addresses
    node.check()


async def test_s02_intent_survives_restart(node: NodeFixture) -> None:
    engine = await node.open()
    await node.seed(enis=1, per_eni=2)
    await engine.release(key("X"))
    engine = await node.restart()
    with pytest.raises(DeleteIntentActive):
        await engine.assign(key("X"))
    node.check()


async def test_s17_unknown_and_repeated_dels_succeed_and_change_nothing_else(
    node: NodeFixture,
) -> None:
    engine = await node.open()
    await node.seed(enis=1, per_eni=4)
    live = await engine.assign(key("live"))
    assert await engine.release(key("never-seen")) == ()
    commits = node.store.commits if node.store else 0
    for _ in range(3):
        assert await engine.release(key("never-seen")) == ()
    assert node.store is not None and node.store.commits == commits, "repeated DEL writes nothing"
    assert engine.state.allocations() == {key("live"): live}
    node.check()


async def test_s27_del_covers_every_allocation_of_the_container(node: NodeFixture) -> None:
    engine = await node.open()
    await node.seed(enis=1, per_eni=6)
    eth0 = await engine.assign(key("X", "eth0", "net-a"))
    eth1 = await engine.assign(key("X", "eth1", "net-b"))
    other = await engine.assign(key("Y", "eth0", "net-a"))
    released = await engine.release(key("X", "eth0", "net-a"))
    assert set(released) == {eth0, eth1}
    assert engine.state.allocations() == {key("Y", "eth0", "net-a"): other}
    for ifname, network in [("eth0", "net-a"), ("eth1", "net-b"), ("eth9", "net-c")]:
        with pytest.raises(DeleteIntentActive):
            await engine.assign(key("X", ifname, network))
    node.check()


async def test_s28_intents_are_pruned_and_del_work_stays_bounded(node: NodeFixture) -> None:
    engine = await node.open()
    await node.seed(enis=1, per_eni=4)
    settings = engine.settings
    ttl = settings.intent_ttl_s
    # A burst of 30,000 intents at once (one transaction, as a mass teardown would leave them).
    burst = tuple(IntentRecord(f"burst-{i}", node.clock.now()) for i in range(30_000))
    await engine.commit_planned(lambda state, now: (Mutation(put_intents=burst), None))
    assert len(engine.state.intents()) == 30_000
    assert node.store is not None
    # Sustained DELs at one per second for longer than the TTL, past the burst's expiry.
    seconds = int(ttl) + 1_200
    largest_prune = 0
    for second in range(seconds):
        node.clock.advance(1)
        await engine.release(key(f"steady-{second}"))
        last = node.store.last_mutation
        assert last is not None
        largest_prune = max(largest_prune, len(last.delete_intents))
    # Each DEL removes at most one batch of expired intents: its cost does not grow with their number.
    assert largest_prune <= settings.prune_batch
    # The burst is gone and only intents younger than the TTL remain.
    now = node.clock.now()
    assert not any(cid.startswith("burst-") for cid in engine.state.intents())
    assert all(now < t + ttl for t in engine.state.intents().values())
    assert len(engine.state.intents()) <= ttl + 1
    node.check()
