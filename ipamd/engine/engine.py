"""The allocation engine: the one owner of the node's address state.

Every change follows one path (`_mutate`): decide from memory, commit the resulting mutation to SQLite
in the store's own thread, then apply the same mutation to memory. Memory never runs ahead of disk
(`state`, which every reader sees, holds only what committed), and a failed commit changes nothing.
The cloud is never awaited here.

Group commit. Changes are queued, and one at a time a leader (the first caller whose change is still
queued when the previous write finished) seals the queue: it decides each queued change in order
against `_decided` — the committed state plus the changes decided before it in the batch — and
writes the whole batch in one transaction, so N concurrent ADDs cost one fsync, not N. Only then is
the batch applied to `state` and each caller answered. No decision ever meets another's half: there
is no `await` between deciding a batch and sealing it, and a single batch is in flight at a time. A
change cancelled while still queued is withdrawn and does nothing; once sealed, it is written (the
write cannot be recalled). A failed write fails its whole batch and `_decided` is rebuilt from `state`.
A lone change (still alone after a couple of loop turns) is written on the loop's own thread (less
than the two thread hand-offs it would cost); a batch goes to the store's thread.

Other parts reach the engine through its channels, each a method or a read-only view, so that no
other part writes on the engine's attributes and every change of what it does comes through a call
that can be found:

- Commit listeners (`subscribe`): told of each commit once it is applied (the host-network owner,
  the aws-node checkpoint keeper, metrics).
- ENIs held back from new pods: blocked by the host-network owner until their link is set up
  (`block_eni`, `unblock_eni`, read as `blocked_enis`), and those in subnets the pool manager's
  subnet catalogue closes (`close_subnets`, read as `closed_subnets`, `closed_enis`).
- ADDs' demand (`starved_at`, `pool_wanted`): an ADD that finds no free address wakes the pool
  manager at once, which waits for it with `wait_for_demand` and takes it with `take_demand`.
- Why the pool cannot grow (`explain_starvation`): the pool manager names a final failure, and an
  ADD that finds no free address says it rather than "try again".
What they read (`blocked_enis`, `closed_subnets`, `starved_at`, `unavailable`) is read-only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import MappingProxyType
from typing import Protocol, TypeVar

from datastore.errors import StateFileError
from datastore.records import (
    AllocationKey,
    AllocationRecord,
    EniRecord,
    Mutation,
    UnitKind,
)
from datastore.store import Store
from ipamd.clock import Clock
from ipamd.engine import inventory
from ipamd.engine.allocator import (
    OTHER_REFUSALS,
    EngineParams,
    plan_assign,
    plan_pruning,
    plan_release,
    plan_retract,
)
from ipamd.engine.commits import Batch, Change, as_write_failure, retrieve
from ipamd.engine.restore import plan_claim_instance, restore
from ipamd.engine.snapshot import take_snapshot
from ipamd.engine.state import NodeState
from ipamd.errors import NoAddressAvailable, StateUnavailable
from ipamd.model import PodRef, PoolSnapshot

logger = logging.getLogger(__name__)

T = TypeVar("T")

INLINE_YIELDS = 2
"""Loop turns a lone change waits for company before it is written on the loop's own thread."""

Decide = Callable[[NodeState, float], tuple[Mutation, T]]

CommitListener = Callable[[Mutation, tuple[AllocationRecord, ...]], None]


class PodAddresses(Protocol):
    """ADD and DEL as the API serves them: the engine's (`ipamd.api.app.EngineOnly`), the host's
    datapath's when it is on (`ipamd.hostnet.datapath.Datapath`), and the wrappers that follow each
    with a write of their own (the aws-node checkpoint, the pod's annotation). Declared here, below
    every layer that serves or wraps it."""

    async def add(self, key: AllocationKey, pod: PodRef | None) -> AllocationRecord: ...

    async def release(self, key: AllocationKey) -> tuple[AllocationRecord, ...]: ...


