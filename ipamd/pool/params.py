"""A pool's parameters on this node, as `ipamd.node.engine_parts.pool_params` derives them from the
settings groups (sizing, pool, subnets, ENIs, reconcile) and the unit the node's family and mode
choose; what a pool has been through and shows of itself is `ipamd.pool.health`."""

from __future__ import annotations

from dataclasses import dataclass

from ipamd.sizing.inputs import PoolTargets
from ipamd.sizing.modes import UnitStrategy


@dataclass(frozen=True, slots=True)
class PoolParams:
    """What the pool manager works by on this node: the targets and unit strategy the sizing group
    and the family decide, with the pool's, subnets', ENIs' and reconcile's settings it reads."""

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
