"""The node state as pool sizing sees it: per ENI, per unit, how many addresses are assigned,
cooling, or free — counted from one state at one instant."""

from __future__ import annotations

from datastore.records import EniRecord
from ipamd.engine.state import NodeState
from ipamd.sizing.inputs import EniStats, NodeStats, PoolTargets, UnitStats
from ipamd.sizing.plan import old_enough

Counted = tuple[tuple[EniRecord, tuple[UnitStats, ...]], ...]
"""Each ENI (in device order) with the counts of its units: all of `NodeStats` but the ages."""


def node_stats(state: NodeState, now: float, cooldown_s: float) -> NodeStats:
    return aged(_count(state, _cooling(state, now, cooldown_s)), now)


class StatsMemo:
    """`node_stats` for one reader that asks again and again (the pool manager, every round): the
    counts are kept while the state's revision stays the same and no address has come out of its
    cooldown (when the first will is known once they are counted), which is most rounds; only the
    ENIs' ages are worked out afresh. The ENIs old enough to go (`mature`) are kept likewise, until
    the youngest of the others may come of age."""

    def __init__(self) -> None:
        self._state: NodeState | None = None
        self._revision = -1
        self._cooldown_s = -1.0
        self._counted: Counted = ()
        self._counted_until = float("-inf")
        """Before then the counts stand: the first cooling address leaves its cooldown then."""
        self._mature_of: tuple[Counted, PoolTargets] | None = None
        self._mature: frozenset[str] = frozenset()
        self._mature_until = float("-inf")

    def __call__(self, state: NodeState, now: float, cooldown_s: float) -> NodeStats:
        return aged(self.counts(state, now, cooldown_s), now)

    def counts(self, state: NodeState, now: float, cooldown_s: float) -> Counted:
        """All of `node_stats` but the ages: the same object for as long as they are kept."""
        kept = (
            state is self._state
            and state.revision == self._revision
            and cooldown_s == self._cooldown_s
            and now < self._counted_until
        )
        if not kept:
            cooldowns = state.cooldowns()
            cooling = _cooling(state, now, cooldown_s)
            self._counted = _count(state, cooling)
            self._state, self._revision, self._cooldown_s = state, state.revision, cooldown_s
            self._counted_until = min(
                (cooldowns[a] + cooldown_s for a in cooling), default=float("inf")
            )
        return self._counted

    def mature(self, counted: Counted, now: float, targets: PoolTargets) -> frozenset[str]:
        """`mature_enis`, the same set while no ENI of `counted` may have come of age."""
        of = self._mature_of
        if of is None or of[0] is not counted or of[1] is not targets or now >= self._mature_until:
            mature = mature_enis(counted, now, targets)
            young = [eni.added_at for eni, _ in counted if eni.eni_id not in mature]
            # Looked at again a little before the youngest could come of age: early is exact, and
            # `old_enough` subtracts where this adds (their roundings may differ).
            margin_s = targets.min_eni_lifetime_s - MATURITY_MARGIN_S
            self._mature_of, self._mature = (counted, targets), mature
            self._mature_until = min(young, default=float("inf")) + margin_s
        return self._mature


MATURITY_MARGIN_S = 1e-3


def mature_enis(counted: Counted, now: float, targets: PoolTargets) -> frozenset[str]:
    """The ENIs pool sizing counts as old enough to be released at `now` (`old_enough`)."""
    return frozenset(eni.eni_id for eni, _ in counted if old_enough(now - eni.added_at, targets))


def _cooling(state: NodeState, now: float, cooldown_s: float) -> set[str]:
    # The addresses in their cooldown, found once: most rounds have none, and then no unit's
    # addresses need looking at.
    # Addresses a quarantined claim holds are counted with them: neither can be handed out.
    cooling = {a for a, at in state.cooldowns().items() if now < at + cooldown_s}
    cooling.update(a for q in state.quarantine().values() for a in q.addresses)
    return cooling


def _count(state: NodeState, cooling: set[str] | frozenset[str]) -> Counted:
    units_by_cidr = state.units()
    counted: list[tuple[EniRecord, tuple[UnitStats, ...]]] = []
    for eni in sorted(state.enis().values(), key=lambda e: (e.device_index, e.eni_id)):
        units: list[UnitStats] = []
        for cidr in state.units_on(eni.eni_id):
            unit = units_by_cidr[cidr]
            if unit.state == "lost":
                continue  # not EC2's capacity any more; its owners still count as pods below
            addresses = state.addresses_of(cidr)
            cool = (
                sum(1 for a in addresses if a in cooling and state.owner_of(a) is None)
                if cooling
                else 0
            )
            units.append(
                UnitStats(
                    cidr, len(addresses), state.owned_in(cidr), cool, unit.state == "releasing"
                )
            )
        counted.append((eni, tuple(units)))
    return tuple(counted)


def aged(counted: Counted, now: float) -> NodeStats:
    """`counted` with the ENIs' ages at `now`."""
    return NodeStats(
        tuple(
            EniStats(eni.eni_id, eni.device_index, eni.is_primary, now - eni.added_at, units)
            for eni, units in counted
        )
    )
