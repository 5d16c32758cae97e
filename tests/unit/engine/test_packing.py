"""Packing: a new allocation goes to the fullest unit on the fullest ENI with a free address, so whole
prefixes and ENIs empty out and can be returned."""

from __future__ import annotations

import pytest

from ipamd.errors import NoAddressAvailable
from ipamd.model import AddressState
from tests.support.node import NodeFixture, key


async def test_fills_the_fullest_eni_first(node: NodeFixture) -> None:
    engine = await node.open()
    layout = await node.seed(enis=3, per_eni=3)
    first = await engine.assign(key("a"))
    second = await engine.assign(key("b"))
    third = await engine.assign(key("c"))
    assert {first.eni_id, second.eni_id, third.eni_id} == {"eni-0000"}
    fourth = await engine.assign(key("d"))
    assert fourth.eni_id != "eni-0000"
    assert {a.unit_cidrs[0] for a in (first, second, third)} == set(layout[0])
    node.check()


async def test_prefers_the_eni_holding_more_pods_after_churn(node: NodeFixture) -> None:
    engine = await node.open()
    await node.seed(enis=2, per_eni=4)
    for name in "abcd":
        await engine.assign(key(name))  # fills eni-0000
    e = await engine.assign(key("e"))
    assert e.eni_id == "eni-0001"
    await engine.release(key("a"))
    node.clock.advance(engine.settings.cooldown_s)
    # eni-0000 now holds 3 and eni-0001 holds 1: the next pod joins the fuller one.
    assert (await engine.assign(key("f"))).eni_id == "eni-0000"
    node.check()


async def test_prefix_mode_fills_one_prefix_before_opening_the_next(node: NodeFixture) -> None:
    engine = await node.open()
    await node.seed(enis=1, per_eni=3, kind="prefix")
    allocs = [await engine.assign(key(f"p{i}")) for i in range(17)]
    units = [a.unit_cidrs[0] for a in allocs]
    assert len(set(units[:16])) == 1, "the first 16 pods share one /28"
    assert units[16] != units[0]
    snapshot = engine.snapshot()
    assert (
        snapshot.counts[AddressState.ASSIGNED] == 17
        and snapshot.counts[AddressState.FREE] == 48 - 17
    )
    node.check()


async def test_cooling_addresses_are_not_handed_out(node: NodeFixture) -> None:
    engine = await node.open()
    await node.seed(enis=1, per_eni=2)
    a = await engine.assign(key("a"))
    await engine.release(key("a"))
    b = await engine.assign(key("b"))
    assert b.addresses != a.addresses
    assert engine.snapshot().counts[AddressState.COOLING] == 1
    node.clock.advance(engine.settings.cooldown_s - 1)
    engine = await node.restart()  # cooldowns survive a restart
    assert engine.snapshot().counts[AddressState.COOLING] == 1
    node.clock.advance(1)
    assert engine.snapshot().counts[AddressState.COOLING] == 0
    assert (await engine.assign(key("c"))).addresses == a.addresses
    node.check()


async def test_prefix_mode_never_hands_out_a_cooling_address(node: NodeFixture) -> None:
    """A /28 whose lowest address is cooling: every other address of it goes first, then ADD waits;
    the cooling one is handed out only once its cooldown is over."""
    engine = await node.open()
    [[prefix]] = await node.seed(enis=1, per_eni=1, kind="prefix")
    first = await engine.assign(key("first"))
    assert first.unit_cidrs == (prefix,)
    [cooling] = first.addresses
    await engine.release(key("first"))
    assert engine.snapshot().counts[AddressState.COOLING] == 1
    handed = [await engine.assign(key(f"p{i}")) for i in range(15)]
    assert {a.unit_cidrs for a in handed} == {(prefix,)}, "the 15 others of the same /28"
    assert cooling not in {address for a in handed for address in a.addresses}
    assert len({address for a in handed for address in a.addresses}) == 15
    with pytest.raises(NoAddressAvailable):
        await engine.assign(key("while-cooling"))
    node.clock.advance(engine.settings.cooldown_s - 1)
    with pytest.raises(NoAddressAvailable):
        await engine.assign(key("still-cooling"))
    node.clock.advance(1)
    assert (await engine.assign(key("cooled"))).addresses == (cooling,)
    node.check()
