"""Decisions that change the inventory: ENIs and units arriving, leaving, and being returned to EC2.

Every inventory change rests on evidence from EC2 (a Describe result or the answer to ipamd's own
mutation); callers pass that evidence in. Pure functions returning the mutation to commit, and
`diff_inventory`, the one comparison of an ENI's units with EC2's listing of them that the drift
reconcile and the pool manager's adoption both act on.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, replace

from cloud.models import NetworkInterface
from datastore.records import EniRecord, Mutation, ReleasedUnitRecord, UnitKind, UnitRecord
from ipamd.engine.state import NodeState
from ipamd.errors import InventoryError


def within_grace(at: float, now: float, grace_s: float) -> bool:
    """Whether a change ipamd made at `at` is still inside the grace window: EC2's Describe is
    eventually consistent, so its listing may not show the change yet and is not judged against it."""
    return now - at < grace_s


@dataclass(frozen=True, slots=True)
class InventoryDiff:
    """How the inventory's units of one kind on one ENI differ from EC2's listing of that ENI,
    leaving out what ipamd changed within the grace window."""

    to_add: tuple[str, ...] = ()
    """Listed units to enter the inventory as free: `new` and `found_again`, in listing order."""
    new: tuple[str, ...] = ()
    """Listed, absent from the inventory, and not returned to EC2 by ipamd within the window."""
    found_again: tuple[str, ...] = ()
    """Listed, and held as lost."""
    gone: tuple[str, ...] = ()
    """Held as active (free or owned) and no longer listed."""
    settled_released: tuple[str, ...] = ()
    """Left `releasing` by a release no longer in flight, and no longer listed: it happened."""
    settled_kept: tuple[str, ...] = ()
    """Left `releasing` by a release no longer in flight, and still listed: it never happened."""


def diff_inventory(
    state: NodeState,
    eni_id: str,
    kind: UnitKind,
    listed: Iterable[str],
    now: float,
    grace_s: float,
    in_flight: Collection[str] = (),
) -> InventoryDiff:
    """Compare the units of `kind` the inventory holds on `eni_id` with those EC2 `listed` there.

    Compared by content, never by count. A unit is left alone while its own change (its return to
    EC2, or its last change of state) is within `grace_s`, and while its release is `in_flight`
    (that call decides it). A lost unit is never judged gone again."""
    listing = tuple(dict.fromkeys(listed))
    new: list[str] = []
    found_again: list[str] = []
    to_add: list[str] = []
    for cidr in listing:
        released = state.released_unit(cidr)
        if released is not None and within_grace(released.released_at, now, grace_s):
            continue  # ipamd just gave it back; EC2's listing may not show that yet
        unit = state.unit(cidr)
        if unit is None:
            new.append(cidr)
        elif unit.state == "lost":
            found_again.append(cidr)
        else:
            continue
        to_add.append(cidr)
    on_ec2 = frozenset(listing)
    gone: list[str] = []
    settled_released: list[str] = []
    settled_kept: list[str] = []
    for cidr in state.units_on(eni_id):
        unit = state.units()[cidr]
        if unit.kind != kind or unit.state == "lost" or cidr in in_flight:
            continue
        if within_grace(unit.changed_at, now, grace_s):
            continue
        if unit.state == "releasing":
            (settled_kept if cidr in on_ec2 else settled_released).append(cidr)
        elif cidr not in on_ec2:
            gone.append(cidr)
    return InventoryDiff(
        tuple(to_add),
        tuple(new),
        tuple(found_again),
        tuple(gone),
        tuple(settled_released),
        tuple(settled_kept),
    )


def plan_add_eni(state: NodeState, eni: EniRecord) -> Mutation:
    """A new ENI enters; a known one keeps its record, except that facts EC2 now gives and the
    record lacks (MAC, primary address: a state file of schema version 1) are filled in."""
    known = state.eni(eni.eni_id)
    if known is None:
        return Mutation(put_enis=(eni,))
    if (known.mac, known.primary_ip) == (eni.mac, eni.primary_ip) or not eni.mac:
        return Mutation()
    return Mutation(put_enis=(replace(known, mac=eni.mac, primary_ip=eni.primary_ip),))


def plan_add_units(
    state: NodeState, eni_id: str, cidrs: Iterable[str], kind: UnitKind, now: float
) -> Mutation:
    """EC2 lists these units on `eni_id`: new ones become free; a lost one is found again.

    A unit ipamd is releasing is left alone (the unassign call decides its fate), and a unit that
    was returned to EC2 and comes back is allocatable again.
    """
    if eni_id not in state.enis():
        raise InventoryError(f"unknown ENI {eni_id}")
    puts: list[UnitRecord] = []
    for cidr in dict.fromkeys(cidrs):
        unit = state.unit(cidr)
        if unit is not None and unit.eni_id != eni_id:
            raise InventoryError(f"{cidr} is on {unit.eni_id}, not {eni_id}")
        if unit is None or unit.state == "lost":
            puts.append(UnitRecord(cidr, eni_id, kind, "active", now))
    returned = tuple(u.cidr for u in puts if u.cidr in state.released())
    return Mutation(put_units=tuple(puts), delete_released=returned)


def plan_begin_release(
    state: NodeState, cidrs: Iterable[str], now: float, cooldown_s: float
) -> tuple[Mutation, tuple[str, ...]]:
    """Mark for return to EC2 those of `cidrs` that are whole and free: no address assigned,
    cooling or held by a quarantined claim.

    Marked units are never handed out; the caller calls EC2 after this commit, outside the lock.
    """
    chosen: list[UnitRecord] = []
    for cidr in dict.fromkeys(cidrs):
        unit = state.unit(cidr)
        if unit is None or unit.state != "active" or state.owned_in(cidr):
            continue
        if any(
            state.is_cooling(a, now, cooldown_s) or state.is_held(a)
            for a in state.addresses_of(cidr)
        ):
            continue
        chosen.append(UnitRecord(cidr, unit.eni_id, unit.kind, "releasing", now))
    return Mutation(put_units=tuple(chosen)), tuple(u.cidr for u in chosen)


def plan_finish_release(state: NodeState, cidrs: Iterable[str], now: float) -> Mutation:
    """EC2 confirmed the unassign: the units leave the inventory, remembered for the grace window."""
    gone = [u for c in dict.fromkeys(cidrs) if (u := state.unit(c)) and u.state == "releasing"]
    return Mutation(
        delete_units=tuple(u.cidr for u in gone),
        put_released=tuple(ReleasedUnitRecord(u.cidr, u.eni_id, now) for u in gone),
    )


def plan_abort_release(state: NodeState, cidrs: Iterable[str], now: float) -> Mutation:
    """The unassign failed or the units are needed again: they become free."""
    back = [u for c in dict.fromkeys(cidrs) if (u := state.unit(c)) and u.state == "releasing"]
    return Mutation(
        put_units=tuple(UnitRecord(u.cidr, u.eni_id, u.kind, "active", now) for u in back)
    )


def plan_remove_eni(state: NodeState, eni_id: str, now: float) -> Mutation:
    """EC2 confirmed the ENI is detached and deleted: it leaves with its units, which must all be
    releasing (marked by `plan_begin_release`) — an ENI holding a usable or owned unit never goes."""
    if eni_id not in state.enis():
        return Mutation()
    units = [state.units()[c] for c in state.units_on(eni_id)]
    if any(u.state != "releasing" for u in units):
        raise InventoryError(f"{eni_id} still has units that are not being released")
    return Mutation(
        delete_enis=(eni_id,),
        delete_units=tuple(u.cidr for u in units),
        put_released=tuple(ReleasedUnitRecord(u.cidr, eni_id, now) for u in units),
    )


def plan_eni_gone(state: NodeState, eni_id: str, now: float) -> Mutation:
    """EC2 no longer lists the ENI on this instance: its unowned units leave, owned ones become lost,
    and the ENI record goes once nothing of it is owned any more."""
    cidrs = tuple(state.units_on(eni_id))
    gone = plan_units_gone(state, cidrs, now)
    owned = any(state.owned_in(c) for c in cidrs)
    if owned or eni_id not in state.enis():
        return gone
    return Mutation(delete_units=gone.delete_units, delete_enis=(eni_id,))


def plan_units_gone(state: NodeState, cidrs: Iterable[str], now: float) -> Mutation:
    """EC2 no longer lists these units. Unowned ones leave; owned ones become lost, never free."""
    drop: list[str] = []
    lost: list[UnitRecord] = []
    for cidr in dict.fromkeys(cidrs):
        unit = state.unit(cidr)
        if unit is None or unit.state == "lost":
            continue
        if state.owned_in(cidr):
            lost.append(UnitRecord(cidr, unit.eni_id, unit.kind, "lost", now))
        else:
            drop.append(cidr)
    return Mutation(delete_units=tuple(drop), put_units=tuple(lost))


def eni_record(eni: NetworkInterface, device_index: int, now: float) -> EniRecord:
    """The inventory's record of an ENI EC2 described (or just created and attached)."""
    return EniRecord(
        eni.eni_id,
        device_index,
        eni.subnet_id,
        device_index == 0,
        now,
        mac=eni.mac.lower(),
        primary_ip=eni.primary_ip,
    )
