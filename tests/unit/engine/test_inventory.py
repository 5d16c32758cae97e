"""Inventory states: releasing units are never handed out and never hold owners; units EC2 stops listing
become lost while owned, never free; a unit that comes back is usable again.

What each scenario replays, and which tests prove it: docs/failure-scenarios.md."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ipamd.errors import InventoryError, NoAddressAvailable
from ipamd.model import AddressState
from tests.support.node import NodeFixture, key


async def test_only_whole_free_units_are_marked_releasing(node: NodeFixture) -> None:
    engine = await node.open()
    [units] = await node.seed(enis=1, per_eni=3)
    owned = await engine.assign(key("a"))
    cooling = await engine.assign(key("b"))
    await engine.release(key("b"))
    marked = await engine.begin_release(units)
    assert set(marked) == set(units) - {owned.unit_cidrs[0], cooling.unit_cidrs[0]}
    with pytest.raises(NoAddressAvailable):
        await engine.assign(key("c"))  # the releasing unit is not handed out
    node.check()
    engine = await node.restart()  # S12: still releasing after a restart
    assert engine.snapshot().counts[AddressState.RELEASING] == len(marked)
    await engine.abort_release(marked)
    assert (await engine.assign(key("c"))).unit_cidrs[0] in marked
    node.check()


async def test_finished_release_leaves_and_a_returning_unit_is_free_again(
    node: NodeFixture,
) -> None:
    engine = await node.open()
    [units] = await node.seed(enis=1, per_eni=2)
    marked = await engine.begin_release(units[:1])
    await engine.finish_release(marked)
    assert units[0] not in engine.state.units() and units[0] in engine.state.released()
    await engine.add_units("eni-0000", units[:1], "ip")  # S20: EC2 gives it back
    assert units[0] not in engine.state.released()
    assert engine.snapshot().counts[AddressState.FREE] == 2
    node.check()


async def test_owned_units_ec2_no_longer_lists_become_lost_never_free(node: NodeFixture) -> None:
    engine = await node.open()
    [units] = await node.seed(enis=1, per_eni=3)
    a = await engine.assign(key("a"))
    await engine.units_gone(units)
    snapshot = engine.snapshot()
    assert snapshot.counts[AddressState.LOST] == 1 and snapshot.counts[AddressState.FREE] == 0
    with pytest.raises(NoAddressAvailable):
        await engine.assign(key("b"))
    node.check()
    # S3: EC2 gives the unit back while the record still claims it: assigned, not free.
    await engine.add_units("eni-0000", a.unit_cidrs, "ip")
    assert engine.snapshot().counts[AddressState.ASSIGNED] == 1
    await engine.units_gone(a.unit_cidrs)
    await engine.release(key("a"))  # the owner's DEL clears a lost address
    assert a.unit_cidrs[0] not in engine.state.units()
    node.check()


async def test_units_on_unknown_or_other_enis_are_refused(node: NodeFixture) -> None:
    engine = await node.open()
    [units] = await node.seed(enis=1, per_eni=1)
    with pytest.raises(InventoryError):
        await engine.add_units("eni-missing", ["10.9.9.9/32"], "ip")
    await node.seed(enis=2, per_eni=1)
    with pytest.raises(InventoryError):
        await engine.add_units("eni-0001", units, "ip")
    node.check()


async def test_an_eni_record_without_link_facts_gets_them_from_ec2_once(node: NodeFixture) -> None:
    engine = await node.open()
    await node.seed(enis=2, per_eni=1)  # records as a version-1 state file holds them: no MAC
    known = engine.state.enis()["eni-0001"]
    assert (known.mac, known.primary_ip) == ("", "")
    described = replace(known, mac="02:00:00:00:00:01", primary_ip="10.0.1.5", added_at=99.0)
    await engine.add_eni(described)
    filled = engine.state.enis()["eni-0001"]
    assert (filled.mac, filled.primary_ip) == ("02:00:00:00:00:01", "10.0.1.5")
    assert filled.added_at == known.added_at, "the rest of the record is the inventory's own"
    await engine.add_eni(replace(described, mac="", primary_ip=""))
    assert engine.state.enis()["eni-0001"] == filled, "an answer without facts changes nothing"
    engine = await node.restart()
    assert engine.state.enis()["eni-0001"] == filled
    node.check()
