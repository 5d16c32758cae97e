"""When the pool manager calls EC2: rounds that pods wait for go first, the warm pool after, and
both slow down while the account is throttled.

Every node of a cluster draws on the same account's API buckets (docs/architecture.md §5.5). In a
burst, the calls that serve a waiting ADD compete with every other node's calls that only top up a
warm pool or give addresses back. A node cannot see the other nodes, but it sees the throttle
answers, and it knows which of its own rounds a pod waits for.

- **Demand rounds.** A round is one when an ADD found no address since the pool last gained one
  (within `DEMAND_WINDOW_S`) and none is free now. It calls EC2 at once, even while warm-up is
  held. It applies only what the pods need, the assigns and one new ENI, and leaves the rest of
  its plan to a round of its own (`Conditions.trim`). Until the account throttles this node, its
  calls are retried inside the adapter. Once it does, the node is in a throttle episode (throttle
  answers no more than `EPISODE_GAP_S` apart): each round makes one attempt per call, and a
  throttled round is tried again within `DEMAND_THROTTLE_CAP_S`, later in the episode within
  `DEMAND_EPISODE_SHARE` of its length. Why: the runtime asks again only every 10 s or so (the
  kubelet's backoff), so the adapter's quick retries would mostly be refused, and a saturated
  account admits the same calls a second however often the nodes ask. Asking less often spares it
  (and the nodes) most of the refused calls, and costs a pod a bounded share of the time the
  account has been short. The episode sets the pace, not the pod's own wait: every node of a
  saturated cluster asks at about the same rate, and a node that starts to wait late does not
  overtake those that waited long.
- **Background work** is everything else: warm targets, minimum targets, shrinking. Its calls are
  not retried on a throttle (`cloud.ports.CallUrgency.BACKGROUND`).
  Each throttle answer the node sees, in any round, holds background work back for a while:
  jittered, between half and all of `WARM_HOLD_BASE_S` doubled per answer, up to
  `WARM_HOLD_CAP_S` (in a longer episode up to the episode's length, at most
  `WARM_HOLD_EPISODE_CAP_S`). Each background round that goes through unthrottled halves the
  next hold.

So while the account is throttled, the tokens it refills go to the nodes with pods waiting. `Pace`
works out these waits; `Conditions` (`ipamd.pool.conditions`) keeps the deadlines they set.
"""

from __future__ import annotations

import random

from cloud.backoff import backoff_delay_s
from cloud.errors import CloudError, NotFound, Rejected, Throttled
from cloud.ports import CallUrgency
from ipamd.clock import Clock
from ipamd.engine.engine import Engine
from ipamd.errors import StoreWriteFailed
from ipamd.pool.conditions import Conditions
from ipamd.pool.health import PoolHealth
from ipamd.pool.params import PoolParams

DEMAND_WINDOW_S = 60.0
"""An ADD that found no address this long ago no longer makes a round urgent."""
DEMAND_THROTTLE_CAP_S = 4.0
"""Most a round with pods waiting waits after it was throttled, early in a throttle episode."""
DEMAND_EPISODE_SHARE = 0.025
"""Later in the episode, most a throttled round with pods waiting waits, as a share of the episode's
length so far (and never past the pool's backoff cap)."""
WARM_HOLD_BASE_S = 120.0
"""Background work's first hold after a throttle answer. Long: a token the account refills while
the nodes hold their warm-up waits in its bucket for the first pod that waits (see
docs/architecture.md §5.6)."""
WARM_HOLD_CAP_S = 300.0
"""Background work's longest hold, early in a throttle episode; later, as long as the episode has
lasted, up to `WARM_HOLD_EPISODE_CAP_S`: the demand rounds ask less often then, and warm-up must
not take the share of the refill they leave."""
WARM_HOLD_EPISODE_CAP_S = 900.0
"""Background work's longest hold in a long throttle episode."""
EPISODE_GAP_S = WARM_HOLD_EPISODE_CAP_S + WARM_HOLD_CAP_S
"""Throttle answers further apart than this belong to two episodes. Longer than the longest hold,
so a node that only tries its warm-up now and then stays in the episode."""


