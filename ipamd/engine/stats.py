"""The node state as the pool policy sees it: per ENI, per unit, how many addresses are assigned,
cooling, or free — counted from one state at one instant."""

from __future__ import annotations

from ipamd.engine.state import NodeState
from ipamd.policy.model import EniStats, NodeStats, UnitStats


def node_stats(state: NodeState, now: float, cooldown_s: float) -> NodeStats:
    units_by_cidr = state.units()
    # The addresses in their cooldown, found once: most rounds have none, and then no unit's
    # addresses need looking at.
    cooling = {a for a, at in state.cooldowns().items() if now < at + cooldown_s}
    enis: list[EniStats] = []
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
        enis.append(
            EniStats(eni.eni_id, eni.device_index, eni.is_primary, now - eni.added_at, tuple(units))
        )
    return NodeStats(tuple(enis))
