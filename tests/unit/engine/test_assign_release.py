"""ADD and DEL on the engine, the same in either address family: a retried ADD answers the same
address and writes nothing, a DEL leaves an intent that refuses a late ADD of its container, a
released address cools before another pod gets it (at once with no cooldown), max pods bounds the
node, and a restart reads back every allocation and cooldown. Each test runs on an IPv4 node (one
ENI of secondary IPs, the default pick) and on an IPv6 node (the primary ENI's /80, IPv6's pick),
as the composition sets each up (`ipamd.node.family`); what only one family does is tested beside
it (`test_packing.py`, `test_ipv6_prefix.py`)."""

from __future__ import annotations

import pytest

from ipamd.errors import DeleteIntentActive, MaxPodsReached
from tests.support.families import Family, open_node
from tests.support.node import NodeFixture, key


async def test_pods_get_the_lowest_free_addresses_in_turn(
    node: NodeFixture, family: Family
) -> None:
    engine = await open_node(node, family)
    records = [await engine.assign(key(f"pod-{n}")) for n in range(3)]
    assert [r.addresses for r in records] == [(family.nth(n),) for n in (1, 2, 3)]
    assert all(r.eni_id == "eni-0000" for r in records)
    node.check()


async def test_a_retried_add_returns_the_same_address(node: NodeFixture, family: Family) -> None:
    engine = await open_node(node, family)
    first = await engine.assign(key("pod"))
    assert node.store is not None
    commits = node.store.commits
    assert await engine.assign(key("pod")) == first
    assert node.store.commits == commits, "a retried ADD writes nothing"
    node.check()


async def test_a_del_records_its_intent_and_the_address_cools(
    node: NodeFixture, family: Family
) -> None:
    engine = await open_node(node, family)
    a = await engine.assign(key("a"))
    b = await engine.assign(key("b"))
    (released,) = await engine.release(key("a"))
    assert released == a
    with pytest.raises(DeleteIntentActive):
        await engine.assign(key("a"))
    assert engine.state.is_cooling(family.nth(1), node.clock.now(), engine.settings.cooldown_s)
    # The first address cools: the next pod steps over it (and over the second, owned).
    c = await engine.assign(key("c"))
    assert (b.addresses, c.addresses) == ((family.nth(2),), (family.nth(3),))
    node.check()
    node.clock.advance(engine.settings.cooldown_s)
    d = await engine.assign(key("d"))
    assert d.addresses == (family.nth(1),), "its cooldown over, the address is handed out again"
    assert family.nth(1) not in engine.state.cooldowns(), "taking it ends its cooldown record"
    node.check()


async def test_without_a_cooldown_a_released_address_is_reused_at_once(
    node: NodeFixture, family: Family
) -> None:
    engine = await open_node(node, family, cooldown_s=0.0)
    await engine.assign(key("a"))
    await engine.release(key("a"))
    assert (await engine.assign(key("b"))).addresses == (family.nth(1),)
    node.check()


async def test_max_pods_bounds_the_node(node: NodeFixture, family: Family) -> None:
    engine = await open_node(node, family, max_pods=2)
    await engine.assign(key("a"))
    await engine.assign(key("b"))
    with pytest.raises(MaxPodsReached):
        await engine.assign(key("c"))
    await engine.release(key("a"))
    node.clock.advance(engine.settings.cooldown_s)
    assert (await engine.assign(key("c"))).addresses == (family.nth(1),), "a DEL makes room"
    node.check()


async def test_restart_restores_the_allocations_and_what_is_cooling(
    node: NodeFixture, family: Family
) -> None:
    engine = await open_node(node, family)
    for n in range(4):
        await engine.assign(key(f"pod-{n}"))
    await engine.release(key("pod-1"))
    before = engine.state.to_image()
    engine = await node.restart()
    assert engine.state.to_image() == before
    assert engine.state.quarantine() == {}
    node.check()
    assert (await engine.assign(key("next"))).addresses == (family.nth(5),), "pod-1's still cools"
    node.check()