class Pace:
    """The pool manager's pacing: which rounds pods wait for, how long a failed round waits, and
    how long background work holds after a throttle answer (the deadlines go to `Conditions`).
    Holds no lock and calls nothing; the pool manager asks it."""

    def __init__(
        self,
        engine: Engine,
        settings: PoolParams,
        health: PoolHealth,
        conditions: Conditions,
        clock: Clock,
        rng: random.Random,
    ) -> None:
        self._engine = engine
        self._settings = settings
        self._health = health
        self._conditions = conditions
        self._clock = clock
        self._rng = rng
        self._served_at = float("-inf")
        self._demand_failed = False
        """Whether the round that set the backoff was one pods wait for."""
        self._episode_began = float("-inf")
        self._last_throttle = float("-inf")
        """The first and the last throttle answer of the current (or last) throttle episode."""

    def demand(self) -> bool:
        """Whether an ADD is waiting for this round: one found no address since the pool last
        gained some, not long ago, and none is free now (pods may have left meanwhile)."""
        engine, now = self._engine, self._clock.now()
        starved = engine.starved_at
        if starved <= self._served_at or now - starved > DEMAND_WINDOW_S:
            return False
        settings, held = engine.settings, engine.held_back()
        skip_primary = not settings.pods_on_primary
        free = settings.picker()(engine.state, 1, now, settings.cooldown_s, held, skip_primary)
        return free is None

    def served(self) -> None:
        """The pool just gained addresses: the ADDs that found none may now find one."""
        self._served_at = self._clock.now()

    def next_wait_s(self, interval_s: float) -> float:
        """Until the pool manager's next tick: a round pods wait for that failed is tried again as
        soon as its backoff ends, without waiting for another ADD to ask; else on the next tick
        (and never inside a backoff)."""
        left = self._conditions.backoff_until - self._clock.now()
        if self._demand_failed and left > 0:
            return left
        return max(interval_s, left)

    def held(self) -> bool:
        """Whether background work waits (a throttle answer was seen lately)."""
        return self._conditions.held(self._clock.now())

    def urgency(self, demand: bool) -> CallUrgency:
        """The urgency a round's EC2 calls run under: retried on throttles (foreground) only when
        pods wait and the account is not throttling this node (no throttle episode)."""
        if demand and not self.in_episode():
            return CallUrgency.FOREGROUND
        return CallUrgency.BACKGROUND

    def in_episode(self) -> bool:
        """Whether a throttle answer came within `EPISODE_GAP_S`."""
        return self._clock.now() - self._last_throttle <= EPISODE_GAP_S

    def episode_s(self) -> float:
        """How long the account has been throttling this node: since the first of its throttle
        answers no more than `EPISODE_GAP_S` apart up to now (0 outside an episode)."""
        if not self.in_episode():
            return 0.0
        return self._clock.now() - self._episode_began

    def demand_cap_s(self) -> float:
        """Most a throttled round with pods waiting waits before it is tried again."""
        return max(DEMAND_THROTTLE_CAP_S, DEMAND_EPISODE_SHARE * self.episode_s())

    def throttle_seen(self) -> None:
        """A throttle answer, in any round: background work holds off longer."""
        h, now = self._health, self._clock.now()
        if not self.in_episode():
            self._episode_began = now
        self._last_throttle = now
        h.throttled_rounds += 1
        h.throttle_streak += 1
        cap_s = min(max(WARM_HOLD_CAP_S, self.episode_s()), WARM_HOLD_EPISODE_CAP_S)
        hold = backoff_delay_s(h.throttle_streak, WARM_HOLD_BASE_S, cap_s, self._rng, floor=0.5)
        self._conditions.hold(now + hold)

    def succeeded(self, demand: bool) -> None:
        """A round went through. A background round tries each call once, so it went through
        unthrottled: the next hold is half as long (a demand round may have been retried past
        throttles, so it says nothing of the account)."""
        h = self._health
        h.consecutive_failures = 0
        h.blocked = ""
        if not demand:
            h.throttle_streak = max(0, h.throttle_streak - 1)

    def failed(self, err: CloudError | StoreWriteFailed, demand: bool) -> float:
        """Set when the next round may run after `err`; returns the wait. Full jitter, so a fleet
        failing together does not retry together."""
        h, s = self._health, self._settings
        h.failures += 1
        h.consecutive_failures += 1
        h.errors_by_code[err.code] = h.errors_by_code.get(err.code, 0) + 1
        self._demand_failed = demand
        now = self._clock.now()
        h.last_error, h.last_error_at = str(err), now
        h.blocked = str(err) if is_final(err) else ""
        cap = s.backoff_cap_s
        if isinstance(err, Throttled):
            self.throttle_seen()
            if demand:
                cap = min(cap, self.demand_cap_s())
        if h.blocked:
            # Asking again soon cannot help (a subnet that does not exist, a permission missing):
            # the wait starts near the cap and keeps half of it, pods waiting or not.
            attempt = h.consecutive_failures + FINAL_HEAD_START
            delay = backoff_delay_s(attempt, s.backoff_base_s, cap, self._rng, floor=0.5)
        else:
            delay = backoff_delay_s(h.consecutive_failures, s.backoff_base_s, cap, self._rng)
        self._conditions.back_off(now + delay)
        h.next_try_at = now + delay
        return delay


FINAL_HEAD_START = 5
"""Doublings a final failure's backoff starts with: at the default 1 s base and 60 s cap, the
first wait is 16-32 s and the next ones 30-60 s, where a passing failure starts at 0-1 s."""


def is_final(err: CloudError | StoreWriteFailed) -> bool:
    """Whether `err` is one EC2 will answer again until someone changes something: a resource that
    does not exist (the ENIConfig's subnet, a security group) or a refusal (a permission, a bad
    parameter). Capacity answers (address or attachment limits, a full subnet) are not: they pass
    as pods go, and the pool has its own answers to them."""
    return isinstance(err, NotFound | Rejected)
