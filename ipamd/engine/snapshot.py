"""Pool snapshots for introspection and metrics: every count from one pass over one state."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from ipamd.engine.state import NodeState
from ipamd.engine.units_v6 import V6_HOSTS
from ipamd.model import AddressState, EniView, PoolSnapshot, UnitView


def take_snapshot(
    state: NodeState,
    now: float,
    cooldown_s: float,
    blocked_enis: Mapping[str, str] | None = None,
    max_pods: int | None = None,
) -> PoolSnapshot:
    """`blocked_enis`: ENI ID → why its addresses are not handed out yet (host link not set up).

    An IPv6 /80 is never enumerated: its view lists the addresses in use (assigned, cooling, lost)
    and counts the rest as the number allocatable, that is the pods the node may still add under
    `max_pods` (its whole remaining 2^48 when no max pods is given), free while the /80 is active
    and releasing while it is being released."""
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
            unlisted = None
            if state.unlisted(cidr):
                addresses = tuple(p for p in addresses if p[1] is not AddressState.FREE)
                unlisted = _allocatable(state, len(addresses), max_pods, unit.state)
                if unlisted:
                    free_as = (
                        AddressState.FREE if unit.state == "active" else AddressState.RELEASING
                    )
                    counts[free_as] += unlisted
            counts.update(s for _, s in addresses)
            units.append(UnitView(cidr, unit.kind, unit.state, addresses, unlisted))
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


def _allocatable(state: NodeState, in_use: int, max_pods: int | None, unit_state: str) -> int:
    """The addresses of an IPv6 /80 not listed, counted as the pods the node may still add."""
    if unit_state == "lost":
        return 0
    left = V6_HOSTS - in_use
    if max_pods is None:
        return left
    return max(0, min(left, max_pods - len(state.allocations())))