class Engine:
    """Use `await Engine.open(...)`; close with `await engine.close()`."""

    def __init__(
        self,
        store: Store | None,
        state: NodeState,
        clock: Clock,
        settings: EngineParams,
        executor: ThreadPoolExecutor,
        unavailable: StateUnavailable | None = None,
        decided: NodeState | None = None,
        *,
        inline_writes: bool = True,
    ) -> None:
        """`inline_writes`: whether a lone change may be written on the loop's own thread; only a
        store whose commit waits on nothing but the disk allows it."""
        self._store = store
        self.state = state
        """What committed: every reader's view."""
        self._decided = decided if decided is not None else NodeState.from_image(state.to_image())
        """`state` plus the changes of the batch being decided or written; only deciding reads it."""
        self._queue: list[Change] = []
        self._turn = asyncio.Lock()
        self._clock = clock
        self._settings = settings
        self._executor = executor
        self._inline_writes = inline_writes
        self._unavailable = unavailable
        self._refusing = False  # the last ADD found no address, and nothing has committed since
        # The channels with the rest of the daemon (the module's docstring), each read or changed
        # through a method below.
        self._listeners: list[CommitListener] = []
        self._blocked: dict[str, str] = {}
        self._blocked_view = MappingProxyType(self._blocked)
        self._closed_subnets: frozenset[str] = frozenset()
        self._demand = asyncio.Event()
        self._starved_at = float("-inf")
        self._starvation_cause: Callable[[], str] = str

    @property
    def settings(self) -> EngineParams:
        """Given when the engine is opened, and final: nothing changes them afterwards."""
        return self._settings

    @property
    def unavailable(self) -> StateUnavailable | None:
        """Set when the state file could not be trusted: every change is refused with this error."""
        return self._unavailable

    @classmethod
    async def open(
        cls,
        path: Path,
        clock: Clock,
        settings: EngineParams | None = None,
        live_containers: frozenset[str] | None = None,
        store_opener: Callable[[Path], Store] = Store.open,
        *,
        inline_writes: bool = True,
    ) -> Engine:
        """Open the state file and restore from it. An unusable file yields an engine that refuses
        every change with a message naming the file and the repair command (fail closed).
        `inline_writes=False` for a store whose commit may wait on something besides the disk."""
        settings = settings or EngineParams()
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ipamd-store")
        loop = asyncio.get_running_loop()
        try:
            store = await loop.run_in_executor(executor, store_opener, path)
            image = await loop.run_in_executor(executor, store.load)
        except StateFileError as err:
            logger.error("store.unusable path=%s reason=%s", err.path, err.reason)
            refusal = StateUnavailable(str(err))
            return cls(None, NodeState(), clock, settings, executor, refusal)
        state, decided = await restore(store, image, clock.now(), live_containers, executor)
        return cls(
            store, state, clock, settings, executor, decided=decided, inline_writes=inline_writes
        )

    async def close(self) -> None:
        async with self._turn:
            if self._store is not None:
                await asyncio.get_running_loop().run_in_executor(self._executor, self._store.close)
                self._store = None
        self._executor.shutdown(wait=True)

    # -- ADD and DEL -------------------------------------------------------------------------------

    async def assign(
        self, key: AllocationKey, pod: PodRef | None = None, count: int = 1
    ) -> AllocationRecord:
        """ADD: the allocation for `key`, existing or new. Raises `DeleteIntentActive`,
        `NoAddressAvailable`, `StoreWriteFailed` or `StateUnavailable`. While ADDs are refused, one
        with nothing queued or being written is decided at once, and refused without a write."""

        def decide(state: NodeState, now: float) -> tuple[Mutation, AllocationRecord]:
            held = self.held_back(state)
            return plan_assign(state, key, pod or PodRef(), count, now, self.settings, held)

        try:
            if self._refusing and not (self._queue or self._turn.locked() or self._store is None):
                with contextlib.suppress(*OTHER_REFUSALS):
                    decide(self._decided, self._clock.now())  # raises NoAddressAvailable
            return await self._mutate(decide)
        except NoAddressAvailable as err:
            self._refusing = True
            self._starved_at = self._clock.now()
            self._demand.set()
            cause = self._starvation_cause()
            if cause:
                raise NoAddressAvailable(f"{err}; {cause}") from None
            raise

    async def retract(self, record: AllocationRecord) -> bool:
        """Undo an ADD never acknowledged (its pod's datapath could not be made): no delete intent
        (the runtime may retry it), no cooldown (no pod used the address). Only if still `record`."""
        return await self._mutate(lambda state, now: plan_retract(state, record))

    async def release(self, key: AllocationKey) -> tuple[AllocationRecord, ...]:
        """DEL: release `key.container_id`'s allocations (if any: returned) and record its intent."""
        return await self._mutate(
            lambda state, now: plan_release(state, key.container_id, now, self.settings)
        )

    # -- inventory (on evidence from EC2) ------------------------------------------------------

    async def add_eni(self, eni: EniRecord) -> None:
        await self._mutate(lambda state, now: (inventory.plan_add_eni(state, eni), None))

    async def add_units(self, eni_id: str, cidrs: Iterable[str], kind: UnitKind) -> None:
        cidrs = tuple(cidrs)
        await self._mutate(
            lambda state, now: (inventory.plan_add_units(state, eni_id, cidrs, kind, now), None)
        )

    async def begin_release(self, cidrs: Iterable[str]) -> tuple[str, ...]:
        """Mark whole free units `releasing`; returns those marked. Call EC2 only after this."""
        cidrs = tuple(cidrs)
        return await self._mutate(
            lambda state, now: inventory.plan_begin_release(
                state, cidrs, now, self.settings.cooldown_s
            )
        )

    async def finish_release(self, cidrs: Iterable[str]) -> None:
        cidrs = tuple(cidrs)
        await self._mutate(
            lambda state, now: (inventory.plan_finish_release(state, cidrs, now), None)
        )

    async def abort_release(self, cidrs: Iterable[str]) -> None:
        cidrs = tuple(cidrs)
        await self._mutate(
            lambda state, now: (inventory.plan_abort_release(state, cidrs, now), None)
        )

    async def claim_instance(self, instance_id: str) -> bool:
        """Bind the state to this instance; returns True if a foreign state was set aside."""
        return await self._mutate(
            lambda state, now: (
                m := plan_claim_instance(state, instance_id, now),
                bool(m.put_quarantine or m.delete_enis),
            )
        )

    async def commit_planned(self, decide: Decide[T]) -> T:
        """A change planned outside the engine (repair, rebuild, a takeover from aws-node), decided
        when its turn comes; refused if an address it gives out was taken meanwhile."""
        return await self._mutate(decide)

    async def eni_gone(self, eni_id: str) -> None:
        """EC2 no longer lists the ENI as attached here."""
        await self._mutate(lambda state, now: (inventory.plan_eni_gone(state, eni_id, now), None))

    async def remove_eni(self, eni_id: str) -> None:
        await self._mutate(lambda state, now: (inventory.plan_remove_eni(state, eni_id, now), None))

    async def units_gone(self, cidrs: Iterable[str]) -> None:
        cidrs = tuple(cidrs)
        await self._mutate(lambda state, now: (inventory.plan_units_gone(state, cidrs, now), None))

    # -- reading -----------------------------------------------------------------------------------

    def snapshot(self) -> PoolSnapshot:
        """One consistent view: built synchronously, so no change can interleave."""
        return take_snapshot(
            self.state,
            self._clock.now(),
            self.settings.cooldown_s,
            self._blocked,
            self.settings.max_pods,
        )

    # -- the one path every change takes -----------------------------------------------------

    async def _mutate(self, decide: Decide[T], *, prune: bool = True) -> T:
        self._check_serving()
        change = Change(decide, asyncio.get_running_loop().create_future(), prune)
        self._queue.append(change)
        try:
            async with self._turn:
                if not change.future.done():
                    await self._lead()
        except asyncio.CancelledError:
            if not change.sealed:
                self._queue.remove(change)  # still queued: withdrawn, it does nothing
            else:
                change.future.add_done_callback(retrieve)
            raise
        result: T = change.future.result()
        return result

    def _check_serving(self) -> None:
        if self._unavailable is not None or self._store is None:
            raise self._unavailable or StateUnavailable("the engine is closed")

    async def _lead(self) -> None:
        """Seal the queue, decide its changes in order, write them in one transaction, then apply
        them to `state` and answer each caller."""
        if len(self._queue) == 1 and self._store is not None and self._inline_writes:
            # Alone so far: let requests that have already arrived reach the queue first (a few
            # loop turns), so that under load they share this write instead of each writing alone.
            for _ in range(INLINE_YIELDS):
                await asyncio.sleep(0)
        batch = self._seal()
        if not batch.mutations:
            return
        error, cancelled = await self._write(batch.mutations)
        if error is None:
            for mutation in batch.mutations:
                self._apply(mutation)
            for change, answer in zip(batch.changes, batch.answers, strict=True):
                change.future.set_result(answer)
        else:
            self._decided = NodeState.from_image(self.state.to_image())
            failure = as_write_failure(error)
            for change in batch.changes:
                change.future.set_exception(failure)
        if cancelled:
            raise asyncio.CancelledError

    def _seal(self) -> Batch:
        queued, self._queue = self._queue, []
        batch = Batch()
        for change in queued:
            change.sealed = True
            try:
                self._check_serving()
                now = self._clock.now()
                mutation, answer = change.decide(self._decided, now)
                if not mutation.is_empty() and change.prune:
                    mutation = plan_pruning(self._decided, mutation, now, self.settings)
            except Exception as err:  # the caller's own refusal (or bug): only that change fails
                change.future.set_exception(err)
                continue
            if mutation.is_empty():
                change.future.set_result(answer)
                continue
            self._decided.apply(mutation)
            batch.changes.append(change)
            batch.mutations.append(mutation)
            batch.answers.append(answer)
        return batch

    async def _write(self, mutations: Sequence[Mutation]) -> tuple[BaseException | None, bool]:
        """Commit in the store's thread. A cancellation that arrives while the write is in flight
        waits for it: the write cannot be recalled, and memory must follow disk. Returns the error
        (None when durable) and whether the caller was cancelled meanwhile."""
        assert self._store is not None
        if len(mutations) == 1 and self._inline_writes:
            # One change and nobody waiting: written on the loop's thread, which a single commit
            # holds for a fraction of a millisecond, instead of two thread hand-offs that cost more.
            try:
                self._store.commit_all(mutations)
            except Exception as err:
                return err, False
            return None, False
        future = asyncio.get_running_loop().run_in_executor(
            self._executor, self._store.commit_all, mutations
        )
        cancelled = False
        while not future.done():
            try:
                await asyncio.wait((future,))  # never raises the write's error, never cancels it
            except asyncio.CancelledError:
                cancelled = cancelled or not future.done()  # the caller's: wait on for the write
        return future.exception(), cancelled

    def _apply(self, mutation: Mutation) -> None:
        """Memory follows the committed mutation; then the listeners hear of it."""
        removed = tuple(
            alloc
            for k in mutation.delete_allocations
            if (alloc := self.state.allocation(k)) is not None
        )
        self.state.apply(mutation)
        self._refusing = False
        for listener in self._listeners:
            listener(mutation, removed)

    # -- the channels with the rest of the daemon ---------------------------------------------

    def subscribe(self, listener: CommitListener) -> Callable[[], None]:
        """Call `listener` after each commit is applied (the mutation, the allocations it removed),
        in the order subscribed; it must not raise. Returns what unsubscribes it."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def want_pool(self) -> None:
        """Wake the pool manager as an ADD that found no address would: pods are on their way
        (the pods the scheduler bound to this node, `ipamd.kube.pods`)."""
        self._demand.set()

    def explain_starvation(self, cause: Callable[[], str]) -> None:
        """`cause()` says why the pool cannot grow now ("" when it can); an ADD that finds no
        free address adds it to its error (the pool manager's, set once)."""
        self._starvation_cause = cause

    # -- what ADDs may not take, and what they lack ---------------------------------------------

    @property
    def blocked_enis(self) -> Mapping[str, str]:
        """ENI ID → why none of its addresses may be handed out yet (its link is not set up on the
        host): the host-network owner's, from the ENI's first commit on (read-only)."""
        return self._blocked_view

    def block_eni(self, eni_id: str, reason: str) -> None:
        """Hand out none of `eni_id`'s addresses until `unblock_eni`; `reason` says why."""
        self._blocked[eni_id] = reason

    def unblock_eni(self, eni_id: str) -> bool:
        """Its addresses may go to pods again; True if it was blocked."""
        return self._blocked.pop(eni_id, None) is not None

    @property
    def closed_subnets(self) -> frozenset[str]:
        """Subnets whose ENIs take no new pods (the pool manager's subnet catalogue says which)."""
        return self._closed_subnets

    def close_subnets(self, subnets: Iterable[str]) -> None:
        """From now on exactly `subnets` are closed to new pods; any other subnet is open again."""
        self._closed_subnets = frozenset(subnets)

    def closed_enis(self, state: NodeState | None = None) -> set[str]:
        """The ENIs (of `state`, default the committed one) in a closed subnet."""
        if not self._closed_subnets:
            return set()
        enis = (state or self.state).enis()
        return {e for e, r in enis.items() if r.subnet_id in self._closed_subnets}

    def held_back(self, state: NodeState | None = None) -> Collection[str]:
        """ENIs none of whose addresses may go to a new pod: blocked ones, and closed ones."""
        if not self._closed_subnets:
            return self._blocked
        return self.closed_enis(state) | self._blocked.keys()

    @property
    def starved_at(self) -> float:
        """When an ADD last found no free address (the pool manager's demand, `ipamd.pool.pace`)."""
        return self._starved_at

    @property
    def pool_wanted(self) -> bool:
        """Whether the pool manager is wanted now: an ADD found no free address (or its tick came,
        `wait_for_demand`) since it last took the demand (`take_demand`)."""
        return self._demand.is_set()

    def take_demand(self) -> bool:
        """The pool manager takes the demand as it starts a round; returns `pool_wanted` as it was."""
        wanted = self._demand.is_set()
        self._demand.clear()
        return wanted

    async def wait_for_demand(self, timeout_s: float) -> None:
        """Until an ADD finds no free address, or `timeout_s` passes (the pool manager's tick), or at
        once if one did since `take_demand`. The tick is a timer that sets the demand, not a timeout:
        no task is cancelled to end each wait."""
        tick = asyncio.get_running_loop().call_later(timeout_s, self._demand.set)
        try:
            await self._demand.wait()
        finally:
            tick.cancel()
