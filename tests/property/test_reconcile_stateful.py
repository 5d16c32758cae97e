"""Stateful property test of reconcile: the engine on a real state file, the pool manager, EC2 drift,
the IMDS hint (whose trigger runs the drift) and the runtime leak GC, on in-memory fakes with state
(`cloud.fakes`) and a fake clock, under random interleavings of pod ADDs and DELs, pool
ticks, reconcile rounds, IMDS going stale in both directions for as long as it likes (seed 001), EC2's
Describe lagging within the grace window, DELs that never arrive (seed 003), an unreachable runtime and
restarts from disk.

Checked after every step, besides the invariants of docs/architecture.md §3.4 (`check_invariants`):
- zero in-use addresses released: every address of a live pod (ADD acknowledged, no DEL, sandbox
  still running) is still owned by that pod in ipamd and still on its ENI in EC2's truth, and no unit
  holding one ever left EC2;
- zero addresses handed out that EC2 does not list: each ADD's addresses were on their ENI in EC2 at
  that moment — and, stronger, every unit ipamd could hand out is on its ENI in EC2's truth;
- a unit ipamd calls lost is one EC2 really dropped;
- IMDS alone never changes the inventory.
EC2 calls may also time out, before EC2 acted or after (the answer lost). The three bugs this machine
found are replayed step by step in `test_reconcile_replays` as regression tests.
Some rules check liveness too: once EC2's view has caught up and the grace windows have closed, one
drift makes ipamd's inventory equal EC2's, and a clean IMDS then agrees with it; a pod whose DEL went
missing is released by the leak GC once the grace period has passed.

Each machine owns a private event loop and runs every step to completion on it (as
`test_engine_stateful` does). `IPAMD_HYPOTHESIS_EXAMPLES` raises the number of examples (default 60,
of up to 100 steps each: some thousands of reconcile rounds in about ten seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import shutil
import tempfile
from collections.abc import Awaitable
from pathlib import Path
from typing import ClassVar, TypeVar

import pytest
from hypothesis import currently_in_test_context, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from cloud.errors import CloudError
from cloud.fakes import FakeEc2, FakeImds
from cloud.models import Ipv4UnitKind
from datastore.records import AllocationRecord
from datastore.store import STATE_FILE_NAME
from ipamd.clock import Clock, FakeClock
from ipamd.config import groups
from ipamd.config.groups import ReconcileSettings, RuntimeSettings
from ipamd.engine.allocator import EngineParams
from ipamd.engine.engine import Engine
from ipamd.engine.invariants import check_invariants, normalized
from ipamd.errors import MaxPodsReached, NoAddressAvailable, NodeFull
from ipamd.node.cloud_node import node_config
from ipamd.node.engine_parts import describe_node, open_parts
from ipamd.pool.rounds import Pool
from ipamd.runtime.fake import FakeRuntime
from ipamd.runtime.ports import RuntimeUnavailable
from ipamd.sizing.inputs import PoolTargets
from tests.support.node import key

T = TypeVar("T")

GRACE_S = 60.0
"""IPAMD_RECONCILE_GRACE's default; EC2's Describe lags by at most this much (the premise)."""
LEAK_GRACE_S = 120.0
LAGS_S = (GRACE_S, 1.0, 0.0, 5.0, 30.0, GRACE_S - 1)
"""The worst case first: hypothesis draws (and shrinks towards) it most."""
CLOCK_STEPS_S = (1.0, 5.0, 10.0, 29.0, 31.0, 59.0, 60.0, 61.0, 121.0, 301.0, 601.0)
"""Small steps, and steps past the cooldown (30 s), the grace (60 s), the leak grace (120 s)."""
ALL_FAULTS = tuple(
    (operation, after_acting)
    for operation in (
        "describe_enis",
        "assign_units",
        "unassign_units",
        "create_eni",
        "attach_eni",
        "detach_eni",
        "delete_eni",
    )
    for after_acting in (False, True)
)
TARGETS = (
    PoolTargets(min_eni_lifetime_s=0.0),
    PoolTargets(),
    PoolTargets(warm_ip_target=2, minimum_ip_target=2, min_eni_lifetime_s=0.0),
    PoolTargets(warm_ip_target=1, min_eni_lifetime_s=0.0),
    PoolTargets(minimum_ip_target=6, warm_eni_target=0, warm_prefix_target=0),
)


def tally(text: str) -> None:
    """A hypothesis event (shown with --hypothesis-show-statistics); a no-op in a plain replay."""
    if currently_in_test_context():
        event(text)


class ReconcileMachine(RuleBasedStateMachine):
    """One node: the daemon's parts on the fakes, and what the test knows to be true of its pods."""

    FAULTS: ClassVar[tuple[tuple[str, bool], ...]] = ALL_FAULTS
    """EC2 calls that may time out here: (port method, whether EC2 acted before the answer was
    lost)."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        shm = Path("/dev/shm")  # durability is not what this test checks; a tmpfs keeps fsync cheap
        self.dir = Path(
            tempfile.mkdtemp(prefix="ipamd-reconcile-", dir=shm if shm.is_dir() else None)
        )
        self.path = self.dir / "state" / STATE_FILE_NAME
        self.clock = FakeClock()
        self.ec2 = FakeEc2(self.clock)
        self.imds = FakeImds(self.ec2)
        self.runtime = FakeRuntime(self.clock)
        self.engine: Engine | None = None
        self.pool: Pool | None = None
        self.live: dict[str, AllocationRecord] = {}
        """Pods whose ADD was acknowledged, with no DEL, whose sandbox is running."""
        self.zombies: set[str] = set()
        """Pods whose sandbox is gone but whose DEL never arrived."""
        self.pod_ids = itertools.count()
        self.unassigned_seen = 0

    def teardown(self) -> None:
        try:
            if self.engine is not None:
                self.loop.run_until_complete(self.engine.close())
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
        finally:
            self.loop.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- plumbing --------------------------------------------------------------------------------

    def run(self, awaitable: Awaitable[T]) -> T:
        async def call() -> T:
            return await awaitable

        return self.loop.run_until_complete(call())

    @property
    def eng(self) -> Engine:
        assert self.engine is not None
        return self.engine

    @property
    def pm(self) -> Pool:
        assert self.pool is not None
        return self.pool

    def open(self, adopt: bool, live_containers: frozenset[str] | None) -> None:
        """Start the daemon's parts afresh on the state file and the same fakes."""

        async def open_engine(path: Path, clock: Clock, settings: EngineParams) -> Engine:
            return await Engine.open(path, clock, settings, live_containers)

        parts = self.run(
            open_parts(
                self.config,
                self.facts,
                ec2=self.ec2,
                imds=self.imds,
                runtime=self.runtime,
                clock=self.clock,
                open_engine=open_engine,
                rng=random.Random(7),
            )
        )
        self.engine, self.pool = parts.engine, parts.pool
        self.drift, self.hint, self.gc = parts.drift, parts.hint, parts.leak_gc
        self.drift_wanted = parts.drift_wanted
        self.run(self.engine.claim_instance(self.ec2.instance_id))
        if adopt:
            self.run(self.pool.adopt())

    # -- start -----------------------------------------------------------------------------------

    @initialize(
        kind=st.sampled_from(["ip", "ip", "prefix"]),
        max_enis=st.sampled_from([2, 3]),
        per_eni=st.sampled_from([3, 4, 6, 10]),
        knobs=st.sampled_from(TARGETS),
        cooldown_s=st.sampled_from([30, 30, 0]),
        leftovers=st.integers(min_value=0, max_value=2),
        lag_s=st.sampled_from(LAGS_S),
        lag_seed=st.none() | st.integers(min_value=0, max_value=2**16),
    )
    def boot(
        self,
        kind: Ipv4UnitKind,
        max_enis: int,
        per_eni: int,
        knobs: PoolTargets,
        cooldown_s: int,
        leftovers: int,
        lag_s: float,
        lag_seed: int | None,
    ) -> None:
        """A node whose primary ENI may hold units left from an earlier life, a pool with one of
        the knob sets, and EC2's Describe lagging by up to `lag_s`."""
        self.ec2 = FakeEc2(
            self.clock, subnet_cidr="10.0.0.0/24", max_enis=max_enis, ipv4_per_eni=per_eni
        )
        self.imds = FakeImds(self.ec2)
        self.runtime = FakeRuntime(self.clock)
        primary = next(iter(self.ec2.enis))
        self.run(self.ec2.assign_units(primary, kind, min(leftovers, per_eni - 1)))
        rng = None if lag_seed is None else random.Random(lag_seed)
        self.ec2.lag_s, self.ec2.lag_rng = lag_s, rng  # the leftovers are old news to EC2
        self.config = node_config(
            self.dir / "state",
            knobs,
            prefix_mode=kind == "prefix",
            engine=groups.EngineSettings(ip_cooldown_period_s=cooldown_s),
            reconcile=ReconcileSettings(grace_s=GRACE_S),
            runtime=RuntimeSettings(leak_grace_s=LEAK_GRACE_S),
        )
        self.facts = self.run(describe_node(self.ec2, self.ec2.instance_id))
        self.open(adopt=True, live_containers=None)
        tally(f"mode {kind}, lag {lag_s:g} s {'jittered' if rng else 'fixed'}")

    # -- pods ------------------------------------------------------------------------------------

    @rule()
    def add_pod(self) -> None:
        """The runtime starts a sandbox and sends ADD. A failed ADD tears the sandbox down with a
        DEL, as containerd does; an empty pool makes the pool manager grow at once."""
        cid = f"pod-{next(self.pod_ids)}"
        self.runtime.start(cid)
        try:
            alloc = self.run(self.eng.assign(key(cid)))
        except (NoAddressAvailable, MaxPodsReached, NodeFull) as err:
            tally(f"ADD -> {type(err).__name__}")
            self.run(self.eng.release(key(cid)))
            self.runtime.stop(cid)
            if self.eng.take_demand():
                self.pool_round()
            return
        for address, cidr in zip(alloc.addresses, alloc.unit_cidrs, strict=True):
            assert self.ec2.attached_eni_of(cidr) == alloc.eni_id, (
                f"handed out {address} of {cidr}, which EC2 does not list on {alloc.eni_id}"
            )
        self.live[cid] = alloc

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def repeat_add(self, data: st.DataObject) -> None:
        """A retried ADD gets the same addresses."""
        cid = data.draw(st.sampled_from(sorted(self.live)), label="pod")
        assert self.run(self.eng.assign(key(cid))) == self.live[cid]

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def del_pod(self, data: st.DataObject) -> None:
        self.delete(data.draw(st.sampled_from(sorted(self.live)), label="pod"))

    def delete(self, cid: str) -> None:
        """DEL, then the runtime removes the sandbox."""
        released = self.run(self.eng.release(key(cid)))
        assert released == (self.live.pop(cid),)
        self.runtime.stop(cid)

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def missed_del(self, data: st.DataObject) -> None:
        """The sandbox goes away and its DEL never reaches ipamd (seed 003)."""
        cid = data.draw(st.sampled_from(sorted(self.live)), label="pod")
        del self.live[cid]
        self.runtime.stop(cid)
        self.zombies.add(cid)

    @precondition(lambda self: bool(self.zombies))
    @rule(data=st.data())
    def late_del(self, data: st.DataObject) -> None:
        """The missing DEL arrives after all, perhaps after the leak GC released the pod."""
        cid = data.draw(st.sampled_from(sorted(self.zombies)), label="pod")
        self.run(self.eng.release(key(cid)))
        self.zombies.discard(cid)

    # -- the daemon's rounds ---------------------------------------------------------------------

    def pool_round(self) -> None:
        plan = self.run(self.pm.run_once())
        tally(f"pool tick: {'no-op' if plan.is_empty() else 'applied'}")

    def drift_round(self) -> None:
        try:
            report = self.run(self.drift.run_once())
        except CloudError:
            tally("drift: EC2 failed")
            return
        tally(f"drift: {'changed' if report.changed() else 'no change'}")

    def hint_then_drift(self) -> None:
        """The IMDS hint compares; a disagreement triggers a drift. IMDS alone changes nothing."""
        before = normalized(self.eng.state.to_image())
        self.drift_wanted.clear()
        try:
            found = self.run(self.hint.run_once())
        except CloudError:
            tally("hint: IMDS unavailable")
            return
        assert normalized(self.eng.state.to_image()) == before, "IMDS changed the inventory"
        triggered = self.drift_wanted.is_set()
        tally(f"hint: {'disagrees' if found else 'agrees'}{', triggers' if triggered else ''}")
        if triggered:
            self.drift_round()

    def gc_round(self) -> tuple[str, ...]:
        unreachable = self.gc.unreachable
        try:
            released = self.run(self.gc.run_once())
        except RuntimeUnavailable:
            assert self.gc.unreachable == unreachable + 1, "a failed listing is counted"
            released = ()  # the round failed having released nothing
        else:
            assert self.gc.unreachable == unreachable
        leaked_live = set(released) & set(self.live)
        assert not leaked_live, f"leak GC released live pods {leaked_live}"
        self.zombies.difference_update(released)
        tally(f"leak GC: released {min(len(released), 2)}{'+' if len(released) > 2 else ''}")
        return released

    @rule(ticks=st.integers(min_value=1, max_value=3))
    def pool_tick(self, ticks: int) -> None:
        for _ in range(ticks):
            self.pool_round()

    @rule()
    def ec2_drift(self) -> None:
        self.drift_round()

    @rule()
    def imds_hint(self) -> None:
        self.hint_then_drift()

    @rule()
    def leak_gc(self) -> None:
        self.gc_round()

    @rule(seconds=st.sampled_from([1.0, 5.0]))
    def daemon_tick(self, seconds: float) -> None:
        """A moment of the running daemon: the pool, the IMDS hint (and its drift), the leak GC."""
        self.clock.advance(seconds)
        self.pool_round()
        self.hint_then_drift()
        self.gc_round()

    # -- the world -------------------------------------------------------------------------------

    @rule(seconds=st.sampled_from(CLOCK_STEPS_S))
    def advance_clock(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule(data=st.data())
    def imds_goes_stale(self, data: st.DataObject) -> None:
        """IMDS keeps released units, hides new ones or a whole ENI, for as long as it likes; or
        catches up."""
        how = data.draw(st.sampled_from(["keep", "hide", "hide_eni", "heal", "unavailable"]))
        imds, ec2 = self.imds, self.ec2
        if how == "keep" and ec2.ever_assigned():
            picks = st.lists(st.sampled_from(ec2.ever_assigned()), max_size=4, unique=True)
            imds.kept.update(data.draw(picks, label="kept"))
        elif how == "hide" and (held := sorted(c for u in ec2.truth().values() for c in u)):
            imds.hidden.update(
                data.draw(st.lists(st.sampled_from(held), max_size=4, unique=True), label="hidden")
            )
        elif how == "hide_eni":
            enis = sorted(ec2.truth())
            imds.hidden_enis.add(data.draw(st.sampled_from(enis), label="hidden_eni"))
        elif how == "unavailable":
            imds.available = not imds.available
        else:
            imds.heal()
        tally(f"IMDS {how}")

    @rule(data=st.data())
    def imds_equal_count_lie(self, data: st.DataObject) -> None:
        """Seed 001's shape: IMDS keeps n released units and misses n held ones, so its counts
        equal EC2's while its contents differ."""
        held = sorted(c for units in self.ec2.truth().values() for c in units)
        gone = sorted(set(self.ec2.ever_assigned()) - set(held))
        n = data.draw(st.integers(1, max(1, min(len(held), len(gone), 4))), label="n")
        if len(held) < n or len(gone) < n:
            return
        picks = st.lists(st.sampled_from(held), min_size=n, max_size=n, unique=True)
        self.imds.hidden.update(data.draw(picks, label="hidden"))
        picks = st.lists(st.sampled_from(gone), min_size=n, max_size=n, unique=True)
        self.imds.kept.update(data.draw(picks, label="kept"))
        tally("IMDS equal-count lie")

    @rule(lag_s=st.sampled_from(LAGS_S), seed=st.none() | st.integers(0, 2**16))
    def ec2_lag(self, lag_s: float, seed: int | None) -> None:
        """EC2's Describe lag changes, always within the grace window."""
        self.ec2.lag_s = lag_s
        self.ec2.lag_rng = None if seed is None else random.Random(seed)

    @precondition(lambda self: bool(self.FAULTS))
    @rule(data=st.data())
    def ec2_call_times_out(self, data: st.DataObject) -> None:
        """The next call of an operation times out: before EC2 acted, or after (its answer lost)."""
        operation, after_acting = data.draw(st.sampled_from(self.FAULTS), label="fault")
        self.ec2.fail_next(operation, after_acting)

    @rule()
    def runtime_flaps(self) -> None:
        """The runtime's socket stops answering, or answers again."""
        self.runtime.reachable = not self.runtime.reachable

    @rule(tell_live=st.booleans())
    def restart(self, tell_live: bool) -> None:
        """ipamd restarts: close, reopen from disk, new pool manager and reconcilers, same world."""
        before = normalized(self.eng.state.to_image())
        self.run(self.eng.close())
        live = frozenset(self.runtime.sandboxes) if tell_live else None
        self.open(adopt=False, live_containers=live)
        assert normalized(self.eng.state.to_image()) == before, "the state after a restart differs"

    @rule()
    def restart_and_adopt(self) -> None:
        """A restart after which the pool manager takes EC2's word for the ENIs first, as at a
        first start (`PoolManager.adopt`)."""
        self.restart(tell_live=False)
        with contextlib.suppress(CloudError):  # an injected timeout: the drift reads EC2 later
            self.run(self.pm.adopt())

    # -- liveness --------------------------------------------------------------------------------

    @rule()
    def quiesce(self) -> None:
        """Past the lag and every grace window, one drift makes ipamd's inventory EC2's, and an IMDS
        that has caught up agrees with it."""
        self.ec2.clear_faults()
        self.clock.advance(GRACE_S + 1)
        self.drift_round()
        state = self.eng.state
        ours = {
            eni_id: {c for c in state.units_on(eni_id) if state.units()[c].state != "lost"}
            for eni_id in state.enis()
        }
        assert ours == self.ec2.truth(), "after the grace window, ipamd's inventory is EC2's"
        if not self.imds.stale() and self.imds.available:
            assert self.run(self.hint.run_once()) == [], "a caught-up IMDS agrees"

    @precondition(lambda self: bool(self.zombies) and self.runtime.reachable)
    @rule()
    def leak_gc_catches_up(self) -> None:
        """Two listings without the sandbox, past the leak grace: every pod whose DEL went missing
        is released."""
        self.gc_round()
        self.clock.advance(LEAK_GRACE_S)
        self.gc_round()
        assert not self.zombies & {k.container_id for k in self.eng.state.allocations()}, (
            "leaked pods still held"
        )
        self.zombies.clear()

    # -- after every step ------------------------------------------------------------------------

    @invariant()
    def nothing_in_use_released_nothing_unlisted_handed_out(self) -> None:
        if self.engine is None:
            return
        state, ec2 = self.engine.state, self.ec2
        check_invariants(self.engine, self.path, self.clock.now())
        live_units = {c: cid for cid, a in self.live.items() for c in a.unit_cidrs}
        for cid, alloc in self.live.items():
            assert state.allocation(alloc.key) == alloc, f"live pod {cid} lost its allocation"
            for address, cidr in zip(alloc.addresses, alloc.unit_cidrs, strict=True):
                assert state.owner_of(address) == alloc.key, f"{address} of {cid} changed owner"
                on = ec2.attached_eni_of(cidr)
                assert on == alloc.eni_id, f"in-use {address} of {cid} left EC2 (on {on})"
        for _, eni_id, cidr in ec2.unassigned[self.unassigned_seen :]:
            assert cidr not in live_units, f"{cidr} of live {live_units[cidr]} left {eni_id}"
        self.unassigned_seen = len(ec2.unassigned)
        for cidr, unit in state.units().items():
            on = ec2.attached_eni_of(cidr)
            if unit.state == "active":
                assert on == unit.eni_id, f"{cidr} may be handed out, but EC2 has it on {on}"
            elif unit.state == "lost":
                assert on != unit.eni_id, f"{cidr} called lost, but EC2 lists it on {on}"


EXAMPLES = int(os.environ.get("IPAMD_HYPOTHESIS_EXAMPLES", "60"))


# Hypothesis shrinks a failure for up to five minutes: the usual timeout would cut the minimal failing
# sequence off before it is printed.
@pytest.mark.timeout(360 + 2 * EXAMPLES)
def test_reconcile_never_releases_in_use_addresses_nor_hands_out_unlisted_ones() -> None:
    run_state_machine_as_test(
        ReconcileMachine,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=100,
            deadline=None,
            report_multiple_bugs=False,
        ),
    )
