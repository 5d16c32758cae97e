"""IPv6 mode's one unit, a /80 prefix: pods get /128 addresses from it, lowest first from ::1, and it
is never enumerated (2^48 addresses): the state, the snapshot, restore and the invariants read only
the addresses in use. Idempotence, delete intents, cooldowns, max pods and restart are the same as
IPv4's, and tested on both families in `test_assign_release.py`."""

from __future__ import annotations

import ipaddress
from dataclasses import replace

import pytest

from cloud.fakes import FakeEc2
from datastore.records import AllocationRecord, EniRecord, Mutation, UnitRecord
from ipamd.engine.allocator import EngineParams
from ipamd.engine.engine import Engine
from ipamd.engine.pick_v6 import pick_v6_addresses
from ipamd.engine.state import NodeState
from ipamd.engine.units import unit_addresses, unit_holds
from ipamd.engine.units_v6 import V6_HOSTS, V6Unit
from ipamd.model import AddressState
from ipamd.pool.release import NeverReleased, Releaser
from tests.support.node import NodeFixture, key

PREFIX = "2600:1f14:abc:d00:1234::/80"
OTHER = "2600:1f14:abc:d00:5678::/80"


def v6(offset: int, prefix: str = PREFIX) -> str:
    """The address `offset` places above the prefix, as ipamd writes it."""
    return str(ipaddress.IPv6Network(prefix)[offset])


async def v6_node(node: NodeFixture, settings: EngineParams | None = None) -> Engine:
    """A node whose primary ENI holds one /80, as IPv6 mode sets it up, and picks as IPv6 does."""
    node.settings = replace(settings or node.settings, pick=pick_v6_addresses)
    engine = await node.open()
    await engine.add_eni(EniRecord("eni-0000", 0, "subnet-1", True, node.clock.now()))
    await engine.add_units("eni-0000", [PREFIX], "ipv6_prefix")
    return engine


async def test_adds_take_the_lowest_addresses_from_one_up(node: NodeFixture) -> None:
    engine = await v6_node(node)
    records = [await engine.assign(key(f"pod-{n}")) for n in range(3)]
    assert [r.addresses for r in records] == [(v6(1),), (v6(2),), (v6(3),)]
    assert all(r.unit_cidrs == (PREFIX,) and r.eni_id == "eni-0000" for r in records)
    two = await engine.assign(key("multi"), count=2)
    assert two.addresses == (v6(4), v6(5))
    node.check()


async def test_the_state_never_lists_the_prefix_only_what_is_in_use(node: NodeFixture) -> None:
    engine = await v6_node(node)
    await engine.assign(key("a"))
    await engine.assign(key("b"))
    await engine.release(key("a"))
    state = engine.state
    assert state.unlisted(PREFIX) and state.unit_size(PREFIX) == V6_HOSTS == 2**48 - 1
    assert state.addresses_of(PREFIX) == (v6(1), v6(2)), "owned or cooling, lowest first"
    assert state.owned_in(PREFIX) == 1
    assert state.holds(PREFIX, v6(0xFFFF_FFFF_FFFF)) and not state.holds(PREFIX, v6(0))
    assert not state.holds(PREFIX, v6(1, OTHER)) and not state.holds(PREFIX, "10.0.0.1")
    with pytest.raises(ValueError, match="never enumerated"):
        unit_addresses(PREFIX)
    assert unit_holds(PREFIX, "ipv6_prefix", v6(7)) and not unit_holds(PREFIX, "ipv6_prefix", "::1")
    # One text per address: another spelling of ::7 is not one ipamd handed out.
    assert not unit_holds(PREFIX, "ipv6_prefix", "2600:1f14:abc:d00:1234:0:0:7")
    assert not state.holds(PREFIX, v6(2).upper())


async def test_the_snapshot_counts_the_free_as_the_pods_still_allowed(node: NodeFixture) -> None:
    engine = await v6_node(node, EngineParams(max_pods=110))
    for n in range(3):
        await engine.assign(key(f"pod-{n}"))
    await engine.release(key("pod-0"))
    snap = engine.snapshot()
    (eni,) = snap.enis
    (unit,) = eni.units
    assert unit.kind == "ipv6_prefix" and unit.unlisted == 110 - 2
    assert unit.addresses == (
        (v6(1), AddressState.COOLING),
        (v6(2), AddressState.ASSIGNED),
        (v6(3), AddressState.ASSIGNED),
    )
    assert snap.counts[AddressState.FREE] == 108 and snap.counts[AddressState.ASSIGNED] == 2
    assert snap.counts[AddressState.COOLING] == 1 and eni.counts == snap.counts
    node.clock.advance(engine.settings.cooldown_s)
    (unit,) = engine.snapshot().enis[0].units
    assert [a for a, _ in unit.addresses] == [v6(2), v6(3)], "a cooled address is free, unlisted"


