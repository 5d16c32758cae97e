"""An IPv4 node's pool manager: it applies the sizing plan through the EC2 port, one round at a
time (the rounds' conditions, pace, health and loop are `ipamd.pool.rounds.Rounds`).

A round (`PoolManager.run_once`) goes through four hops:

1. The subnets: their view is read if it is due, and the excluded ones are closed to new pods
   (`SubnetCatalogue.refresh_if_due`).
2. The conditions: no round runs while a failed round's backoff lasts, and none without pods
   waiting while background work is held after a throttle answer (`Conditions`; `Pace` says which
   rounds pods wait for).
3. The plan: the sizing plan for the node as it is now (`PoolManager.plan`, worked out again only
   when something it is made from changed), cut down to what this round may do (`Conditions.trim`:
   the release delay, a demand round's share, paused growth, the spacing of shrinks).
4. EC2: the plan's calls, growing before shrinking (`PoolManager._apply`), through the adapter's
   view for the round's urgency (`Pace.urgency`: retried on a throttle only if pods wait).

Growing fills the existing ENIs first, then creates new ones holding their units, tagged, attached
and recorded (`ipamd.pool.enis`). Every unit enters the inventory from EC2's own answer.
Shrinking (`ipamd.pool.release`) marks the units `releasing`, a committed change, before EC2 is
called, so no ADD can take them; if they became needed meanwhile, the release is aborted.

The engine's lock is never held across an EC2 call. A failed round backs off with jitter. A subnet
out of addresses sends growth to new ENIs in another subnet when discovery has one. Otherwise growth
pauses for a cooldown, or, in prefix mode with the fallback, grows secondary IPs meanwhile.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import replace

from cloud.errors import (
    AddressLimitExceeded,
    CloudError,
    SubnetExhausted,
    SubnetFragmented,
)
from cloud.models import Ipv4UnitKind
from cloud.ports import (
    Ec2Api,
    Instance,
)
from ipamd.clock import Clock
from ipamd.engine.engine import Engine
from ipamd.engine.inventory import diff_inventory, eni_record
from ipamd.errors import StoreWriteFailed
from ipamd.pool.conditions import never_read
from ipamd.pool.enis import EniMaker
from ipamd.pool.health import PoolReport
from ipamd.pool.params import PoolParams
from ipamd.pool.release import Releaser
from ipamd.pool.rounds import NO_PLAN, FailureListener, Rounds
from ipamd.pool.stats import StatsMemo, aged
from ipamd.pool.subnet_catalogue import SubnetCatalogue
from ipamd.sizing.inputs import NodeLimits, NodeStats, PoolTargets
from ipamd.sizing.modes import UnitStrategy
from ipamd.sizing.plan import PoolPlan, effective_max_enis, kept_after_marking, plan_pool
from ipamd.sizing.subnets import left_alone, plan_drain

logger = logging.getLogger(__name__)


class PoolManager:
    """An IPv4 node's `Pool`: grows and shrinks secondary IPs or /28s, and ENIs, to the targets."""

    def __init__(
        self,
        engine: Engine,
        ec2: Ec2Api,
        instance: Instance,
        limits: NodeLimits,
        settings: PoolParams,
        subnets: SubnetCatalogue,
        clock: Clock,
        rng: random.Random | None = None,
        *,
        subnet_free: Callable[[], int | None] = never_read,
    ) -> None:
        self._engine = engine
        self._ec2 = ec2
        self._instance = instance
        self._limits = limits
        self._settings = settings
        self._clock = clock
        self._rng = rng or random.Random()
        self.rounds = Rounds(engine, settings, clock, self._rng, subnet_free)
        self.health = self.rounds.health
        self.conditions = self.rounds.conditions
        """What a round may do now and until when; the one place that trims the plan."""
        self.pace = self.rounds.pace
        """Pods waiting first, background work held back while the account is throttled."""
        self.foreign_enis: set[str] = set()
        """Attached ENIs of others (EFA, trunk, `no_manage`): never touched, each takes a slot."""
        self.subnets = subnets
        """Where new ENIs go, and which subnets are closed to new pods."""
        self._enis = EniMaker(engine, ec2, instance, settings, subnets, clock, self.pace)
        self._releaser = Releaser(engine, instance.instance_id, self._no_longer_excess)
        self._stats = StatsMemo()
        self._planned: PoolPlan | None = None
        self._planned_for: tuple[object, ...] = ()
        self._pods_to_come: Callable[[], int] = int
        self._pod_aware = False

    def hold_while(self, reason: Callable[[], str]) -> None:
        """No round changes anything in EC2 while `reason()` says why (`Rounds.hold_while`)."""
        self.rounds.hold_while(reason)

    def expect_pods(self, pods_to_come: Callable[[], int]) -> None:
        """From now on the pool keeps free addresses for `pods_to_come()` pods, the ones bound to
        this node that hold none yet (IPAMD_POD_AWARE_POOL)."""
        self._pods_to_come = pods_to_come
        self._pod_aware = True

    def blocked_by(self) -> str:
        """Why the pool cannot grow now (`Rounds.blocked_by`)."""
        return self.rounds.blocked_by()

    @property
    def new_enis(self) -> EniMaker:
        """Where new ENIs are made; the drift's listings settle where they may be attached."""
        return self._enis

    @property
    def pending_enis(self) -> set[str]:
        """ENIs created but not yet in the inventory: ENI GC must not touch them."""
        return self._enis.pending

    @property
    def unbound_enis(self) -> set[str]:
        """New ENIs whose DeleteOnTermination the pool manager sets later: the drift leaves it."""
        return self._enis.unbound

    @property
    def releases_in_flight(self) -> set[str]:
        """Units whose unassign (or whose ENI's detach) is being called right now: reconcile leaves
        them to this call instead of judging a half-done release."""
        return self._releaser.in_flight

    @property
    def strategy(self) -> UnitStrategy:
        """What the pool grows by now (`Conditions.strategy`)."""
        return self.conditions.strategy

    def report(self) -> PoolReport:
        """What the pool manager shows of itself (`Rounds.report`)."""
        return self.rounds.report(
            creating_enis=bool(self._enis.pending), releasing=bool(self._releaser.in_flight)
        )

    def stats(self) -> NodeStats:
        return self._stats(self._engine.state, self._clock.now(), self._engine.settings.cooldown_s)

    def plan(self) -> PoolPlan:
        """The plan for the node as it is now. Worked out again only when something it is made
        from changed (most rounds nothing has): the counts, which ENIs are old enough to go, the
        subnets and ENIs closed, the foreign ENIs, the mode and the strategy."""
        now = self._clock.now()
        counted = self._stats.counts(self._engine.state, now, self._engine.settings.cooldown_s)
        targets = self._targets()
        inputs = (
            counted,
            self._stats.mature(counted, now, targets),
            self.subnets.growth_closed(),
            self._engine.closed_enis(),
            len(self.foreign_enis),
            self.conditions.scarce,
            self.strategy,
            targets,
            self._limits,
        )
        if self._planned is None or inputs != self._planned_for:
            self._planned, self._planned_for = self._plan_on(aged(counted, now), targets), inputs
        return self._planned

    def targets(self) -> PoolTargets:
        """The targets the pool follows now: as configured, with the pods on their way."""
        return self._targets()

    def _targets(self) -> PoolTargets:
        """The configured targets, with the pods on their way to this node (`expect_pods`)."""
        targets = self._settings.targets
        if not self._pod_aware:
            return targets
        return replace(targets, pods_to_come=self._pods_to_come(), pod_aware=True)

    def _plan_on(self, stats: NodeStats, targets: PoolTargets) -> PoolPlan:
        """The plan for `stats`: the targets met on the ENIs that take pods (at their minimum while
        the subnets are scarce), no growth on the ENIs of full subnets while new ENIs may go to
        another (`SubnetCatalogue.growth_closed`), and the ENIs of closed subnets drained
        (`plan_drain`)."""
        stats = self.subnets.without_growth(stats, self._engine.state)
        closed, others = self._engine.closed_enis(), len(self.foreign_enis)
        drain = plan_drain(stats, targets, self._limits, closed, others)
        scarce = self.conditions.scarce
        planned = plan_pool(drain.stats, drain.targets, drain.limits, self.strategy, scarce=scarce)
        return drain.applied_to(planned)

    async def adopt(self) -> int:
        """Take EC2's word for the ENIs attached to this instance and their units of the current
        kind: what EC2 lists and ipamd lacks enters the inventory as free. Returns units added."""
        enis = await self._ec2.describe_enis(self._instance.instance_id)
        kind = self.strategy.kind
        added = 0
        self.foreign_enis.clear()
        for eni in enis:
            if eni.device_index is None:
                continue
            if left_alone(eni.tags, eni.interface_type, eni.is_primary):
                self.foreign_enis.add(eni.eni_id)
                continue
            if eni.eni_id not in self._engine.state.enis():
                await self._engine.add_eni(eni_record(eni, eni.device_index, self._clock.now()))
            missing = self._adoptable(eni.eni_id, kind, eni.units(kind))
            await self._engine.add_units(eni.eni_id, missing, kind)
            added += len(missing)
        return added

    def _adoptable(
        self, eni_id: str, kind: Ipv4UnitKind, listed: tuple[str, ...]
    ) -> tuple[str, ...]:
        """Units EC2 lists and the inventory lacks, except those ipamd returned within the grace
        window: EC2's listing may not show the return yet (the drift reconcile's own rule)."""
        state, now = self._engine.state, self._clock.now()
        return diff_inventory(state, eni_id, kind, listed, now, self._settings.release_grace_s).new

    async def before_ready(self) -> None:
        """What must be in place before the node takes pods: nothing here, the pool grows from its
        loop (an IPv6 node's /80 is: `ipamd.pool.ipv6`)."""

    async def run_once(self) -> PoolPlan:
        """One tick: plan and apply what the conditions allow. Returns the plan applied (empty if
        none): none while backing off, and none without pods waiting while background work is
        held."""
        if not self._settings.provisioning or self.rounds.held_by():
            return NO_PLAN  # provisioned by someone else, or the node is cordoned
        await self.refresh_subnets()
        now, conditions = self._clock.now(), self.conditions
        if conditions.backing_off(now):
            return NO_PLAN
        conditions.observe_subnets()
        demand = self.pace.demand()
        if not demand and conditions.held(now):
            return NO_PLAN
        plan = conditions.trim(self.plan(), now, demand)
        if plan.is_empty():
            self.health.blocked = ""  # nothing to ask of EC2: no failure stands in the way
        if not demand:
            await self._enis.bind_waiting(growing=bool(plan.assign or plan.new_enis))
        if not plan.new_enis:
            await self._enis.drop_unattached()
        if plan.is_empty():
            return plan
        try:
            await self._apply(plan, self._ec2.with_urgency(self.pace.urgency(demand)))
        except (CloudError, StoreWriteFailed) as err:
            # A full or failing disk is a failed tick like a failed EC2 call: the change was not
            # recorded, so memory is unchanged; what EC2 did meanwhile the drift reconciles.
            self._failed(err, demand)
            return plan
        self.health.plans_applied += 1
        self.health.demand_rounds += demand
        self.pace.succeeded(demand)
        return plan

    async def refresh_subnets(self) -> None:
        """Read the subnets if the catalogue's view is due; close the excluded ones to new pods."""
        await self.subnets.refresh_if_due()
        self._engine.close_subnets(self.subnets.closed)

    def _failed(self, err: CloudError | StoreWriteFailed, demand: bool) -> None:
        if self.subnets.takes_over(err):
            logger.info("pool.subnet_full error=%s: new ENIs go to another subnet", err)
        elif isinstance(err, SubnetExhausted):
            self.conditions.subnet_exhausted(err)
        self.rounds.failed(err, demand)

    def on_failure(self, listener: FailureListener) -> None:
        """Call `listener` with each failed round's error (`Rounds.on_failure`)."""
        self.rounds.on_failure(listener)

    async def _apply(self, plan: PoolPlan, ec2: Ec2Api) -> None:
        """`plan`'s calls, through the view of the adapter for the round's urgency."""
        logger.info("pool.apply plan=%s", plan)
        if plan.replace_units:
            # Leftover /32s make room for the prefixes `assign` puts in their slots.
            await self._releaser.release_units(plan.replace_units, ec2)
        for eni_id, count in plan.assign:
            await self._grow_eni(eni_id, count, ec2)
        for count in plan.new_enis:
            await self._new_eni(count, ec2)
        if plan.release_units:
            await self._releaser.release_units(plan.release_units, ec2)
        for eni_id in plan.release_enis:
            try:
                await self._releaser.release_eni(eni_id, ec2)
            finally:
                if eni_id not in self._engine.state.enis():  # detached, or no longer attached
                    self._enis.released(eni_id)

    # -- growing -------------------------------------------------------------------------------

    async def _grow_eni(self, eni_id: str, count: int, ec2: Ec2Api) -> None:
        kind = self.strategy.kind
        falls_back = kind == "prefix" and self._settings.fallback_strategy is not None
        try:
            cidrs = await ec2.assign_units(eni_id, kind, count)
        except AddressLimitExceeded:
            # EC2 holds more on this ENI than ipamd knows: take EC2's word for what is there.
            await self._resync_eni(eni_id, ec2)
            raise
        except SubnetExhausted as err:
            if kind == "prefix" and await self._prefixes_elsewhere(eni_id, err, count, ec2):
                return
            if (record := self._engine.state.eni(eni_id)) is not None:
                self.subnets.refused(record.subnet_id, err, self.strategy.addresses_in(count))
            if falls_back and not self.subnets.takes_over(err):
                self.conditions.prefixes_refused()
            raise
        if falls_back and cidrs:
            self.conditions.prefixes_granted()
        await self._engine.add_units(eni_id, cidrs, kind)
        self.pace.served()
        logger.info("pool.grow eni_id=%s kind=%s units=%d", eni_id, kind, len(cidrs))

    async def _prefixes_elsewhere(
        self, eni_id: str, err: SubnetExhausted, count: int, ec2: Ec2Api
    ) -> bool:
        """A subnet too fragmented for a /28: the prefixes go on another ENI with room, or a new one
        in another eligible subnet; False leaves it to the fallback to /32s."""
        eni = self._engine.state.eni(eni_id)
        if not isinstance(err, SubnetFragmented) or eni is None:
            return False
        elsewhere = self.subnets.no_prefixes(
            eni.subnet_id, self._settings.subnets.exhausted_cooldown_s
        )
        engine, per_eni = self._engine, self._limits.units_per_eni
        primary_ok = engine.settings.pods_on_primary
        other = self.subnets.eni_with_room(
            engine.state, engine.closed_enis(), per_eni, count, primary_ok=primary_ok
        )
        if other is not None:
            logger.info("pool.prefixes_elsewhere from=%s to=%s", eni_id, other)
            await self._grow_eni(other, count, ec2)
            return True
        used = len(engine.state.enis()) + len(self.foreign_enis)
        if elsewhere is None or used >= effective_max_enis(self._settings.targets, self._limits):
            return False
        logger.info("pool.prefixes_elsewhere from=%s to=new ENI in %s", eni_id, elsewhere)
        try:
            await self._new_eni(count, ec2)
        except SubnetExhausted:
            return False
        return True

    async def _new_eni(self, count: int, ec2: Ec2Api) -> None:
        eni_id, held = await self._enis.make(count, self.strategy.kind, ec2)
        if held:
            self.pace.served()
        try:
            if count > held:
                await self._grow_eni(eni_id, count - held, ec2)
        except BaseException:
            self._enis.abandon(eni_id)
            raise

    async def _resync_eni(self, eni_id: str, ec2: Ec2Api) -> None:
        enis = await ec2.describe_enis(self._instance.instance_id)
        for eni in enis:
            if eni.eni_id == eni_id:
                kind = self.strategy.kind
                adoptable = self._adoptable(eni_id, kind, eni.units(kind))
                await self._engine.add_units(eni_id, adoptable, kind)

    # -- shrinking -----------------------------------------------------------------------------

    def _no_longer_excess(self, marked: tuple[str, ...]) -> set[str]:
        """Units marked for release that a fresh plan, counting them as free, would now keep."""
        targets = self._targets()
        return kept_after_marking(self.stats(), marked, lambda s: self._plan_on(s, targets))

    # -- the loop ------------------------------------------------------------------------------

    async def run(self, interval_s: float) -> None:
        """A round every `interval_s`, and at once when an ADD found the pool empty (`Rounds.run`)."""
        await self.rounds.run(interval_s, self.run_once)
