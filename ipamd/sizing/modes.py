"""The mode strategies: secondary IPs (/32, 1 address per unit) or /28 prefixes (16 per unit).

This is the only place that knows a unit's size or which warm target a mode uses when no IP target
is set (WARM_ENI_TARGET for secondary IPs, WARM_PREFIX_TARGET for prefixes). The mode is chosen
once, at start (`strategy_for`); the rest of sizing computes in addresses and converts to units
through the strategy, and never branches on the mode.

Pure; no asyncio, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from ipamd.sizing.goals import (
    Goal,
    pods_goal,
    uses_ip_targets,
    warm_eni_goal,
    warm_ip_goal,
    warm_prefix_goal,
)
from ipamd.sizing.inputs import NodeLimits, PoolTargets

Ipv4UnitKind = Literal["ip", "prefix"]
"""What an IPv4 pool grows by: `cloud.models.Ipv4UnitKind`, the kinds of the one unit kind
(`datastore.records.Ipv4UnitKind`) EC2 assigns by count, spelled here because this pure layer imports
neither."""


@dataclass(frozen=True, slots=True)
class UnitStrategy:
    kind: Ipv4UnitKind
    """What EC2 is asked for: secondary IPs or /28 prefixes."""
    addresses_per_unit: int
    """1 or 16."""
    warm_goal: Callable[[PoolTargets, NodeLimits, int], Goal] = field(repr=False)
    """The mode's own goal, used when neither WARM_IP_TARGET nor MINIMUM_IP_TARGET is set."""
    warm_target: Callable[[PoolTargets], int] = field(repr=False)
    """The mode's own warm target (WARM_ENI_TARGET or WARM_PREFIX_TARGET)."""
    replaces_smaller_units: bool = False
    """Whether wholly free units smaller than this mode's (the /32s prefix mode's fallback to
    secondary IPs left) are leftovers rather than capacity: the plan counts the pool without them,
    gives them back and puts this mode's units in their slots (`ipamd.sizing.prefix_return`)."""

    def units_for(self, addresses: int) -> int:
        """Units that hold at least `addresses` (rounded up; 0 for none or fewer)."""
        if addresses <= 0:
            return 0
        return -(-addresses // self.addresses_per_unit)

    def addresses_in(self, units: int) -> int:
        return units * self.addresses_per_unit

    def addresses_per_eni(self, limits: NodeLimits) -> int:
        """Pod addresses one full ENI holds: (IPv4 per ENI - 1), times 16 in prefix mode."""
        return self.addresses_in(limits.units_per_eni)

    def goal_for(self, targets: PoolTargets, limits: NodeLimits) -> Goal:
        """The goal the knobs set in this mode: the IP targets win when either is > 0, as in VPC
        CNI; otherwise the mode's own warm target, or, for a pod-aware pool with that target at 0,
        the pods on their way alone (`pods_goal`)."""
        if uses_ip_targets(targets):
            goal = warm_ip_goal(targets)
        elif targets.pod_aware and self.warm_target(targets) == 0:
            return pods_goal(targets)
        else:
            goal = self.warm_goal(targets, limits, self.addresses_per_unit)
        if targets.pods_to_come > goal.keep_available:
            # The pods the scheduler bound here are on their way: their addresses come first.
            return replace(goal, keep_available=targets.pods_to_come)
        return goal


def _warm_prefix(targets: PoolTargets, limits: NodeLimits, unit_size: int) -> Goal:
    return warm_prefix_goal(targets)


SECONDARY_IPS = UnitStrategy("ip", 1, warm_eni_goal, lambda t: t.warm_eni_target)
PREFIXES = UnitStrategy(
    "prefix", 16, _warm_prefix, lambda t: t.warm_prefix_target, replaces_smaller_units=True
)


def strategy_for(prefix_delegation: bool) -> UnitStrategy:
    """ENABLE_PREFIX_DELEGATION chooses the strategy, once."""
    return PREFIXES if prefix_delegation else SECONDARY_IPS
