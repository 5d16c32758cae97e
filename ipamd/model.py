"""Domain values shared across the daemon: address states, pod references, pool snapshots.

Pure values: no I/O, no asyncio.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class AddressState(enum.StrEnum):
    FREE = "free"
    """On an ENI per EC2, no owner: assignable, and returnable to EC2 once its whole unit is free."""
    ASSIGNED = "assigned"
    """Owned by exactly one allocation."""
    COOLING = "cooling"
    """Released by a pod less than IP_COOLDOWN_PERIOD ago: neither assignable nor returnable."""
    HELD = "held"
    """Named by a quarantined claim (an aws-node checkpoint entry not adopted, a claim set aside at
    restore) whose pod may still run: neither assignable nor returnable until the claim goes."""
    RELEASING = "releasing"
    """Chosen to go back to EC2; the unassign call is in flight. Never handed out."""
    LOST = "lost"
    """Owned, but EC2 no longer lists it. Never handed out; the owner's DEL clears it."""


@dataclass(frozen=True, slots=True)
class PodRef:
    namespace: str = ""
    name: str = ""
    uid: str = ""


@dataclass(frozen=True, slots=True)
class UnitView:
    cidr: str
    kind: str
    state: str
    addresses: tuple[tuple[str, AddressState], ...]
    unlisted: int | None = None
    """For a unit too large to enumerate (an IPv6 /80), its addresses not in `addresses`, counted
    free (or releasing) in the ENI's and the pool's counts as the number allocatable; None for a
    unit whose every address is listed."""


@dataclass(frozen=True, slots=True)
class EniView:
    eni_id: str
    device_index: int
    subnet_id: str
    is_primary: bool
    units: tuple[UnitView, ...]
    counts: dict[AddressState, int] = field(default_factory=dict)
    mac: str = ""
    primary_ip: str = ""
    blocked: str = ""
    """Why none of its addresses is handed out yet (its host link is not set up); "" = serving."""


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """One consistent view of the node's pool, taken at `taken_at` without interleaving any change."""

    taken_at: float
    enis: tuple[EniView, ...]
    counts: dict[AddressState, int]
    allocations: int
    intents: int
    quarantined: int
