"""What the pool manager plans with besides the knobs, round by round: whether the subnets it draws
from are scarce (`ipamd.policy.scarcity`), and whether prefix mode is falling back to secondary IPs
(`ipamd.policy.prefix_return`). Each state is turned on and off here, with a log line at info on
every change; the metrics read them as they are (docs/architecture.md §5.6).

The free addresses come from `subnet_free`, a reading kept by someone else (`SubnetFree`, a job on
its own slow schedule): a round reads a number, never EC2.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ipamd.policy.model import NodeLimits, NodeStats, PoolTargets
from ipamd.policy.modes import UnitStrategy
from ipamd.policy.plan import PoolPlan, plan_pool
from ipamd.policy.scarcity import RECOVERY_FACTOR, scarce_after

logger = logging.getLogger(__name__)


def never_read() -> int | None:
    """The reading of a pool with no subnet source: unknown, so never scarce."""
    return None


class PoolMode:
    def __init__(self, threshold: int, subnet_free: Callable[[], int | None] = never_read) -> None:
        """`threshold`: IPAMD_SUBNET_SCARCITY_THRESHOLD (0: never scarce). `subnet_free`: the free
        addresses of the subnets the node draws from, as last read (`ipamd.reconcile.subnet_free`);
        None while unknown, which is never scarce."""
        self._threshold = threshold
        self._subnet_free = subnet_free
        self.subnet_free: int | None = None
        """Free addresses in the subnets the node draws from, as last read; None until read."""
        self.scarce = False
        """Subnet-scarcity mode: the warm targets count as 0 while it is on."""
        self.prefix_fallback = False
        """Prefix mode is holding or growing /32s because EC2 had no /28 to give: from that
        refusal until a prefix is granted again."""

    def plan(
        self, stats: NodeStats, targets: PoolTargets, limits: NodeLimits, strategy: UnitStrategy
    ) -> PoolPlan:
        """The round's plan: the knobs' goal in `strategy`, at its minimum while scarce."""
        return plan_pool(stats, targets, limits, strategy, scarce=self.scarce)

    def observe_subnets(self) -> bool:
        """Take the latest reading and turn the mode on or off around the threshold. Returns
        whether the subnets are scarce."""
        free = self._subnet_free()
        self.subnet_free = free
        scarce = scarce_after(self.scarce, free, self._threshold)
        if scarce and not self.scarce:
            logger.info(
                "pool.subnet_scarce on free=%s threshold=%d: warm targets at their minimum",
                free,
                self._threshold,
            )
        elif self.scarce and not scarce:
            logger.info(
                "pool.subnet_scarce off free=%s recovered_at=%d: warm targets as configured",
                free,
                self._threshold * RECOVERY_FACTOR,
            )
        self.scarce = scarce
        return scarce

    def prefixes_refused(self, cooldown_s: float) -> None:
        """EC2 had no /28 for the pool, which has a fallback: it grows with /32s meanwhile."""
        if not self.prefix_fallback:
            logger.info(
                "pool.prefix_fallback on: secondary IPs for %.0f s, then prefixes", cooldown_s
            )
        self.prefix_fallback = True

    def prefixes_granted(self) -> None:
        """EC2 gave a /28 again: growth is by prefixes, and the free /32s go back."""
        if self.prefix_fallback:
            logger.info("pool.prefix_fallback off: prefixes again, the free /32s go back")
        self.prefix_fallback = False
