"""What a pool has been through (`PoolHealth`, counted as its rounds go) and what it shows of itself
at one instant (`PoolReport`): plain values for metrics, introspection and the API, whichever
family's pool keeps them (`ipamd.pool.rounds`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ipamd.sizing.modes import UnitStrategy


@dataclass(slots=True)
class PoolHealth:
    """What a pool has been through, counted, for metrics and introspection. What a round may do
    now (backoff, holds, exhaustion, ...) is `ipamd.pool.conditions`'."""

    plans_applied: int = 0
    failures: int = 0
    consecutive_failures: int = 0
    """Rounds failed in a row: the backoff doubles with it."""
    throttle_streak: int = 0
    """Throttle answers lately, less one per round that went through: the hold doubles with it."""
    throttled_rounds: int = 0
    demand_rounds: int = 0
    """Rounds applied because an ADD was waiting."""
    last_error: str = ""
    last_error_at: float | None = None
    """When the last failed round failed (None: none has)."""
    next_try_at: float | None = None
    """When the round after the last failure may run (its backoff's end)."""
    blocked: str = ""
    """The last round's failure while it is final (`ipamd.pool.pace.is_final`: EC2 will refuse
    again until someone changes something); "" once a round goes through. ADDs that find no
    address say it, and so do `/readyz` and `ipamctl status`."""
    errors_by_code: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PoolReport:
    """What a pool shows of itself at one instant (`Rounds.report`): `GET /v1/pool`, the metrics
    endpoint and introspection read this one value."""

    strategy: UnitStrategy
    """What the pool grows by now: the configured mode's units, or the fallback's /32s."""
    subnet_free: int | None
    """Free addresses in the subnets the node draws from, as last read; None until read."""
    scarce: bool
    """Whether subnet-scarcity mode is on (`ipamd.sizing.scarcity`)."""
    prefix_fallback: bool
    """Whether prefix mode is falling back to secondary IPs (`ipamd.sizing.prefix_return`)."""
    creating_enis: bool
    """Whether an ENI is being created or attached now."""
    releasing: bool
    """Whether units or ENIs are being given back to EC2 now."""
    errors_by_code: Mapping[str, int]
    """Failed rounds by the error's code."""
