"""Pool sizing's inputs, as plain values: what the node holds (per ENI, per unit), the knobs, and
the instance type's limits.

The engine converts its state into `NodeStats` at one instant; `PoolTargets` comes from the
configuration (`ipamd.node.engine_parts.pool_targets`), `NodeLimits` from the instance type's
limits. This module must not import asyncio, do I/O, or know about the configuration, the engine,
the datastore or the cloud adapters: sizing is a pure function of these values.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class UnitStats:
    """One secondary IPv4 address (/32, size 1) or /28 prefix (size 16) on an ENI."""

    cidr: str
    size: int
    """Addresses in the unit: 1 or 16."""
    assigned: int
    """Addresses owned by pods, including lost ones (owned, but EC2 no longer lists them)."""
    cooling: int
    """Released by a pod less than IP_COOLDOWN_PERIOD ago: neither available nor returnable."""
    releasing: bool = False
    """The unassign call is in flight: the unit is neither available nor capacity to keep, but it
    still takes one of the ENI's slots until EC2 has dropped it."""

    @property
    def free(self) -> int:
        """Addresses a pod could get now: 0 while the unit is releasing."""
        if self.releasing:
            return 0
        return max(self.size - self.assigned - self.cooling, 0)

    @property
    def wholly_free(self) -> bool:
        """No assigned or cooling address and not releasing: the unit may go back to EC2."""
        return not self.releasing and self.assigned == 0 and self.cooling == 0


@dataclass(frozen=True, slots=True)
class EniStats:
    eni_id: str
    device_index: int
    is_primary: bool
    age_s: float
    """Seconds since ipamd added the ENI; an ENI younger than the minimum lifetime is kept."""
    units: tuple[UnitStats, ...]
    grows: bool = True
    """False: no unit is added to this ENI (its subnet was found without room while a new ENI may
    go to another, `ipamd.pool.subnet_catalogue.SubnetCatalogue.growth_closed`); its free addresses
    still count."""


@dataclass(frozen=True, slots=True)
class NodeStats:
    enis: tuple[EniStats, ...]


@dataclass(frozen=True, slots=True)
class PoolTargets:
    """The knobs, with VPC CNI's names and meanings (see `ipamd.config.settings.Config`)."""

    warm_eni_target: int = 1
    """ENIs' worth of free addresses to keep (secondary-IP mode, no IP targets)."""
    warm_ip_target: int = 0
    """Free addresses to keep; 0 = unset. With MINIMUM_IP_TARGET, overrides the warm ENI/prefix
    targets."""
    minimum_ip_target: int = 0
    """Floor on the addresses held; 0 = unset."""
    warm_prefix_target: int = 1
    """Wholly free /28 prefixes to keep (prefix mode, no IP targets)."""
    max_eni: int | None = None
    """MAX_ENI: a cap below the instance type's ENI limit; None (or < 1) = no cap."""
    max_pods: int | None = None
    """IPAMD_MAX_PODS; None = the kubelet's, else computed from the instance limits
    (`compute_max_pods`)."""
    min_eni_lifetime_s: float = 60.0
    """An ENI younger than this is never released."""
    custom_networking: bool = False
    """AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG: the primary ENI carries no pods, so the pool is the
    secondary ENIs alone (`ipamd.sizing.plan.pod_stats`) and max pods counts one ENI fewer."""
    kubelet_max_pods: int | None = None
    """The kubelet config's `maxPods` (IPAMD_KUBELET_CONFIG); None = none read."""
    pods_to_come: int = 0
    """Pods bound to this node that want an address and hold none yet (IPAMD_POD_AWARE_POOL): the
    pool keeps at least that many free, whatever the warm targets ask (`UnitStrategy.goal_for`)."""
    pod_aware: bool = False
    """IPAMD_POD_AWARE_POOL is in force (the pods bound here are known): with every warm target
    at 0 the pool holds what its pods use and the pods on their way, and no more
    (`ipamd.sizing.goals.pods_goal`)."""


@dataclass(frozen=True, slots=True)
class NodeLimits:
    max_enis: int
    """The instance type's ENI limit."""
    units_per_eni: int
    """IPv4 addresses per ENI minus the primary one: the secondary IPs, or /28 prefixes, one ENI
    can hold (`cloud.models.InstanceLimits.units_per_eni`)."""
    vcpus: int | None = None
    """The instance type's default vCPUs, for the max-pods cap (`ipamd.sizing.max_pods`); None =
    unknown, no cap."""
    nitro: bool = True
    """On the Nitro system (bare metal included): EC2 assigns /28 prefixes only there."""