async def test_a_v6_claim_outside_its_prefix_is_quarantined_at_restore(node: NodeFixture) -> None:
    engine = await v6_node(node)
    await engine.assign(key("good"))
    stray = AllocationRecord(key("stray"), (v6(1, OTHER),), (PREFIX,), "eni-0000", 1.0)
    await engine.commit_planned(lambda state, now: (Mutation(put_allocations=(stray,)), None))
    engine = await node.restart()
    assert list(engine.state.quarantine()) == [key("stray")]
    assert "unexplained owner" in engine.state.quarantine()[key("stray")].reason
    assert list(engine.state.allocations()) == [key("good")]
    node.check()


async def test_a_state_file_of_another_instance_quarantines_its_v6_pods(node: NodeFixture) -> None:
    engine = await v6_node(node)
    await engine.claim_instance("i-0000000000000dead")
    held = await engine.assign(key("old-pod"))
    assert await engine.claim_instance("i-0123456789abcdef0")
    state = engine.state
    assert list(state.quarantine()) == [key("old-pod")]
    assert state.quarantine()[key("old-pod")].addresses == held.addresses
    assert state.units() == {} and state.allocations() == {}
    node.check()
    # The new instance's /80 arrives afresh from EC2, and its first address is free again.
    await engine.add_eni(EniRecord("eni-0000", 0, "subnet-1", True, node.clock.now()))
    await engine.add_units("eni-0000", [OTHER], "ipv6_prefix")
    assert (await engine.assign(key("new-pod"))).addresses == (v6(1, OTHER),)
    node.check()


def test_a_prefix_dropped_while_owned_keeps_its_owners_until_they_go() -> None:
    state = NodeState()
    eni = EniRecord("eni-0000", 0, "subnet-1", True, 0.0)
    unit = UnitRecord(PREFIX, "eni-0000", "ipv6_prefix", "active", 0.0)
    alloc = AllocationRecord(key("a"), (v6(9),), (PREFIX,), "eni-0000", 0.0)
    state.apply(Mutation(put_enis=(eni,), put_units=(unit,), put_allocations=(alloc,)))
    state.apply(Mutation(delete_units=(PREFIX,)))
    state.apply(Mutation(put_units=(unit,)))
    assert state.addresses_of(PREFIX) == (v6(9),)
    state.apply(Mutation(delete_allocations=(key("a"),)))
    assert state.addresses_of(PREFIX) == () and state.owned_in(PREFIX) == 0


async def test_an_ipv4_node_is_untouched(node: NodeFixture) -> None:
    engine = await node.open()
    await node.seed(enis=1, per_eni=2)
    record = await engine.assign(key("a"))
    assert record.addresses == ("10.0.0.10",)
    assert not engine.state.unlisted("10.0.0.10/32") and engine.state.unit_size("10.0.0.10/32") == 1
    assert all(u.unlisted is None for e in engine.snapshot().enis for u in e.units)
    node.check()


@pytest.mark.parametrize(
    "prefix", [PREFIX, "2600:0:0:1:0::/80", "2600:1f14:0:0:ffff::/80", "::/80"]
)
def test_addresses_are_written_as_ipaddress_writes_them(prefix: str) -> None:
    """The owner index and the cooldowns key addresses by their text: the fast parse and format
    must give the one canonical form (RFC 5952), in the IPv4-mapped range too."""
    unit = V6Unit(prefix)
    net = ipaddress.IPv6Network(prefix)
    for offset in (1, 2, 0xFFFF, 0x1_0000, 0xFFFF_FFFF, 0x1_0000_0000, 0xFFFF_0000_0001, V6_HOSTS):
        text = unit.address(offset)
        assert text == str(net[offset])
        assert unit.offset(text) == offset
    assert unit.offset(str(net[0])) is None and unit.offset("10.0.0.1") is None
    assert unit.offset(str(net.broadcast_address + 1)) is None


async def test_the_pool_never_gives_a_80_back(node: NodeFixture) -> None:
    """The releaser refuses the /80 before marking anything, and calls no EC2."""
    engine = await v6_node(node)
    releaser = Releaser(engine, "i-0123", lambda marked: set())
    ec2 = FakeEc2(node.clock)
    with pytest.raises(NeverReleased, match="never released"):
        await releaser.release_units((PREFIX,), ec2)
    assert engine.state.units()[PREFIX].state == "active"
    assert sum(ec2.calls.values()) == 0
    node.check()
