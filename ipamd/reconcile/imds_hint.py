"""IMDS hint: cheap, frequent reads of the instance metadata's per-ENI address lists.

IMDS is a hint, never evidence (seed 001: it kept released addresses and missed new ones for hours).
Its lists are compared by content with ipamd's view, leaving out units ipamd changed within the grace
window; a disagreement only *triggers* an EC2 drift check, at most once per `min_trigger_interval_s`.
This never changes the inventory.

The design: docs/architecture.md §6.4; seed 001 and S23: docs/failure-scenarios.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping

from cloud.ports import Imds, ImdsInterface
from datastore.records import UnitKind
from ipamd.clock import Clock
from ipamd.engine.inventory import within_grace
from ipamd.engine.state import NodeState

logger = logging.getLogger(__name__)


IMDS_UNITS: Mapping[UnitKind, Callable[[ImdsInterface], set[str]]] = {
    # The first local IPv4 address is the ENI's primary address, not a unit.
    "ip": lambda interface: {f"{a}/32" for a in interface.local_ipv4s[1:]},
    "prefix": lambda interface: set(interface.ipv4_prefixes),
    "ipv6_prefix": lambda interface: set(interface.ipv6_prefixes),
}
"""Where IMDS lists an ENI's units of each kind."""


def imds_units(interface: ImdsInterface, kind: UnitKind) -> set[str]:
    return IMDS_UNITS[kind](interface)


def diff_imds(
    state: NodeState,
    interfaces: tuple[ImdsInterface, ...],
    kinds: tuple[UnitKind, ...],
    now: float,
    grace_s: float,
    foreign: Collection[str] = (),
) -> list[str]:
    """What IMDS and ipamd disagree on outside the grace window (empty when they agree). ENIs of
    others (`foreign`, which EC2's listing showed) are not ipamd's to know."""

    def settled(cidr: str) -> bool:
        unit = state.unit(cidr)
        released = state.released_unit(cidr)
        changed = unit.changed_at if unit else (released.released_at if released else None)
        return changed is None or not within_grace(changed, now, grace_s)

    by_eni = {i.eni_id: i for i in interfaces}
    disagreements: list[str] = []
    for eni_id, eni in state.enis().items():
        interface = by_eni.get(eni_id)
        if interface is None:
            if not within_grace(eni.added_at, now, grace_s):
                disagreements.append(f"{eni_id}: not in IMDS")
            continue
        ours = {
            c for c in state.units_on(eni_id) if state.units()[c].state in ("active", "releasing")
        }
        for kind in kinds:
            theirs = imds_units(interface, kind)
            mine = {c for c in ours if state.units()[c].kind == kind}
            disagreements += [f"{eni_id}: IMDS lists {c}" for c in theirs - mine if settled(c)]
            disagreements += [f"{eni_id}: IMDS lacks {c}" for c in mine - theirs if settled(c)]
    disagreements += [
        f"{eni_id}: only in IMDS"
        for eni_id in by_eni
        if eni_id not in state.enis() and eni_id not in foreign
    ]
    return disagreements


class ImdsHint:
    def __init__(
        self,
        state: Callable[[], NodeState],
        imds: Imds,
        kinds: tuple[UnitKind, ...],
        grace_s: float,
        clock: Clock,
        trigger: Callable[[], None],
        min_trigger_interval_s: float = 10.0,
        foreign: Collection[str] = frozenset(),
    ) -> None:
        self._state = state
        self._imds = imds
        self._kinds = kinds
        self._grace_s = grace_s
        self._clock = clock
        self._trigger = trigger
        self._min_interval_s = min_trigger_interval_s
        self._foreign = foreign
        """Attached ENIs of others (the pool manager's set, kept by the drift): not disagreements."""
        self._last_trigger = float("-inf")
        self._agreed: tuple[NodeState, int, tuple[ImdsInterface, ...], frozenset[str]] | None = None
        """The last state (at its revision), IMDS answer and foreign ENIs that agreed outright,
        grace windows aside: while all three are the same they agree, at any time."""
        self.disagreements = 0
        self.triggers = 0

    async def run_once(self) -> list[str]:
        interfaces = await self._imds.interfaces()
        now, state, foreign = self._clock.now(), self._state(), frozenset(self._foreign)
        seen = (state, state.revision, interfaces, foreign)
        if seen == self._agreed:
            return []
        # Outright first (no grace window): the grace window only leaves disagreements out, so
        # when there are none outright there are none, and nothing is compared twice.
        found = diff_imds(state, interfaces, self._kinds, now, 0.0, foreign)
        if not found:
            self._agreed = seen
        else:
            found = diff_imds(state, interfaces, self._kinds, now, self._grace_s, foreign)
        if found:
            self.disagreements += 1
            if now - self._last_trigger >= self._min_interval_s:
                self._last_trigger = now
                self.triggers += 1
                logger.info("reconcile.imds_disagrees count=%d first=%s", len(found), found[0])
                self._trigger()
        return found
