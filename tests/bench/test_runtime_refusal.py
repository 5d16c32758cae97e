"""The simulated runtime's shortcut (`bench.cluster.node.Refusal`): a retry is refused without the
engine only while the engine's answer could not differ from the node's last refusal."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from bench.cluster.node import Refusal
from ipamd.engine.engine import Engine
from ipamd.errors import NoAddressAvailable
from tests.support.node import NodeFixture, key

RETRY_S = 1.0


@dataclass
class Counted:
    """What `Refusal` reads of a simulated node: its engine and the commits it counted."""

    engine: Engine
    commits: int = 0

    def counted_commit(self) -> None:
        self.commits += 1


async def _full_node(node: NodeFixture) -> Counted:
    engine = await node.open()
    counted = Counted(engine)
    engine.subscribe(lambda _mutation, _removed: counted.counted_commit())
    await node.seed(enis=1, per_eni=2)
    for pod in ("a", "b"):
        await engine.assign(key(pod))
    return counted


async def _refused(counted: Counted, node: NodeFixture) -> Refusal:
    with pytest.raises(NoAddressAvailable):
        await counted.engine.assign(key("waiting"))
    return Refusal.of(counted, node.clock.now())


async def test_a_refusal_stands_for_one_retry_interval_while_nothing_changes(
    node: NodeFixture,
) -> None:
    counted = await _full_node(node)
    refusal = await _refused(counted, node)
    node.clock.advance(RETRY_S / 2)
    assert refusal.stands(counted, node.clock.now(), RETRY_S)
    node.clock.advance(RETRY_S / 2)
    assert not refusal.stands(counted, node.clock.now(), RETRY_S), (
        "the engine hears a refused ADD every retry interval"
    )


async def test_a_commit_or_an_address_out_of_its_cooldown_ends_it(node: NodeFixture) -> None:
    counted = await _full_node(node)
    refusal = await _refused(counted, node)
    await counted.engine.release(key("a"))  # committed: an answer may differ
    now = node.clock.now()
    assert not refusal.stands(counted, now, RETRY_S)
    with pytest.raises(NoAddressAvailable):  # the address is cooling
        await counted.engine.assign(key("waiting"))
    refusal = Refusal.of(counted, now)
    cooldown_s = counted.engine.settings.cooldown_s
    assert refusal.free_at_s == pytest.approx(now + cooldown_s)
    node.clock.advance(cooldown_s)
    assert not refusal.stands(counted, node.clock.now(), cooldown_s + RETRY_S), (
        "out of its cooldown, the address may go to the next ADD"
    )
    assert (await counted.engine.assign(key("waiting"))).addresses


async def test_an_eni_held_back_ends_it(node: NodeFixture) -> None:
    counted = await _full_node(node)
    refusal = await _refused(counted, node)
    eni_id = next(iter(counted.engine.state.enis()))
    counted.engine.close_subnets({counted.engine.state.enis()[eni_id].subnet_id})
    assert not refusal.stands(counted, node.clock.now(), RETRY_S)


async def test_one_retry_interval_later_it_no_longer_stands_however_the_clock_rounds(
    node: NodeFixture,
) -> None:
    counted = await _full_node(node)
    refusal = await _refused(counted, node)
    epoch = 1_700_000_000.0
    for t in (0.1, 0.3, 0.7, 12.9, 1234.567):
        at = epoch + t
        shifted = Refusal(at, refusal.commits, refusal.held, refusal.free_at_s)
        # The simulated clock reads epoch + the loop's time: one retry later may read a hair early.
        assert not shifted.stands(counted, epoch + (t + RETRY_S), RETRY_S)
        assert shifted.stands(counted, epoch + (t + RETRY_S / 2), RETRY_S)
