"""The pool's conditions: what a pool round may do now, and until when.

Sizing (`ipamd.sizing.plan`) says what the pool should look like. The conditions say what this
round may do about it. They all live here, each with its deadline or its latest reading, and the
pool manager asks this one object before it calls EC2:

- **Backoff.** A failed round makes the next one wait. `Pace` works out how long (jittered,
  doubling); the deadline is kept here.
- **Hold.** After a throttle answer, background work (warm-up, shrinking) waits. `Pace` works out
  how long; the deadline is kept here. A round an ADD waits for is never held.
- **Subnet exhaustion.** A subnet out of addresses, with no other subnet to take over, pauses growth
  for `subnet_exhausted_cooldown_s`. In prefix mode with the fallback, the pool grows /32s instead
  for that long (`strategy`).
- **Prefix fallback.** On from EC2's refusal of a /28 until it grants one again. While it is on, the
  pool holds /32s (`ipamd.sizing.prefix_return` gives them back).
- **Scarcity.** The free addresses of the subnets the node draws from, read every round from
  `subnet_free` (a number someone else keeps: never an EC2 call). Below the threshold the warm
  targets count as 0 (`ipamd.sizing.scarcity`).
- **Shrink spacing.** Two shrinks are at least `shrink_interval_s` apart.
- **Release delay.** What is spare goes back only once the plan has wanted to free it for
  `release_delay_s` without a break (IPAMD_RELEASE_DELAY).

Scarcity and the prefix fallback log a line at info each time they turn on or off; the metrics read
them as they are. `trim` is the one place that cuts the sizing plan down to what a round applies.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from cloud.errors import SubnetExhausted
from ipamd.clock import Clock
from ipamd.engine.engine import Engine
from ipamd.pool.params import PoolParams
from ipamd.sizing.modes import UnitStrategy
from ipamd.sizing.plan import PoolPlan
from ipamd.sizing.scarcity import RECOVERY_FACTOR, scarce_after

logger = logging.getLogger(__name__)


def never_read() -> int | None:
    """The reading of a pool with no subnet source: unknown, so never scarce."""
    return None


class Conditions:
    """Every condition on what a pool round may do, with its deadline, and the one place that trims
    the plan to them. Holds no lock and calls nothing; the pool manager and `Pace` tell it what
    happened, and the pool manager asks it what a round may do."""

    def __init__(
        self,
        engine: Engine,
        settings: PoolParams,
        clock: Clock,
        subnet_free: Callable[[], int | None] = never_read,
    ) -> None:
        """`subnet_free`: the free addresses of the subnets the node draws from, as last read
        (`ipamd.reconcile.subnet_free`); None while unknown, which is never scarce."""
        self._engine = engine
        self._settings = settings
        self._clock = clock
        self._subnet_free = subnet_free
        self.backoff_until = 0.0
        """No round runs before then: the last round failed."""
        self.warm_hold_until = 0.0
        """Background work (warm-up, shrinking) waits until then: a throttle answer was seen."""
        self.subnet_exhausted_until = 0.0
        """Growth pauses until then (or, with the fallback, grows /32s): a subnet was out of
        addresses and no other could take over."""
        self.last_shrink_at = float("-inf")
        """When the last round that gave something back began."""
        self.subnet_free: int | None = None
        """Free addresses in the subnets the node draws from, as last read; None until read."""
        self.scarce = False
        """Subnet-scarcity mode: the warm targets count as 0 while it is on."""
        self.prefix_fallback = False
        """Prefix mode is holding or growing /32s because EC2 had no /28 to give: from that
        refusal until a prefix is granted again."""
        self._spare_since: dict[str, float] = {}
        """ENIs and units the plan would give back, and since when it has without a break."""

    # -- what a round may do -------------------------------------------------------------------

    @property
    def strategy(self) -> UnitStrategy:
        """What the pool grows by now: the fallback's /32s while the subnet is exhausted (prefix
        mode with the fallback only), else the configured mode's units."""
        fallback = self._settings.fallback_strategy
        if fallback is not None and self._clock.now() < self.subnet_exhausted_until:
            return fallback
        return self._settings.strategy

    def backing_off(self, now: float) -> bool:
        """Whether the last round failed and its backoff has not ended: no round runs."""
        return now < self.backoff_until

    def held(self, now: float) -> bool:
        """Whether background work waits (a throttle answer was seen lately)."""
        return now < self.warm_hold_until

    def trim(self, plan: PoolPlan, now: float, demand: bool) -> PoolPlan:
        """`plan` cut down to what this round may apply. Spare things go only after the release
        delay. A round pods wait for (`demand`) does only what they need: the assigns and one new
        ENI. Growth waits while the subnet is exhausted and there is no fallback. Shrinks are
        `shrink_interval_s` apart; a round that shrinks starts that interval."""
        plan = self._settled(plan, now, demand)
        if demand:
            # The rest of the plan (more warm ENIs, releases) waits for a round of its own.
            plan = replace(plan, new_enis=plan.new_enis[:1], release_units=(), release_enis=())
        if self._growth_paused(now) and (plan.assign or plan.new_enis):
            plan = replace(plan, assign=(), new_enis=(), replace_units=())
        shrinking = bool(plan.release_units or plan.release_enis)
        if shrinking and now - self.last_shrink_at < self._settings.pool.shrink_interval_s:
            plan = replace(plan, release_units=(), release_enis=())
        elif shrinking:
            self.last_shrink_at = now
        return plan

    def _growth_paused(self, now: float) -> bool:
        return now < self.subnet_exhausted_until and self._settings.fallback_strategy is None

    def _settled(self, plan: PoolPlan, now: float, demand: bool) -> PoolPlan:
        """`plan` giving back only what has been spare for the release delay. A round pods wait
        for is a break: the clock starts again. No delay while the subnets are scarce (the
        addresses are wanted elsewhere). No delay either for what no new pod could have
        (`serves_no_pod`), nor for units of another kind than the pool grows (the /32s the
        fallback left): nothing there is asked for again."""
        wanted = () if demand else plan.release_enis + plan.release_units
        self._spare_since = {k: self._spare_since.get(k, now) for k in wanted}
        delay_s = self._settings.pool.release_delay_s
        if not wanted or delay_s <= 0 or self.scarce:
            return plan
        idle = serves_no_pod(self._engine)
        units, kind = self._engine.state.units(), self.strategy.kind

        def ready(key: str) -> bool:
            unit = units.get(key)
            if unit is not None and unit.kind != kind:
                return True
            eni_id = key if unit is None else unit.eni_id
            return eni_id in idle or now - self._spare_since[key] >= delay_s

        enis = tuple(e for e in plan.release_enis if ready(e))
        cidrs = tuple(c for c in plan.release_units if ready(c))
        if (enis, cidrs) == (plan.release_enis, plan.release_units):
            return plan
        return replace(plan, release_enis=enis, release_units=cidrs)

    def spare(self) -> tuple[int, float | None]:
        """What the last round's plan would give back and keeps for the release delay (ENIs and
        units), and the earliest time one of them may go (None: nothing waits)."""
        if not self._spare_since:
            return 0, None
        at = min(self._spare_since.values()) + max(self._settings.pool.release_delay_s, 0.0)
        at = max(at, self.last_shrink_at + self._settings.pool.shrink_interval_s)
        return len(self._spare_since), at

    # -- what happened -------------------------------------------------------------------------

    def back_off(self, until: float) -> None:
        """A round failed: none runs before `until`."""
        self.backoff_until = until

    def hold(self, until: float) -> None:
        """A throttle answer: background work waits at least until `until`."""
        self.warm_hold_until = max(self.warm_hold_until, until)

    def subnet_exhausted(self, err: SubnetExhausted) -> None:
        """A subnet had no room and no other can take over: growth pauses for the cooldown (or,
        with the fallback, grows /32s)."""
        cooldown_s = self._settings.subnets.exhausted_cooldown_s
        self.subnet_exhausted_until = self._clock.now() + cooldown_s
        logger.warning("pool.subnet_exhausted error=%s cooldown_s=%s", err, cooldown_s)

    def observe_subnets(self) -> bool:
        """Take the latest reading of the subnets' free addresses and turn scarcity on or off
        around the threshold. Returns whether the subnets are scarce."""
        threshold = self._settings.subnets.scarcity_threshold
        free = self._subnet_free()
        self.subnet_free = free
        scarce = scarce_after(self.scarce, free, threshold)
        if scarce and not self.scarce:
            logger.info(
                "pool.subnet_scarce on free=%s threshold=%d: warm targets at their minimum",
                free,
                threshold,
            )
        elif self.scarce and not scarce:
            logger.info(
                "pool.subnet_scarce off free=%s recovered_at=%d: warm targets as configured",
                free,
                threshold * RECOVERY_FACTOR,
            )
        self.scarce = scarce
        return scarce

    def prefixes_refused(self) -> None:
        """EC2 had no /28 for the pool, which has a fallback: it grows with /32s meanwhile."""
        if not self.prefix_fallback:
            logger.info(
                "pool.prefix_fallback on: secondary IPs for %.0f s, then prefixes",
                self._settings.subnets.exhausted_cooldown_s,
            )
        self.prefix_fallback = True

    def prefixes_granted(self) -> None:
        """EC2 gave a /28 again: growth is by prefixes, and the free /32s go back."""
        if self.prefix_fallback:
            logger.info("pool.prefix_fallback off: prefixes again, the free /32s go back")
        self.prefix_fallback = False


def serves_no_pod(engine: Engine) -> set[str]:
    """The ENIs whose addresses go to no new pod: held back (blocked, or in a closed subnet) and,
    under custom networking, the primary."""
    idle = set(engine.held_back())
    if not engine.settings.pods_on_primary:
        idle |= {e for e, r in engine.state.enis().items() if r.is_primary}
    return idle
