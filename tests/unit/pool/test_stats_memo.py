"""The pool manager's `StatsMemo` counts what `node_stats` counts, at every instant: after commits,
while addresses cool and once they are out of their cooldown, as ENIs age, and on another state."""

from __future__ import annotations

from datastore.records import EniRecord
from ipamd.engine.state import NodeState
from ipamd.pool.stats import StatsMemo, mature_enis, node_stats
from ipamd.sizing.inputs import PoolTargets
from tests.support.node import NodeFixture, key


async def test_the_memo_counts_what_node_stats_counts(node: NodeFixture) -> None:
    engine = await node.open()
    await node.seed(enis=2, per_eni=4)
    memo = StatsMemo()
    cooldown_s = engine.settings.cooldown_s

    def same() -> None:
        now = node.clock.now()
        assert memo(engine.state, now, cooldown_s) == node_stats(engine.state, now, cooldown_s)

    same()
    for pod in "abcde":
        await engine.assign(key(pod))
        same()
    node.clock.advance(7)
    same()  # the ENIs' ages moved on, nothing else
    await engine.release(key("a"))
    await engine.release(key("b"))
    same()  # two addresses cooling
    node.clock.advance(cooldown_s / 2)
    await engine.assign(key("f"))
    same()
    node.clock.advance(cooldown_s / 2)
    same()  # out of their cooldown: free again, with no commit
    other = NodeState.from_image(engine.state.to_image())
    now = node.clock.now()
    assert memo(other, now, cooldown_s) == node_stats(other, now, cooldown_s)


async def test_the_memo_keeps_the_counts_while_nothing_changed(node: NodeFixture) -> None:
    engine = await node.open()
    await node.seed(enis=1, per_eni=3)
    memo = StatsMemo()
    cooldown_s = engine.settings.cooldown_s
    first = memo(engine.state, node.clock.now(), cooldown_s)
    node.clock.advance(5)
    again = memo(engine.state, node.clock.now(), cooldown_s)
    assert again.enis[0].units is first.enis[0].units, "counted once"
    assert again.enis[0].age_s == first.enis[0].age_s + 5
    await engine.assign(key("a"))
    after = memo(engine.state, node.clock.now(), cooldown_s)
    assert after.enis[0].units is not first.enis[0].units
    assert sum(u.assigned for e in after.enis for u in e.units) == 1


async def test_the_counts_are_counted_again_the_instant_an_address_leaves_its_cooldown(
    node: NodeFixture,
) -> None:
    engine = await node.open()
    await node.seed(enis=1, per_eni=4)
    memo = StatsMemo()
    cooldown_s = engine.settings.cooldown_s
    for pod in "ab":
        await engine.assign(key(pod))
    await engine.release(key("a"))
    node.clock.advance(3)
    await engine.release(key("b"))
    released = node.clock.now()
    for offset in (0.0, cooldown_s - 3 - 1e-6, cooldown_s - 3, cooldown_s - 1e-6, cooldown_s):
        node.clock.advance(released + offset - node.clock.now())
        now = node.clock.now()
        assert memo(engine.state, now, cooldown_s) == node_stats(engine.state, now, cooldown_s), (
            offset
        )
    cooling = sum(u.cooling for e in memo(engine.state, now, cooldown_s).enis for u in e.units)
    assert cooling == 0, "both out of their cooldown without a commit"


async def test_the_mature_enis_are_those_old_enough_at_every_instant(node: NodeFixture) -> None:
    engine = await node.open()
    await node.seed(enis=1, per_eni=2)
    node.clock.advance(20)
    await engine.add_eni(EniRecord("eni-late", 1, "subnet-1", False, node.clock.now()))
    node.clock.advance(-20)
    memo = StatsMemo()
    targets = PoolTargets(min_eni_lifetime_s=60.0)
    counted = memo.counts(engine.state, node.clock.now(), engine.settings.cooldown_s)
    start = node.clock.now()
    seen: list[frozenset[str]] = []
    for offset in (0.0, 59.0, 60.0 - 1e-6, 60.0, 79.0, 80.0 - 1e-6, 80.0, 81.0):
        now = start + offset
        mature = memo.mature(counted, now, targets)
        assert mature == mature_enis(counted, now, targets), offset
        seen.append(mature)
    assert [len(m) for m in seen] == [0, 0, 0, 1, 1, 1, 2, 2]
    assert memo.mature(counted, start + 99.0, targets) is seen[-1], "kept once all are mature"
