"""What every pool of a node has, whatever it keeps, and what the rest of the node reads of one.

A node's pool is chosen once with its address family (`ipamd.node.family`): an IPv4 node's
`PoolManager` (`ipamd.pool.manager`) grows and shrinks units on its ENIs; an IPv6 node's `Ipv6Pool`
(`ipamd.pool.ipv6`) keeps the primary ENI's one /80. Neither is the other's kind: each composes
`Rounds`, the part they share, and answers `Pool`, which is all the daemon, the drift, the
Kubernetes agent and the reports ask of a pool.

`Rounds` is the rhythm of a pool's rounds: when the next may run (`Conditions`, `Pace`), how they
fared (`PoolHealth`, the failure listeners), why an ADD finds the pool unable to grow
(`blocked_by`), the hold while the node is cordoned (`hold_while`), and the loop that runs a round
every interval or at once when an ADD found no address.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from typing import Protocol

from cloud.errors import CloudError
from cloud.models import NetworkInterface
from ipamd.clock import Clock
from ipamd.engine.engine import Engine
from ipamd.errors import StoreWriteFailed, utc_text
from ipamd.pool.conditions import Conditions, never_read
from ipamd.pool.health import PoolHealth, PoolReport
from ipamd.pool.pace import Pace
from ipamd.pool.params import PoolParams
from ipamd.pool.subnet_catalogue import SubnetCatalogue
from ipamd.sizing.inputs import PoolTargets
from ipamd.sizing.modes import UnitStrategy
from ipamd.sizing.plan import PoolPlan

logger = logging.getLogger(__name__)

FailureListener = Callable[[CloudError | StoreWriteFailed], None]

NO_PLAN = PoolPlan()
"""What a round that may not plan applies."""


class Rounds:
    """The rounds of one pool: their conditions and pace, their health, the hold and the loop."""

    def __init__(
        self,
        engine: Engine,
        settings: PoolParams,
        clock: Clock,
        rng: random.Random,
        subnet_free: Callable[[], int | None] = never_read,
    ) -> None:
        self._engine = engine
        self.health = PoolHealth()
        self.conditions = Conditions(engine, settings, clock, subnet_free)
        """What a round may do now and until when; the one place that trims the plan."""
        self.pace = Pace(engine, settings, self.health, self.conditions, clock, rng)
        """Pods waiting first, background work held back while the account is throttled."""
        self._held_by: Callable[[], str] = str
        self._failure_listeners: list[FailureListener] = []
        engine.explain_starvation(self.blocked_by)

    def hold_while(self, reason: Callable[[], str]) -> None:
        """No round changes anything in EC2 while `reason()` says why ("" when it may): a node
        cordoned (AWS_MANAGE_ENIS_NON_SCHEDULABLE=false)."""
        self._held_by = reason

    def held_by(self) -> str:
        """Why no round may change anything in EC2 now ("" when one may)."""
        return self._held_by()

    def blocked_by(self) -> str:
        """Why the pool cannot grow now, for an ADD's error, `/readyz` and `ipamctl status`: the last
        round's final failure with when it happened and when the next try is ("" when none)."""
        h = self.health
        if not h.blocked:
            return ""
        at = utc_text(h.last_error_at) if h.last_error_at is not None else "?"
        then = f", next try at {utc_text(h.next_try_at)}" if h.next_try_at is not None else ""
        return f"the pool cannot add addresses: EC2 refused it at {at} ({h.blocked}){then}"

    def report(self, *, creating_enis: bool, releasing: bool) -> PoolReport:
        """What a pool shows of itself, in one value: `GET /v1/pool`, the metrics endpoint and
        `ipamd.node.report` read this and nothing deeper. The pool says whether it is creating ENIs
        or releasing anything; the rest is the rounds'."""
        conditions = self.conditions
        return PoolReport(
            strategy=conditions.strategy,
            subnet_free=conditions.subnet_free,
            scarce=conditions.scarce,
            prefix_fallback=conditions.prefix_fallback,
            creating_enis=creating_enis,
            releasing=releasing,
            errors_by_code=dict(self.health.errors_by_code),
        )

    def on_failure(self, listener: FailureListener) -> None:
        """Call `listener` with each failed round's error (the Kubernetes Events of a missing
        permission); it must not raise."""
        self._failure_listeners.append(listener)

    def failed(self, err: CloudError | StoreWriteFailed, demand: bool) -> None:
        """A round failed with `err`: back off (with jitter), say so, tell the listeners."""
        delay = self.pace.failed(err, demand)
        logger.warning(
            "pool.failed error=%s retryable=%s demand=%s backoff_s=%.2f",
            err,
            err.retryable,
            demand,
            delay,
        )
        for listener in self._failure_listeners:
            listener(err)

    async def run(self, interval_s: float, run_once: Callable[[], Awaitable[PoolPlan]]) -> None:
        """`run_once` every `interval_s`, and at once when an ADD found the pool empty (the
        engine's demand, which each round takes as it starts)."""
        while True:
            self._engine.take_demand()
            await run_once()
            await self._engine.wait_for_demand(self.pace.next_wait_s(interval_s))


class Pool(Protocol):
    """What the rest of the node reads of its pool, whichever family's it is."""

    health: PoolHealth
    conditions: Conditions
    pace: Pace
    subnets: SubnetCatalogue
    """Where new ENIs go and which subnets are closed: the status and the ENIConfig follower read
    it on every node."""
    foreign_enis: set[str]
    """Attached ENIs of others, never touched; the drift updates the set in place."""

    @property
    def strategy(self) -> UnitStrategy: ...

    @property
    def new_enis(self) -> ListingWatch | None:
        """Told of each listing of the instance's ENIs (None: the pool makes no ENIs)."""
        ...

    @property
    def pending_enis(self) -> set[str]: ...

    @property
    def unbound_enis(self) -> set[str]: ...

    @property
    def releases_in_flight(self) -> set[str]: ...

    def hold_while(self, reason: Callable[[], str]) -> None: ...

    def expect_pods(self, pods_to_come: Callable[[], int]) -> None: ...

    def on_failure(self, listener: FailureListener) -> None: ...

    def blocked_by(self) -> str: ...

    def report(self) -> PoolReport: ...

    def targets(self) -> PoolTargets: ...

    def plan(self) -> PoolPlan: ...

    async def adopt(self) -> int: ...

    async def before_ready(self) -> None: ...

    async def run_once(self) -> PoolPlan: ...

    async def run(self, interval_s: float) -> None: ...


class ListingWatch(Protocol):
    """Who else reads the drift's listing of the instance's ENIs (`ipamd.pool.enis.EniMaker`: new
    ENIs take their device indexes from it)."""

    def listing_ticket(self) -> int: ...

    def listed(self, ticket: int, enis: tuple[NetworkInterface, ...]) -> None: ...
