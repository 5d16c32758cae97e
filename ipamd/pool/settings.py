"""The pool manager's settings, as `ipamd.node.engine_parts` derives them from the configuration, and
its health: what it has been through, counted, for metrics and introspection."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ipamd.policy.model import PoolTargets
from ipamd.policy.modes import UnitStrategy


@dataclass(frozen=True, slots=True)
class PoolSettings:
    targets: PoolTargets
    strategy: UnitStrategy
    fallback_strategy: UnitStrategy | None = None
    """Prefix mode only: secondary IPs to fall back to when the subnet has no free /28."""
    subnet_scarcity_threshold: int = 0
    """Free addresses in the node's subnets below which the warm targets count as 0
    (IPAMD_SUBNET_SCARCITY_THRESHOLD); 0 = never."""
    cluster_name: str = ""
    extra_tags: tuple[tuple[str, str], ...] = ()
    subnet_exhausted_cooldown_s: float = 120.0
    backoff_base_s: float = 1.0
    backoff_cap_s: float = 60.0
    release_grace_s: float = 60.0
    """How long EC2's listing may still show a unit ipamd returned (IPAMD_RECONCILE_GRACE): adopting
    within it would bring the unit back."""
    shrink_interval_s: float = 0.0
    """Least time between two shrinks (IPAMD_SHRINK_INTERVAL, VPC CNI's decreaseIPPoolInterval):
    a burst of DELs before ADDs does not send addresses back only to ask for them again."""
    release_delay_s: float = 0.0
    """How long an ENI or unit stays spare without a break before it is freed
    (IPAMD_RELEASE_DELAY)."""
    provisioning: bool = True
    """False with DISABLE_NETWORK_RESOURCE_PROVISIONING=true: the pool never creates, attaches,
    assigns or releases anything; it serves the ENIs and units EC2 lists on the node (someone else
    provisions them), which the drift reconcile keeps adopting."""


@dataclass(slots=True)
class PoolHealth:
    """What the pool manager has been through, counted, for metrics and introspection. What a
    round may do now (backoff, holds, exhaustion, ...) is `ipamd.pool.conditions`'."""

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
    """What the pool manager shows of itself at one instant (`PoolManager.report`): `GET /v1/pool`,
    the metrics endpoint and introspection read this one value."""

    strategy: UnitStrategy
    """What the pool grows by now: the configured mode's units, or the fallback's /32s."""
    subnet_free: int | None
    """Free addresses in the subnets the node draws from, as last read; None until read."""
    scarce: bool
    """Whether subnet-scarcity mode is on (`ipamd.policy.scarcity`)."""
    prefix_fallback: bool
    """Whether prefix mode is falling back to secondary IPs (`ipamd.policy.prefix_return`)."""
    creating_enis: bool
    """Whether an ENI is being created or attached now."""
    releasing: bool
    """Whether units or ENIs are being given back to EC2 now."""
    errors_by_code: Mapping[str, int]
    """Failed rounds by the error's code."""
