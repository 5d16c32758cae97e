"""Stateful property test of the allocation engine: random interleavings of ADD, DEL, clock advances,
inventory changes, injected commit failures, restarts and concurrent pairs, checked after every step
against the invariants of docs/architecture.md §3.4 and a reference model (`tests.property.model`).

The engine is async and hypothesis's state machines are not: each machine owns a private event loop
and runs every step to completion on it, so a step is atomic from hypothesis's point of view while
the concurrent rules still interleave real coroutines inside one step. `IPAMD_HYPOTHESIS_EXAMPLES`
sets the number of examples (default 150).

What each scenario replays, and which tests prove it: docs/failure-scenarios.md.
"""

from __future__ import annotations

import asyncio
import copy
import os
import shutil
import tempfile
import threading
from collections.abc import Awaitable
from pathlib import Path

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from datastore.records import AllocationKey
from datastore.store import STATE_FILE_NAME
from ipamd.clock import FakeClock
from ipamd.engine.allocator import EngineParams
from ipamd.engine.engine import Engine
from ipamd.engine.invariants import check_invariants, normalized
from ipamd.engine.pick_v6 import pick_v6_addresses
from ipamd.errors import IpamdError, StoreWriteFailed
from tests.property.draws import ENI_IDS, IFNAMES, NETWORKS, Mode, StepDraws, releasing
from tests.property.model import Add, AttachEni, Del, Model, Step
from tests.support.node import NodeFixture

CLOCK_STEPS_S = (1, 10, 29, 30, 31, 120, 599, 600, 601)
"""Including the exact cooldown (30 s) and intent TTL (600 s) boundaries."""
FAULTS = ("read_only", "removed", "half_way")


def raise_unexpected(outcome: object) -> None:
    """A domain error is an outcome to check; any other exception is a failure of its own."""
    if isinstance(outcome, BaseException) and not isinstance(outcome, IpamdError):
        raise outcome


def outcome_of(task: asyncio.Future[object]) -> object:
    """A finished task's value or exception."""
    error = task.exception()
    return error if error is not None else task.result()


