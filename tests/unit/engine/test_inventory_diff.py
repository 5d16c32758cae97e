"""diff_inventory: an ENI's units against EC2's listing, by content, leaving alone what ipamd changed
within the grace window and what a release in flight will decide."""

from __future__ import annotations

from datastore.records import (
    AllocationKey,
    AllocationRecord,
    EniRecord,
    Mutation,
    ReleasedUnitRecord,
    UnitRecord,
    UnitState,
)
from ipamd.engine.inventory import InventoryDiff, diff_inventory, within_grace
from ipamd.engine.state import NodeState

T0 = 1_700_000_000.0
GRACE = 60.0
LATER = T0 + GRACE  # every change made at T0 is just outside the window


def _unit(n: int, state: UnitState = "active", eni_id: str = "eni-a", at: float = T0) -> UnitRecord:
    return UnitRecord(f"10.0.0.{n}/32", eni_id, "ip", state, at)


def _state(*units: UnitRecord, released: tuple[ReleasedUnitRecord, ...] = ()) -> NodeState:
    state = NodeState()
    state.apply(
        Mutation(
            put_enis=(
                EniRecord("eni-a", 0, "subnet-1", True, T0),
                EniRecord("eni-b", 1, "subnet-1", False, T0),
            ),
            put_units=units,
            put_released=released,
        )
    )
    return state


def _cidrs(*ns: int) -> tuple[str, ...]:
    return tuple(f"10.0.0.{n}/32" for n in ns)


def test_a_listing_that_matches_the_inventory_is_no_difference() -> None:
    state = _state(_unit(1), _unit(2, "releasing", at=T0 + 50))
    assert diff_inventory(state, "eni-a", "ip", _cidrs(2, 1), LATER, GRACE) == InventoryDiff()


def test_listed_units_the_inventory_lacks_are_new_in_listing_order() -> None:
    state = _state(_unit(1))
    diff = diff_inventory(state, "eni-a", "ip", _cidrs(5, 1, 3, 5), LATER, GRACE)
    assert diff == InventoryDiff(to_add=_cidrs(5, 3), new=_cidrs(5, 3))


def test_a_unit_returned_within_the_grace_window_is_not_taken_back() -> None:
    returned = ReleasedUnitRecord("10.0.0.7/32", "eni-a", LATER - GRACE + 1)
    state = _state(released=(returned,))
    assert diff_inventory(state, "eni-a", "ip", _cidrs(7), LATER, GRACE) == InventoryDiff()
    past = diff_inventory(state, "eni-a", "ip", _cidrs(7), LATER + 1, GRACE)
    assert past == InventoryDiff(to_add=_cidrs(7), new=_cidrs(7))


def test_a_lost_unit_listed_again_is_found_again_not_new() -> None:
    state = _state(_unit(1, "lost"))
    diff = diff_inventory(state, "eni-a", "ip", _cidrs(2, 1), LATER, GRACE)
    assert diff == InventoryDiff(to_add=_cidrs(2, 1), new=_cidrs(2), found_again=_cidrs(1))


def test_a_lost_unit_returned_within_the_window_stays_lost() -> None:
    returned = ReleasedUnitRecord("10.0.0.1/32", "eni-a", LATER - 1)
    state = _state(_unit(1, "lost"), released=(returned,))
    assert diff_inventory(state, "eni-a", "ip", _cidrs(1), LATER, GRACE) == InventoryDiff()


def test_a_unit_listed_here_but_held_on_another_eni_is_not_new() -> None:
    state = _state(_unit(1, eni_id="eni-b"))
    assert diff_inventory(state, "eni-a", "ip", _cidrs(1), LATER, GRACE) == InventoryDiff()


def test_active_units_no_longer_listed_are_gone_unless_changed_within_the_window() -> None:
    state = _state(_unit(1), _unit(2, at=LATER - 1), _unit(3), _unit(4, "lost"))
    diff = diff_inventory(state, "eni-a", "ip", _cidrs(3), LATER, GRACE)
    assert diff == InventoryDiff(gone=_cidrs(1)), "recent 2 and lost 4 are not judged"


def test_an_owned_unit_no_longer_listed_is_gone_too() -> None:
    state = _state(_unit(1))
    state.apply(
        Mutation(
            put_allocations=(
                AllocationRecord(
                    AllocationKey("net", "pod", "eth0"), ("10.0.0.1",), _cidrs(1), "eni-a", T0
                ),
            )
        )
    )
    assert diff_inventory(state, "eni-a", "ip", (), LATER, GRACE) == InventoryDiff(gone=_cidrs(1))


def test_a_release_left_behind_is_settled_by_the_listing() -> None:
    state = _state(_unit(1, "releasing"), _unit(2, "releasing"))
    diff = diff_inventory(state, "eni-a", "ip", _cidrs(2), LATER, GRACE)
    assert diff == InventoryDiff(settled_released=_cidrs(1), settled_kept=_cidrs(2))


def test_a_release_in_flight_or_within_the_window_is_left_to_its_call() -> None:
    state = _state(_unit(1, "releasing"), _unit(2, "releasing", at=LATER - 1), _unit(3))
    in_flight = set(_cidrs(1, 3))
    assert diff_inventory(state, "eni-a", "ip", (), LATER, GRACE, in_flight) == InventoryDiff()


def test_only_the_eni_and_kind_asked_about_are_judged() -> None:
    prefix = UnitRecord("10.0.16.0/28", "eni-a", "prefix", "active", T0)
    state = _state(_unit(1), _unit(2, eni_id="eni-b"), prefix)
    assert diff_inventory(state, "eni-a", "ip", _cidrs(1), LATER, GRACE) == InventoryDiff()
    diff = diff_inventory(state, "eni-a", "prefix", (), LATER, GRACE)
    assert diff == InventoryDiff(gone=("10.0.16.0/28",))


def test_an_unknown_eni_has_only_new_units() -> None:
    state = _state(_unit(1))
    diff = diff_inventory(state, "eni-new", "ip", _cidrs(1, 9), LATER, GRACE)
    assert diff == InventoryDiff(to_add=_cidrs(9), new=_cidrs(9))


def test_the_grace_window_ends_exactly_grace_seconds_after_the_change() -> None:
    assert within_grace(T0, T0, GRACE)
    assert within_grace(T0, T0 + GRACE - 0.001, GRACE)
    assert not within_grace(T0, T0 + GRACE, GRACE)
    assert not within_grace(T0, T0, 0.0), "no window: nothing is spared"
