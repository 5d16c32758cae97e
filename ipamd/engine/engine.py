"""The allocation engine: the one owner of the node's address state.

Every change follows one path (`_mutate`): under a single asyncio lock, decide from memory, commit the
resulting mutation to SQLite in the store's own thread, then apply the same mutation to memory. There
is no `await` between the checks and the commit that lets another change in, memory never runs ahead
of disk, and a failed commit changes nothing. The cloud is never awaited here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from datastore.errors import CommitError, OwnershipConflict, StateFileError
from datastore.records import (
    AllocationKey,
    AllocationRecord,
    EniRecord,
    Mutation,
    StateImage,
    UnitKind,
)
from datastore.store import Store
from ipamd.clock import Clock
from ipamd.engine import inventory
from ipamd.engine.allocator import (
    EngineSettings,
    plan_assign,
    plan_pruning,
    plan_release,
    plan_retract,
)
from ipamd.engine.restore import plan_claim_instance, plan_quarantine
from ipamd.engine.snapshot import take_snapshot
from ipamd.engine.state import NodeState
from ipamd.errors import NoAddressAvailable, StateUnavailable, StoreWriteFailed
from ipamd.model import PodRef, PoolSnapshot

logger = logging.getLogger(__name__)

T = TypeVar("T")

CommitListener = Callable[[Mutation, tuple[AllocationRecord, ...]], None]


class Engine:
    """Use `await Engine.open(...)`; close with `await engine.close()`."""

    def __init__(
        self,
        store: Store | None,
        state: NodeState,
        clock: Clock,
        settings: EngineSettings,
        executor: ThreadPoolExecutor,
        unavailable: StateUnavailable | None = None,
    ) -> None:
        self._store = store
        self.state = state
        self._clock = clock
        self.settings = settings
        self._executor = executor
        self._lock = asyncio.Lock()
        self.unavailable = unavailable
        """Set when the state file could not be trusted: every change is refused with this error."""
        self.pool_wanted = asyncio.Event()
        """Set when an ADD found no free address: the pool manager grows at once, not on its tick."""
        self.blocked_enis: dict[str, str] = {}
        """ENI ID → why none of its addresses may be handed out yet (its link is not set up on the
        host). Owned by the host-network owner, which fills it from a commit listener, so an ENI
        is blocked from the very commit that brings it in."""
        self.listeners: list[CommitListener] = []
        """Called after each commit has been applied to memory, with the mutation and the
        allocations it removed (read before they left memory). Synchronous and non-raising."""

    @classmethod
    async def open(
        cls,
        path: Path,
        clock: Clock,
        settings: EngineSettings | None = None,
        live_containers: frozenset[str] | None = None,
        store_opener: Callable[[Path], Store] = Store.open,
    ) -> Engine:
        """Open the state file and restore from it. An unusable file yields an engine that refuses
        every change with a message naming the file and the repair command (fail closed)."""
        settings = settings or EngineSettings()
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ipamd-store")
        loop = asyncio.get_running_loop()
        try:
            store = await loop.run_in_executor(executor, store_opener, path)
            image = await loop.run_in_executor(executor, store.load)
        except StateFileError as err:
            logger.error("store.unusable path=%s reason=%s", err.path, err.reason)
            refusal = StateUnavailable(str(err))
            return cls(None, NodeState(), clock, settings, executor, refusal)
        state = await cls._restore(store, image, clock.now(), live_containers, executor)
        return cls(store, state, clock, settings, executor)

    @staticmethod
    async def _restore(
        store: Store,
        image: StateImage,
        now: float,
        live_containers: frozenset[str] | None,
        executor: ThreadPoolExecutor,
    ) -> NodeState:
        loop = asyncio.get_running_loop()
        mutation, trusted = plan_quarantine(image, now, live_containers)
        if not mutation.is_empty():
            for q in mutation.put_quarantine:
                logger.warning(
                    "restore.quarantine container_id=%s reason=%r",
                    q.key.container_id,
                    q.reason,
                )
            await loop.run_in_executor(executor, store.commit, mutation)
        if store.missing_indexes:
            await loop.run_in_executor(executor, store.restore_indexes)
        state = NodeState.from_image(trusted)
        logger.info(
            "restore.done path=%s allocations=%d intents=%d units=%d quarantined=%d",
            store.path,
            len(state.allocations),
            len(state.intents),
            len(state.units),
            len(mutation.put_quarantine),
        )
        return state

    async def close(self) -> None:
        async with self._lock:
            if self._store is not None:
                await asyncio.get_running_loop().run_in_executor(self._executor, self._store.close)
                self._store = None
        self._executor.shutdown(wait=True)

    # -- ADD and DEL -------------------------------------------------------------------------------

    async def assign(
        self, key: AllocationKey, pod: PodRef | None = None, count: int = 1
    ) -> AllocationRecord:
        """ADD: the allocation for `key`, existing or new. Raises `DeleteIntentActive`,
        `NoAddressAvailable`, `StoreWriteFailed` or `StateUnavailable`."""
        try:
            return await self._mutate(
                lambda now: plan_assign(
                    self.state, key, pod or PodRef(), count, now, self.settings, self.blocked_enis
                )
            )
        except NoAddressAvailable:
            self.pool_wanted.set()
            raise

    async def retract(self, record: AllocationRecord) -> bool:
        """Undo an ADD that was never acknowledged (its pod's datapath could not be made): the
        allocation goes, with no delete intent (the runtime may retry the same ADD) and no
        cooldown (no pod ever used the address). Only while the allocation is still `record`."""
        return await self._mutate(lambda now: plan_retract(self.state, record))

    async def release(self, key: AllocationKey) -> tuple[AllocationRecord, ...]:
        """DEL: release every allocation of `key.container_id` and record its delete intent.
        Succeeds for an unknown container. Returns what was released."""
        return await self._mutate(
            lambda now: plan_release(self.state, key.container_id, now, self.settings)
        )

    # -- inventory (on evidence from EC2) ------------------------------------------------------

    async def add_eni(self, eni: EniRecord) -> None:
        await self._mutate(lambda now: (inventory.plan_add_eni(self.state, eni), None))

    async def add_units(self, eni_id: str, cidrs: Iterable[str], kind: UnitKind) -> None:
        cidrs = tuple(cidrs)
        await self._mutate(
            lambda now: (inventory.plan_add_units(self.state, eni_id, cidrs, kind, now), None)
        )

    async def begin_release(self, cidrs: Iterable[str]) -> tuple[str, ...]:
        """Mark whole free units `releasing`; returns those marked. Call EC2 only after this."""
        cidrs = tuple(cidrs)
        return await self._mutate(
            lambda now: inventory.plan_begin_release(
                self.state, cidrs, now, self.settings.cooldown_s
            )
        )

    async def finish_release(self, cidrs: Iterable[str]) -> None:
        cidrs = tuple(cidrs)
        await self._mutate(
            lambda now: (inventory.plan_finish_release(self.state, cidrs, now), None)
        )

    async def abort_release(self, cidrs: Iterable[str]) -> None:
        cidrs = tuple(cidrs)
        await self._mutate(lambda now: (inventory.plan_abort_release(self.state, cidrs, now), None))

    async def claim_instance(self, instance_id: str) -> bool:
        """Bind the state to this instance; returns True if a foreign state was set aside."""
        return await self._mutate(
            lambda now: (
                m := plan_claim_instance(self.state, instance_id, now),
                bool(m.put_quarantine or m.delete_enis),
            )
        )

    async def commit_repair(self, mutation: Mutation) -> None:
        """Repair's changes to quarantine, decided from EC2's and the runtime's evidence; refused if
        an address it restores was taken meanwhile (the UNIQUE index is the last word)."""
        await self._mutate(lambda now: (mutation, None))

    async def eni_gone(self, eni_id: str) -> None:
        """EC2 no longer lists the ENI as attached here."""
        await self._mutate(lambda now: (inventory.plan_eni_gone(self.state, eni_id, now), None))

    async def remove_eni(self, eni_id: str) -> None:
        await self._mutate(lambda now: (inventory.plan_remove_eni(self.state, eni_id, now), None))

    async def units_gone(self, cidrs: Iterable[str]) -> None:
        cidrs = tuple(cidrs)
        await self._mutate(lambda now: (inventory.plan_units_gone(self.state, cidrs, now), None))

    # -- reading -----------------------------------------------------------------------------------

    def snapshot(self) -> PoolSnapshot:
        """One consistent view: built synchronously, so no change can interleave."""
        return take_snapshot(
            self.state, self._clock.now(), self.settings.cooldown_s, self.blocked_enis
        )

    # -- the one path every change takes -----------------------------------------------------

    async def _mutate(self, decide: Callable[[float], tuple[Mutation, T]]) -> T:
        async with self._lock:
            if self.unavailable is not None or self._store is None:
                raise self.unavailable or StateUnavailable("the engine is closed")
            now = self._clock.now()
            mutation, answer = decide(now)
            if mutation.is_empty():
                return answer
            await self._commit(plan_pruning(self.state, mutation, now, self.settings))
            return answer

    def _apply(self, mutation: Mutation) -> None:
        """Memory follows the committed mutation; then the listeners hear of it."""
        removed = tuple(
            alloc
            for k in mutation.delete_allocations
            if (alloc := self.state.allocations.get(k)) is not None
        )
        self.state.apply(mutation)
        for listener in self.listeners:
            listener(mutation, removed)

    async def _commit(self, mutation: Mutation) -> None:
        """Commit in the store's thread, then apply to memory. A cancellation that arrives while the
        write is in flight waits for it: the write cannot be recalled, and memory must follow disk."""
        assert self._store is not None
        future = asyncio.get_running_loop().run_in_executor(
            self._executor, self._store.commit, mutation
        )
        cancelled = False
        while not future.done():
            try:
                await asyncio.shield(future)
            except asyncio.CancelledError:
                if future.done():
                    break
                cancelled = True
            except CommitError:
                break
        error = future.exception()
        if error is None:
            self._apply(mutation)
        if cancelled:
            raise asyncio.CancelledError
        if isinstance(error, OwnershipConflict):
            logger.error("store.conflict error=%s", error)
        if isinstance(error, CommitError):
            logger.warning("store.commit_failed error=%s", error)
            raise StoreWriteFailed(str(error)) from error
        if error is not None:
            raise error
