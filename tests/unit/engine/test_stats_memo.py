"""The pool manager's `StatsMemo` counts what `node_stats` counts, at every instant: after commits,
while addresses cool and once they are out of their cooldown, as ENIs age, and on another state."""

from __future__ import annotations

from ipamd.engine.state import NodeState
from ipamd.engine.stats import StatsMemo, node_stats
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
