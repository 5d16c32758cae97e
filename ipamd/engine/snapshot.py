"""Pool snapshots for introspection and metrics: every count from one pass over one state."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from ipamd.engine.state import NodeState
from ipamd.model import AddressState, EniView, PoolSnapshot, UnitView


def take_snapshot(
    state: NodeState, now: float, cooldown_s: float, blocked_enis: Mapping[str, str] | None = None
) -> PoolSnapshot:
    """`blocked_enis`: ENI ID → why its addresses are not handed out yet (host link not set up)."""
    blocked = blocked_enis or {}
    enis: list[EniView] = []
    total: Counter[AddressState] = Counter()
    for eni in sorted(state.enis().values(), key=lambda e: (e.device_index, e.eni_id)):
        units: list[UnitView] = []
        counts: Counter[AddressState] = Counter()
        for cidr in state.units_on(eni.eni_id):
            unit = state.units()[cidr]
            addresses = tuple(
                (address, s)
                for address in state.addresses_of(cidr)
                if (s := state.address_state(address, unit, now, cooldown_s)) is not None
            )
            counts.update(s for _, s in addresses)
            units.append(UnitView(cidr, unit.kind, unit.state, addresses))
        total.update(counts)
        enis.append(
            EniView(
                eni.eni_id,
                eni.device_index,
                eni.subnet_id,
                eni.is_primary,
                tuple(units),
                {s: counts.get(s, 0) for s in AddressState},
                mac=eni.mac,
                primary_ip=eni.primary_ip,
                blocked=blocked.get(eni.eni_id, ""),
            )
        )
    return PoolSnapshot(
        taken_at=now,
        enis=tuple(enis),
        counts={s: total.get(s, 0) for s in AddressState},
        allocations=len(state.allocations()),
        intents=len(state.intents()),
        quarantined=len(state.quarantine()),
    )