class EngineMachine(RuleBasedStateMachine):
    """One node: an engine on a real state file (a `FaultyStore`), a fake clock, and the model.

    Every rule runs its engine calls to completion on the machine's own event loop; the loop, the
    engine's store thread and the state directory are closed and removed in `teardown`.
    """

    only_mode: Mode | None = None
    """Every node in this mode instead of the one drawn (`Ipv6EngineMachine`)."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        # Durability across a crash is not what this test checks; a tmpfs keeps fsync cheap.
        shm = Path("/dev/shm")
        self.dir = Path(
            tempfile.mkdtemp(prefix="ipamd-property-", dir=shm if shm.is_dir() else None)
        )
        self.clock = FakeClock()
        self.settings = EngineParams()
        self.node = NodeFixture(self.dir / "state" / STATE_FILE_NAME, self.clock, self.settings)
        self.model = Model(self.settings.cooldown_s, self.settings.intent_ttl_s)
        self.draws = StepDraws()
        self.loop.run_until_complete(self.node.open())

    def teardown(self) -> None:
        try:
            self.loop.run_until_complete(self.node.close())
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
        finally:
            self.loop.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- plumbing --------------------------------------------------------------------------------

    @property
    def engine(self) -> Engine:
        assert self.node.engine is not None
        return self.node.engine

    def now(self) -> float:
        return self.clock.now()

    def run(self, awaitable: Awaitable[object]) -> object:
        """Run one engine call to completion; a domain error is an outcome, anything else a failure."""

        async def outcome() -> object:
            try:
                return await awaitable
            except IpamdError as err:
                return err

        return self.loop.run_until_complete(outcome())

    def do(self, step: Step) -> None:
        now = self.now()
        self.draws.remember(step)
        outcome = self.run(step.call(self.engine))
        event(f"{type(step).__name__} -> {type(outcome).__name__}")
        step.settle(self.model, now, outcome)

    # -- rules -----------------------------------------------------------------------------------

    @initialize(
        mode=st.sampled_from(["ip", "ip", "prefix", "ipv6"]),
        units=st.integers(min_value=1, max_value=6),
        cooldown_s=st.sampled_from([30.0, 30.0, 0.0]),
        prune_batch=st.sampled_from([32, 1]),
        inline_writes=st.booleans(),
    )
    def first_eni(
        self, mode: Mode, units: int, cooldown_s: float, prune_batch: int, inline_writes: bool
    ) -> None:
        """The node's settings (the default cooldown, or none; pruning one expired record per
        change, or the default batch), where a lone change is written (on the loop's thread, or
        always in the store's), then ENI 0 with a few units (in prefix mode, at most its two
        prefixes; in IPv6 mode, at most its two /80s, which are never enumerated)."""
        mode = self.only_mode or mode
        pick = pick_v6_addresses if mode == "ipv6" else None  # the node's family's, chosen once
        self.settings = EngineParams(cooldown_s=cooldown_s, prune_batch=prune_batch, pick=pick)
        self.node.settings = self.settings
        self.node.inline_writes = inline_writes
        self.loop.run_until_complete(self.node.restart())
        self.model = Model(self.settings.cooldown_s, self.settings.intent_ttl_s)
        self.draws = StepDraws(mode)
        self.do(AttachEni(ENI_IDS[0], 0, self.now()))
        self.do(self.draws.first_units(units))

    @rule(data=st.data())
    def add(self, data: st.DataObject) -> None:
        self.do(self.draws.add(data))

    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        self.do(self.draws.delete(data, self.model))

    @rule(data=st.data())
    def duplicate(self, data: st.DataObject) -> None:
        """The same ADD or DEL twice in a row (a runtime retrying)."""
        add = data.draw(st.booleans(), label="add")
        step: Step = self.draws.add(data) if add else self.draws.delete(data, self.model)
        self.do(step)
        self.do(step)

    @rule(seconds=st.sampled_from(CLOCK_STEPS_S))
    def advance_clock(self, seconds: int) -> None:
        self.clock.advance(seconds)

    def deadlines(self) -> dict[str, list[float]]:
        """When the running delete intents and cooldowns end (only kinds with one running)."""
        now, m = self.now(), self.model
        ends = {
            "intent": {t + m.intent_ttl_s for t in m.intents.values()},
            "cooldown": {t + m.cooldown_s for t in m.released_at.values()},
        }
        running = {k: sorted(e for e in v if e + 1 > now) for k, v in ends.items()}
        return {k: v for k, v in running.items() if v}

    @precondition(lambda self: bool(self.deadlines()))
    @rule(data=st.data(), offset_s=st.sampled_from((-1, 0, 1)))
    def advance_to_deadline(self, data: st.DataObject, offset_s: int) -> None:
        """To one second before, exactly at, or one second after an intent or a cooldown ends."""
        deadlines = self.deadlines()
        which = data.draw(st.sampled_from(sorted(deadlines)), label="which")
        deadline = data.draw(st.sampled_from(deadlines[which]), label="deadline")
        if deadline + offset_s > self.now():
            self.clock.advance(deadline + offset_s - self.now())

    @precondition(lambda self: ENI_IDS[1] not in self.model.enis)
    @rule()
    def attach_second_eni(self) -> None:
        self.do(AttachEni(ENI_IDS[1], 1, self.now()))

    @rule(data=st.data())
    def add_units(self, data: st.DataObject) -> None:
        """EC2 lists units on an ENI: new ones become free, lost ones are found again."""
        self.do(self.draws.add_units(data))

    @rule(data=st.data())
    def begin_release(self, data: st.DataObject) -> None:
        """The pool picks units to return: only whole, unowned, not cooling ones are marked."""
        self.do(self.draws.begin_release(data, self.model, self.now()))

    @precondition(lambda self: bool(releasing(self.model)))
    @rule(data=st.data())
    def finish_release(self, data: st.DataObject) -> None:
        self.do(self.draws.finish_release(data, self.model))

    @precondition(lambda self: bool(releasing(self.model)))
    @rule(data=st.data())
    def abort_release(self, data: st.DataObject) -> None:
        self.do(self.draws.abort_release(data, self.model))

    @rule(data=st.data())
    def units_gone(self, data: st.DataObject) -> None:
        """EC2 no longer lists some units: owned ones become lost, never free."""
        self.do(self.draws.units_gone(data, self.model))

    @rule()
    def restart(self) -> None:
        """Close and reopen from disk: the state after equals the state before."""
        before = normalized(self.engine.state.to_image())
        self.loop.run_until_complete(self.node.restart())
        assert normalized(self.engine.state.to_image()) == before

    @rule(kind=st.sampled_from(FAULTS), data=st.data())
    def failed_commit(self, kind: str, data: st.DataObject) -> None:
        """S5/S6/S7: the next commit fails for real. A step that writes raises `StoreWriteFailed`
        and changes nothing; a step that does not write never reaches the fault."""
        if kind == "half_way":
            # The fault breaks off at the second address of an allocation: a two-address ADD.
            step: Step = Add(self.draws.fresh_key(), 2)
        else:
            how = data.draw(st.sampled_from(["add", "del", "inventory"]), label="faulted")
            if how == "add":
                step = self.draws.add(data)
            elif how == "del":
                step = self.draws.delete(data, self.model)
            else:
                step = self.draws.inventory(data, self.model, self.now())
        self.draws.remember(step)
        store = self.node.store
        assert store is not None
        now = self.now()
        writes = step.writes(self.model, now)
        event(f"{kind} fault {'hit' if writes else 'not reached'} by {type(step).__name__}")
        before = normalized(self.engine.state.to_image())
        store.fail_next(kind)
        outcome = self.run(step.call(self.engine))
        if writes:
            assert isinstance(outcome, StoreWriteFailed), f"{step} under {kind}: {outcome!r}"
            assert store.faults == [], "the fault was not consumed by the write"
            assert normalized(self.engine.state.to_image()) == before, (
                "a failed commit changed memory"
            )
            return
        assert store.faults == [kind], f"{step} committed although the model expected no write"
        store.faults.clear()
        step.settle(self.model, now, outcome)

    @rule(data=st.data())
    def concurrent_pair(self, data: st.DataObject) -> None:
        """Two calls in flight at once (S1, S18): the outcome is one of the two serial ones."""
        pair = data.draw(
            st.sampled_from(["add_del", "add_add", "del_del", "new_new"]), label="pair"
        )
        first: Step
        second: Step
        if pair == "new_new":
            first, second = self.draws.add(data), Add(self.draws.fresh_key())
        else:
            add = self.draws.add(data)
            other_form = AllocationKey(
                data.draw(st.sampled_from(NETWORKS), label="network"),
                add.key.container_id,
                IFNAMES[1],
            )
            same = data.draw(st.sampled_from([add.key, other_form]), label="same_container_key")
            first = Del(same) if pair == "del_del" else add
            second = Add(same) if pair == "add_add" else Del(same)
        if data.draw(st.booleans(), label="swap"):
            first, second = second, first
        self.draws.remember(first)
        self.draws.remember(second)

        async def both() -> tuple[object, object]:
            return await asyncio.gather(
                first.call(self.engine), second.call(self.engine), return_exceptions=True
            )

        outcomes = self.loop.run_until_complete(both())
        for outcome in outcomes:
            raise_unexpected(outcome)
        self.settle_serially([(first, outcomes[0]), (second, outcomes[1])])

    @precondition(lambda self: not self.node.inline_writes)  # a held commit must not hold the loop
    @rule(when=st.sampled_from(["before_start", "waiting_for_lock", "commit_in_flight"]))
    def cancelled_add(self, when: str) -> None:
        """S4: the client of an ADD goes away: before the ADD ran, while it waited for the lock
        behind another write, or while its own write was in flight. Held in place by a gate on the
        store's commit, so the interleaving is deterministic. A write in flight cannot be recalled:
        then the ADD happened whole; otherwise nothing happened."""
        step = Add(self.draws.fresh_key())
        blocker = Del(
            self.draws.fresh_key()
        )  # a DEL of an unknown container always writes its intent
        self.draws.remember(step)
        now = self.now()
        if when == "commit_in_flight" and not step.writes(self.model, now):
            when = "before_start"
        event(f"cancelled ADD {when}")
        add_task, blocker_outcome = self.loop.run_until_complete(
            self.cancel_add(step, blocker, when)
        )
        raise_unexpected(blocker_outcome)
        if when == "waiting_for_lock":
            self.draws.remember(blocker)
            blocker.settle(self.model, now, blocker_outcome)
        if not add_task.cancelled():
            raise AssertionError(f"cancelled ADD ({when}) completed: {outcome_of(add_task)!r}")
        record = self.engine.state.allocation(step.key)
        if when == "commit_in_flight":
            assert record is not None, "an ADD whose write was in flight left no allocation"
            step.settle(self.model, now, record)
        else:
            assert record is None, f"an ADD cancelled {when} left {record}"

    async def cancel_add(
        self, step: Add, blocker: Del, when: str
    ) -> tuple[asyncio.Future[object], object]:
        store = self.node.store
        assert store is not None
        gate = threading.Event()
        store.gate = gate
        store.entered.clear()
        held: asyncio.Future[object] | None = None
        try:
            if when == "waiting_for_lock":
                held = asyncio.ensure_future(blocker.call(self.engine))
                await asyncio.to_thread(store.entered.wait, 10)
                store.entered.clear()
            task = asyncio.ensure_future(step.call(self.engine))
            if when == "commit_in_flight":
                await asyncio.to_thread(store.entered.wait, 10)
            elif when == "waiting_for_lock":
                await asyncio.sleep(0)  # the ADD runs up to the lock and waits there
            task.cancel()
            gate.set()
            await asyncio.wait([t for t in (task, held) if t is not None])
        finally:
            gate.set()
            store.gate = None
        return task, None if held is None else outcome_of(held)

    def settle_serially(self, results: list[tuple[Step, object]]) -> None:
        now = self.now()
        failures: list[str] = []
        for order in (results, results[::-1]):
            model = copy.deepcopy(self.model)
            try:
                for step, outcome in order:
                    step.settle(model, now, outcome)
                model.check(self.engine, now)
            except AssertionError as err:
                failures.append(f"{[s for s, _ in order]}: {err}")
                continue
            self.model = model
            names = "+".join(type(step).__name__ for step, _ in results)
            event(f"concurrent {names} {'as started' if order is results else 'reversed'}")
            return
        raise AssertionError(f"not a serial outcome of {results}: {failures}")

    # -- after every step --------------------------------------------------------------------------

    @invariant()
    def invariants_hold(self) -> None:
        now = self.now()
        check_invariants(self.engine, self.node.path, now)
        self.model.check(self.engine, now)


EXAMPLES = int(os.environ.get("IPAMD_HYPOTHESIS_EXAMPLES", "150"))


# About 0.15 s an example, and hypothesis shrinks a failure for up to five minutes: the usual
# timeout would cut the minimal failing sequence off before it is printed.
@pytest.mark.timeout(360 + EXAMPLES)
def test_engine_matches_model_under_random_interleavings() -> None:
    run_state_machine_as_test(
        EngineMachine,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=40,
            deadline=None,
            # One failure, shrunk well, is worth more than several shrunk for minutes each.
            report_multiple_bugs=False,
        ),
    )


class Ipv6EngineMachine(EngineMachine):
    """The same rules on IPv6 nodes only: /128s from /80s that are never enumerated, through ADD,
    DEL, restarts, commit failures, clock steps and inventory changes."""

    only_mode = "ipv6"


@pytest.mark.timeout(360 + EXAMPLES)
def test_ipv6_engine_matches_model_under_random_interleavings_and_restarts() -> None:
    run_state_machine_as_test(
        Ipv6EngineMachine,
        settings=settings(
            max_examples=max(EXAMPLES // 2, 1),
            stateful_step_count=40,
            deadline=None,
            report_multiple_bugs=False,
        ),
    )
