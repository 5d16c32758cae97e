"""Repair from evidence: stale owners released, quarantine cleared or restored (S10, S3).

What each scenario replays, and which tests prove it: docs/failure-scenarios.md."""

from __future__ import annotations

import sqlite3

from ipamd.reconcile.repair import apply_repair, plan_repair
from tests.scenarios.test_state_file import _file_with_duplicate_owner
from tests.support.node import NodeFixture, key


async def test_s10_repair_clears_the_quarantined_duplicate(node: NodeFixture) -> None:
    address, _ = await _file_with_duplicate_owner(node)
    engine = await node.open()  # Y kept, X quarantined
    plan = plan_repair(engine.state, frozenset({"Y", "Z"}), node.clock.now())
    assert plan.drop_quarantine == (key("X"),) and plan.release == ()
    assert "drop quarantined X" in plan.describe()[0]
    before = engine.state.to_image()
    assert engine.state.to_image() == before, "planning is a dry run"
    await apply_repair(engine, plan)
    assert engine.state.quarantine() == {}
    assert engine.state.owner_of(address) == key("Y")
    assert plan_repair(engine.state, frozenset({"Y", "Z"}), node.clock.now()).is_empty()
    node.check()


async def test_repair_releases_stale_owners_and_restores_a_live_quarantined_claim(
    node: NodeFixture,
) -> None:
    engine = await node.open()
    await node.seed(enis=1, per_eni=4)
    await engine.assign(key("live"))
    gone = await engine.assign(key("gone"))
    await engine.assign(key("runs-on"))
    await node.close()
    # A hand edit lost the index and an unexplained claim appeared: quarantined at open.
    with sqlite3.connect(node.path) as conn:
        conn.execute(
            "UPDATE allocation_addresses SET unit_cidr = '10.9.9.9/32' WHERE allocation_id"
            " = (SELECT id FROM allocations WHERE container_id = 'runs-on')"
        )
    engine = await node.open()
    assert set(engine.state.quarantine()) == {key("runs-on")}
    plan = plan_repair(engine.state, frozenset({"live", "runs-on"}), node.clock.now())
    assert plan.release == (key("gone"),)
    assert [r.key for r in plan.restore_quarantine] == [key("runs-on")]
    await apply_repair(engine, plan)
    assert set(engine.state.allocations()) == {key("live"), key("runs-on")}
    assert engine.state.owner_of(gone.addresses[0]) is None
    assert "gone" in engine.state.intents(), "released as its missed DEL would have"
    node.check()
