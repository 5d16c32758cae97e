"""The node state as the pool policy sees it: per ENI, per unit, how many addresses are assigned,
cooling, or free — counted from one state at one instant."""

from __future__ import annotations

from ipamd.engine.state import NodeState
from ipamd.policy.model import EniStats, NodeStats, UnitStats


def node_stats(state: NodeState, now: float, cooldown_s: float) -> NodeStats:
    enis: list[EniStats] = []
    for eni in sorted(state.enis().values(), key=lambda e: (e.device_index, e.eni_id)):
        units: list[UnitStats] = []
        for cidr in state.units_on(eni.eni_id):
            unit = state.units()[cidr]
            if unit.state == "lost":
                continue  # not EC2's capacity any more; its owners still count as pods below
            addresses = state.addresses_of(cidr)
            assigned = state.owned_in(cidr)
            cooling = sum(
                1
                for a in addresses
                if state.owner_of(a) is None and state.is_cooling(a, now, cooldown_s)
            )
            units.append(
                UnitStats(cidr, len(addresses), assigned, cooling, unit.state == "releasing")
            )
        enis.append(
            EniStats(eni.eni_id, eni.device_index, eni.is_primary, now - eni.added_at, tuple(units))
        )
    return NodeStats(tuple(enis))
