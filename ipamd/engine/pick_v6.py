"""IPv6's pick: which addresses of the node's /80 an ADD takes (docs/architecture.md §3.7).

Chosen once for an IPv6 node (`EngineParams.pick`), in place of the listed units' pick
(`pick_addresses` (`ipamd/engine/allocator.py`)).
"""

from __future__ import annotations

from collections.abc import Collection

from ipamd.engine.state import NodeState
from ipamd.engine.units_v6 import V6Unit


def pick_v6_addresses(
    state: NodeState,
    count: int,
    now: float,
    cooldown_s: float,
    blocked_enis: Collection[str] = (),
    skip_primary: bool = False,
) -> tuple[str, list[tuple[str, str]]] | None:
    """IPv6 mode: `count` addresses of the first active /80 (by device index, then CIDR) of an ENI
    that may serve, the lowest host addresses from ::1 up that are neither owned nor cooling.

    The /80 is never enumerated: the search steps over the owned and cooling offsets only, so it
    costs O(pods + cooling addresses); the max-pods check before it bounds how far it goes."""
    horizon = now - cooldown_s
    cooling: list[str] | None = None
    for eni in sorted(state._enis.values(), key=lambda e: (e.device_index, e.eni_id)):
        if eni.eni_id in blocked_enis or (skip_primary and eni.is_primary):
            continue
        for cidr in sorted(state._units_by_eni.get(eni.eni_id, ())):
            v6 = state._spaces.get(cidr)
            if not isinstance(v6, V6Unit) or state._units[cidr].state != "active":
                continue
            if cooling is None:  # looked for once, and only when there is a /80 to serve from
                cooling = [a for a, at in state._cooldowns.items() if at > horizon and ":" in a]
                cooling.extend(a for a in state._held if ":" in a)  # quarantined claims' too
            taken = v6.owned
            if cooling and (held := {at for a in cooling if (at := v6.offset(a)) is not None}):
                taken = taken | held
            offsets: list[int] = []
            # Every offset up to len(taken) is taken when the largest is len(taken): the usual case
            # (addresses are handed out from the bottom), found without a loop over the pods.
            at = len(taken) + 1 if taken and max(taken) == len(taken) else 1
            while len(offsets) < count:
                if at not in taken:
                    offsets.append(at)
                at += 1
            return eni.eni_id, [(v6.address(at), cidr) for at in offsets]
    return None
