"""What the knobs ask of the pool, as one `Goal`: the addresses and wholly free units to keep, and
how growth and shrinking proceed.

Three goals, as in VPC CNI (docs/architecture.md §5.2):
- WARM_IP_TARGET / MINIMUM_IP_TARGET, when either is > 0, in either mode (`warm_ip_goal`);
- otherwise WARM_ENI_TARGET in secondary-IP mode (`warm_eni_goal`);
- otherwise WARM_PREFIX_TARGET in prefix mode (`warm_prefix_goal`).
Which of the last two applies is the mode strategy's choice (`ipamd.sizing.modes`), not a branch
here. Growth and shrinking test the same conditions (`short_*` and `allows_removal`), so a pool the
planner leaves is neither short nor over: plans converge instead of oscillating.

Pure; no asyncio, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from ipamd.sizing.inputs import NodeLimits, PoolTargets
from ipamd.sizing.tally import PoolTally


@dataclass(frozen=True, slots=True)
class Goal:
    name: str
    """`warm_ip`, `warm_eni` or `warm_prefix`: for logs and metrics."""
    keep_available: int = 0
    """Free addresses to keep; the pool is short below this."""
    keep_total: int = 0
    """Addresses to hold at least (MINIMUM_IP_TARGET)."""
    keep_free_units: int = 0
    """Wholly free units of the mode's size to keep (WARM_PREFIX_TARGET)."""
    fill_whole_enis: bool = False
    """Grow by filling each ENI it touches, as VPC CNI does under WARM_ENI_TARGET; otherwise add
    just what is short."""

    releases_units: bool = True
    """Whether single units may go back to EC2; under WARM_ENI_TARGET only whole ENIs do."""
    eni_release_floor: int = 0
    """Release an ENI only while at least this many addresses are available (hysteresis)."""

    def short_addresses(self, pool: PoolTally) -> int:
        """VPC CNI's `short` (docs/architecture.md §5.2):
        max(keep_available - available, keep_total - total, 0)."""
        return max(self.keep_available - pool.available, self.keep_total - pool.total, 0)

    def short_free_units(self, pool: PoolTally) -> int:
        return max(self.keep_free_units - pool.free_units, 0)

    def is_short(self, pool: PoolTally) -> bool:
        return self.short_addresses(pool) > 0 or self.short_free_units(pool) > 0

    def allows_removal(
        self, pool: PoolTally, addresses: int, free_units: int, *, whole_eni: bool
    ) -> bool:
        """Whether the pool, without these wholly free addresses (`free_units` of them in units of
        the mode's size), still meets the goal — so removing them cannot make it short again."""
        if whole_eni and pool.available < self.eni_release_floor:
            return False
        return (
            pool.available - addresses >= self.keep_available
            and pool.total - addresses >= self.keep_total
            and pool.free_units - free_units >= self.keep_free_units
        )


def uses_ip_targets(targets: PoolTargets) -> bool:
    """VPC CNI's `warmIPTargetsDefined`: either IP target > 0 overrides the ENI and prefix targets."""
    return targets.warm_ip_target > 0 or targets.minimum_ip_target > 0


def warm_ip_goal(targets: PoolTargets) -> Goal:
    """Keep WARM_IP_TARGET addresses free and MINIMUM_IP_TARGET addresses in all, counted in
    addresses in both modes (16 per prefix), as VPC CNI does.

    Shrinking returns a unit only if the pool without it still has WARM_IP_TARGET free and
    MINIMUM_IP_TARGET in all: for whole prefixes that is exactly VPC CNI's `overPrefix`
    (TotalPrefixes - ceil((assigned + WARM_IP_TARGET) / 16), and the same for the minimum).
    MINIMUM_IP_TARGET alone keeps the pool at that floor and never grows it past, as VPC CNI's
    maintainers keep on purpose (WARM_IP_TARGET=0 plus a minimum pins the node's addresses).
    """
    return Goal(
        "warm_ip",
        keep_available=targets.warm_ip_target,
        keep_total=targets.minimum_ip_target,
    )


def pods_goal(targets: PoolTargets) -> Goal:
    """A pod-aware pool (IPAMD_POD_AWARE_POOL) whose mode's warm target is 0 and with no IP target:
    free addresses for the pods bound here that hold none yet, and nothing more kept. It grows as
    VPC CNI's warm ENI goal does, filling each ENI it touches (one call per ENI, not per pod, and
    the next ENI is attached while the pods bound ahead of it are on their way), and gives single
    units back once spare (after the release delay), as the warm IP goal does: VPC CNI's rule for a
    warm target of 0 (keep one free and never return a single address) sized a pool for pods it
    could not see coming, and kept whatever it had grown to."""
    return Goal("pods", keep_available=targets.pods_to_come, fill_whole_enis=True)


def warm_eni_goal(targets: PoolTargets, limits: NodeLimits, unit_size: int) -> Goal:
    """Keep WARM_ENI_TARGET ENIs' worth of free addresses, growing an ENI at a time.

    As in VPC CNI: the pool is short when available < units_per_eni x WARM_ENI_TARGET, or when
    nothing is available at all with a target of 0; growth fills whole ENIs; single addresses are
    never returned; an ENI goes only while available >= (WARM_ENI_TARGET + 1) x units_per_eni.
    Unlike VPC CNI, an ENI also goes only if the pool without it is not short: with a target of 0,
    VPC CNI frees the last ENI with free addresses and then attaches a new one at the next tick.
    """
    per_eni = limits.units_per_eni * unit_size
    return Goal(
        "warm_eni",
        keep_available=max(per_eni * targets.warm_eni_target, 1),
        fill_whole_enis=True,
        releases_units=False,
        eni_release_floor=per_eni * (targets.warm_eni_target + 1),
    )


def warm_prefix_goal(targets: PoolTargets) -> Goal:
    """Keep WARM_PREFIX_TARGET wholly free prefixes: grow when there are fewer, return the free
    prefixes above it; with a target of 0, still grow when nothing at all is available.

    VPC CNI decides *whether* to grow on free addresses (< 16 x WARM_PREFIX_TARGET, counting
    partly used prefixes) but *how much* and *when to shrink* on wholly free prefixes, so two half
    used prefixes neither grow nor shrink it. We use wholly free prefixes for all three: the warm
    prefix is one a burst of pods can fill, and grow and shrink can never disagree.
    """
    return Goal(
        "warm_prefix",
        # An empty pool always grows: VPC CNI's `target == 0 && available == 0` rule. With a
        # target of 0 this also keeps the last free prefix while nothing else is available.
        keep_available=1,
        keep_free_units=targets.warm_prefix_target,
    )
