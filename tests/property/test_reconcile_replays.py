"""The three bugs the reconcile state machine (`test_reconcile_stateful`) found, replayed step by step
as regression tests."""

from __future__ import annotations

import pytest

from ipamd.sizing.inputs import PoolTargets
from tests.property.test_reconcile_stateful import GRACE_S, ReconcileMachine

# -- known bugs: minimal replays ------------------------------------------------------------------
# Each was found by the machine above (with the fault, or the adopt, switched on) and is replayed here
# step by step, with the worst lag the premise allows (EC2's Describe 60 s behind, grace 60 s). All
# three end the same way: an ADD is handed an address EC2 no longer lists on an attached ENI. The
# common cause: right after its own mutation, the pool manager takes a Describe as the truth, inside
# the window in which docs/architecture.md §6.2 says EC2's listing cannot be trusted.


def replay_machine(**shape: object) -> ReconcileMachine:
    machine = ReconcileMachine()
    defaults: dict[str, object] = {
        "kind": "ip",
        "max_enis": 2,
        "per_eni": 4,
        "knobs": PoolTargets(warm_ip_target=1, min_eni_lifetime_s=0.0),
        "cooldown_s": 30.0,
        "leftovers": 2,
        "lag_s": GRACE_S,
        "lag_seed": None,
    }
    machine.boot(**{**defaults, **shape})
    return machine


def test_found_bug_1_unassign_timeout_not_settled_by_a_lagging_describe() -> None:
    """The primary ENI holds two free addresses, WARM_IP_TARGET=1: the pool returns one. EC2
    unassigns it, but the answer is lost (a read timeout), and EC2's listing taken at once still
    shows the address. The bug: the pool manager's settle step trusted that listing and made the
    unit free again, and the second ADD was handed an address EC2 no longer had. Now an unassign
    of unknown outcome leaves the units EC2 still lists `releasing` (never handed out) until the
    drift settles them with a listing taken past the grace window."""
    machine = replay_machine()
    try:
        machine.ec2.fail_next("unassign_units", after_acting=True)
        machine.pool_tick(1)
        machine.add_pod()
        machine.add_pod()  # was handed 10.0.0.6, which EC2 no longer listed
        machine.nothing_in_use_released_nothing_unlisted_handed_out()
        machine.quiesce()  # past the grace, the drift settles the release: inventory == EC2's
    finally:
        machine.teardown()


@pytest.mark.parametrize(
    ("operation", "after_acting"),
    [("detach_eni", True), ("delete_eni", False), ("delete_eni", True)],
    ids=["detach-answer-lost", "delete-not-sent", "delete-answer-lost"],
)
def test_found_bug_2_eni_release_timeout_not_settled_by_a_lagging_describe(
    operation: str, after_acting: bool
) -> None:
    """A second ENI, attached more than the lag ago, empties and is released (WARM_ENI_TARGET=1,
    MIN_ENI_LIFETIME=0). EC2 detaches it; then the detach's answer is lost, or the delete times out
    before or after EC2 acted, and EC2's listing taken at once still shows the ENI attached. The
    bug: the pool manager's ENI release trusted that listing, aborted the release, and the third
    ADD was handed an address of an ENI no longer attached (or no longer existing). Now a failed delete
    after a detach that answered drops the ENI from the inventory (ENI GC deletes it), and a detach
    of unknown outcome leaves the units `releasing` until a listing past the grace window decides."""
    machine = replay_machine(
        max_enis=2, per_eni=3, knobs=PoolTargets(min_eni_lifetime_s=0.0), leftovers=1
    )
    try:
        for _ in range(3):
            machine.add_pod()  # the pool grows a second ENI on the way
        machine.clock.advance(GRACE_S + 1)
        for cid in sorted(machine.live):
            machine.delete(cid)
        machine.clock.advance(31.0)  # past the cooldown: the second ENI may go
        machine.ec2.fail_next(operation, after_acting)
        machine.pool_tick(1)
        for _ in range(3):
            machine.add_pod()  # the third was handed 10.0.0.8 of a detached ENI
        machine.nothing_in_use_released_nothing_unlisted_handed_out()
        machine.quiesce()
    finally:
        machine.teardown()


def test_found_bug_3_adopt_after_restart_honours_the_release_grace() -> None:
    """The pool returns one of two free addresses; ipamd restarts at once and adopts EC2's listing,
    which still shows the returned address. The bug: `adopt` added every listed unit it lacked,
    without the persisted `released` grace that the drift reconcile honours, and the second ADD
    was handed the returned address. Now adopt (and `_resync_eni`) take `diff_inventory`'s `new`
    units, the drift's own judgement, which skips units released within the grace window."""
    machine = replay_machine()
    try:
        machine.pool_tick(1)
        machine.restart_and_adopt()
        machine.add_pod()
        machine.add_pod()  # was handed 10.0.0.6, which EC2 no longer listed
        machine.nothing_in_use_released_nothing_unlisted_handed_out()
        machine.quiesce()
    finally:
        machine.teardown()
