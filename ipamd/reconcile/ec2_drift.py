"""EC2 drift reconcile: EC2 is the authority on which ENIs and units this instance has.

Compared by content — the set of units per ENI — never by count (seed 001: equal counts hid four
in-use addresses swapped for four released ones). Units ipamd itself changed within the grace window
are left alone, because EC2's Describe is eventually consistent; the window is persisted with each
unit, so it holds across a restart. Outside it:

- a unit EC2 lists and ipamd lacks enters the inventory as free;
- a free unit EC2 no longer lists leaves; an owned one becomes `lost`, never free;
- a unit left `releasing` by a release that is no longer in flight (ipamd died mid-release) is settled
  by EC2: gone means released, still listed means the release never happened and it is free again;
- an ENI ipamd created for this instance that is attached without DeleteOnTermination (ipamd died
  between the attach and setting it) gets it, so it cannot outlive the instance.

Nothing enters the inventory that EC2 does not list, and nothing of an ENI that is another user's
(tagged `no_manage=true`, EFA, trunk: `ipamd.sizing.subnets.left_alone`): it is noted in `foreign`
(it takes one of the instance's attachments) and otherwise never looked at.

The design: docs/architecture.md §6.3; seed 001 and the scenarios it gave: docs/failure-scenarios.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from cloud.errors import CloudError
from cloud.models import NetworkInterface
from cloud.ports import MANAGED_BY, TAG_INSTANCE_ID, TAG_MANAGED_BY, Ec2Api
from datastore.records import UnitKind
from ipamd.clock import Clock
from ipamd.engine.engine import Engine
from ipamd.engine.inventory import InventoryDiff, diff_inventory, eni_record, within_grace
from ipamd.pool.rounds import ListingWatch
from ipamd.sizing.subnets import left_alone

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class DriftReport:
    added: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    found_again: list[str] = field(default_factory=list)
    settled_released: list[str] = field(default_factory=list)
    settled_kept: list[str] = field(default_factory=list)
    enis_added: list[str] = field(default_factory=list)
    enis_gone: list[str] = field(default_factory=list)
    enis_bound_to_instance: list[str] = field(default_factory=list)
    """ENIs of ours found attached without DeleteOnTermination, and given it."""

    def changed(self) -> bool:
        return any(getattr(self, name) for name in self.__slots__)

    def drifted(self) -> bool:
        """Whether the inventory changed (binding an ENI to the instance is housekeeping: every
        restart after ipamd attached ENIs without finishing does it)."""
        return any(getattr(self, n) for n in self.__slots__ if n != "enis_bound_to_instance")


class Ec2Drift:
    def __init__(
        self,
        engine: Engine,
        ec2: Ec2Api,
        instance_id: str,
        kinds: tuple[UnitKind, ...],
        grace_s: float,
        clock: Clock,
        in_flight: Callable[[], Collection[str]] = frozenset,
        foreign: set[str] | None = None,
        listing: ListingWatch | None = None,
    ) -> None:
        self._engine = engine
        self._ec2 = ec2
        self._instance_id = instance_id
        self._kinds = kinds
        self._grace_s = grace_s
        self._clock = clock
        self._in_flight = in_flight
        self.foreign = foreign if foreign is not None else set()
        """Attached ENIs of others, as the last listing showed them (updated in place: the pool
        manager's own set)."""
        self._listing = listing
        """Told of each listing (the pool manager's new ENIs take their device indexes from it)."""
        self.runs = 0
        self.describes = 0

    async def run_once(self) -> DriftReport:
        watch = self._listing
        ticket = watch.listing_ticket() if watch is not None else 0
        enis = await self._ec2.describe_enis(self._instance_id)
        if watch is not None:
            watch.listed(ticket, enis)
        self.describes += 1
        self.runs += 1
        # A node ipamd holds nothing of yet (a new node, a fresh state file): EC2's inventory is
        # taken, not drifted from.
        first_sight = not self._engine.state.enis()
        report = DriftReport()
        attached = [e for e in enis if e.device_index is not None]
        others = {e.eni_id for e in attached if left_alone(e.tags, e.interface_type, e.is_primary)}
        self.foreign.intersection_update(others)
        self.foreign.update(others)
        listed = {e.eni_id: e for e in attached if e.eni_id not in others}
        for eni in listed.values():
            await self._reconcile_eni(eni, report)
            await self._bind_to_instance(eni, report)
        await self._gone_enis(listed, report)
        if report.changed() and first_sight:
            logger.info("reconcile.adopted report=%s", report)
        elif report.drifted():
            logger.warning("reconcile.drift report=%s", report)
        elif report.changed():
            logger.info("reconcile.bound enis=%s", report.enis_bound_to_instance)
        return report

    async def _bind_to_instance(self, eni: NetworkInterface, report: DriftReport) -> None:
        ours = (
            eni.tags.get(TAG_MANAGED_BY) == MANAGED_BY
            and eni.tags.get(TAG_INSTANCE_ID) == self._instance_id
        )
        if not ours or eni.is_primary or eni.delete_on_termination or eni.attachment_id is None:
            return
        if eni.eni_id in self._in_flight():
            return  # the pool manager is attaching it right now and sets it itself
        try:
            await self._ec2.set_delete_on_termination(eni.eni_id, eni.attachment_id)
        except CloudError as err:
            logger.warning(
                "reconcile.delete_on_termination_failed eni_id=%s error=%s", eni.eni_id, err
            )
            return
        report.enis_bound_to_instance.append(eni.eni_id)

    def _recent(self, at: float) -> bool:
        return within_grace(at, self._clock.now(), self._grace_s)

    def _diff(
        self, eni_id: str, kind: UnitKind, listed: list[str], in_flight: set[str]
    ) -> InventoryDiff:
        state, now = self._engine.state, self._clock.now()
        return diff_inventory(state, eni_id, kind, listed, now, self._grace_s, in_flight)

    async def _reconcile_eni(self, eni: NetworkInterface, report: DriftReport) -> None:
        engine, state = self._engine, self._engine.state
        known = state.eni(eni.eni_id)
        if known is None or (eni.mac and not known.mac):
            await engine.add_eni(eni_record(eni, eni.device_index or 0, self._clock.now()))
        if known is None:
            report.enis_added.append(eni.eni_id)
        in_flight = set(self._in_flight())
        for kind in self._kinds:
            listed = sorted(set(eni.units(kind)))
            diff = self._diff(eni.eni_id, kind, listed, in_flight)
            if diff.to_add:
                report.found_again.extend(diff.found_again)
                await engine.add_units(eni.eni_id, diff.to_add, kind)
                report.added.extend(diff.new)
                # Judged on the inventory as the additions (and whatever ran meanwhile) left it.
                diff = self._diff(eni.eni_id, kind, listed, in_flight)
            await self._judge(diff, report)

    async def _judge(self, diff: InventoryDiff, report: DriftReport) -> None:
        if diff.settled_released:
            await self._engine.finish_release(diff.settled_released)
            report.settled_released.extend(diff.settled_released)
        if diff.settled_kept:
            await self._engine.abort_release(diff.settled_kept)
            report.settled_kept.extend(diff.settled_kept)
        if diff.gone:
            owned = [c for c in diff.gone if self._engine.state.owned_in(c)]
            await self._engine.units_gone(diff.gone)
            report.lost.extend(owned)
            report.dropped.extend(c for c in diff.gone if c not in owned)

    async def _gone_enis(self, listed: dict[str, NetworkInterface], report: DriftReport) -> None:
        in_flight = set(self._in_flight())
        for eni_id, eni in list(self._engine.state.enis().items()):
            if eni_id in listed or eni_id in in_flight or self._recent(eni.added_at):
                continue
            await self._engine.eni_gone(eni_id)
            report.enis_gone.append(eni_id)
