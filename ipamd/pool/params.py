"""A pool's parameters on this node, as `ipamd.node.engine_parts.pool_params` derives them from the
settings groups (sizing, pool, subnets, ENIs, reconcile) and the unit the node's family and mode
choose; what a pool has been through and shows of itself is `ipamd.pool.health`."""

from __future__ import annotations

from dataclasses import dataclass, field

from ipamd.config.groups import EniSettings, PoolSettings, SubnetSettings
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
    pool: PoolSettings = field(default_factory=PoolSettings)
    """The pool's group: how it gives back (IPAMD_SHRINK_INTERVAL, IPAMD_RELEASE_DELAY) and whether
    it provisions at all (DISABLE_NETWORK_RESOURCE_PROVISIONING)."""
    subnets: SubnetSettings = field(default_factory=SubnetSettings)
    """The subnets' group: the scarcity threshold and the cooldown after EC2 finds one full."""
    enis: EniSettings = field(default_factory=EniSettings)
    """The ENIs' group: the cluster name and the extra tags a new ENI carries."""
    release_grace_s: float = 60.0
    """How long EC2's listing may still show a unit ipamd returned (IPAMD_RECONCILE_GRACE): adopting
    within it would bring the unit back."""
    backoff_base_s: float = 1.0
    backoff_cap_s: float = 60.0
    """The backoff between failed rounds."""

    @property
    def provisioning(self) -> bool:
        """False with DISABLE_NETWORK_RESOURCE_PROVISIONING=true: the pool never creates, attaches,
        assigns or releases anything; it serves the ENIs and units EC2 lists on the node (someone
        else provisions them), which the drift reconcile keeps adopting."""
        return not self.pool.disable_network_resource_provisioning
