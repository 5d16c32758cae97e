"""ipamd's copy of VPC CNI's checkpoint, kept current so that aws-node, started again on this node
(a rollback), restores every running pod and hands out no address a pod holds.

Every commit that adds or removes an allocation asks for a new file; one writer task writes the
state as it is when its turn comes (so a burst of changes costs one write, as the engine's group
commit does), off the event loop, atomically. Each allocation's entry is kept as JSON text from its
commit on, so a write joins strings rather than serializing every pod again. ADD waits for the write
that covers its allocation (`CheckpointedPods`), since aws-node started from a file without a live
pod could hand that pod's address to another; a DEL does not (a stale entry only makes aws-node hold
an address longer, and aws-node drops entries whose veth is gone). A write that fails (a full or
read-only disk) is logged and tried again; an ADD waits for it at most `wait_s`, and not at all
while writes fail, because the state file, not this copy, is what ipamd answers from.

Nothing is written before `arm()`: start-up's takeover reads aws-node's file first, and writing
ipamd's over it sooner would erase what it is about to adopt.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from datastore.records import AllocationKey, AllocationRecord, Mutation
from ipamd.awsnode.checkpoint import CheckpointFile, document, entries_of
from ipamd.engine.engine import Engine
from ipamd.model import PodRef

logger = logging.getLogger(__name__)

WAIT_S = 2.0
RETRY_S = 1.0


class CheckpointKeeper:
    def __init__(
        self,
        engine: Engine,
        file: CheckpointFile,
        *,
        wait_s: float = WAIT_S,
        retry_s: float = RETRY_S,
        write: Callable[[bytes], None] | None = None,
    ) -> None:
        self._engine = engine
        self._file = file
        self._write = write or file.write
        self._wait_s = wait_s
        self._retry_s = retry_s
        self._wanted = 1  # the first write after arm() marks the file as ipamd's
        self._written = 0
        self._armed = False
        self._changed = asyncio.Event()
        self._done = asyncio.Condition()
        self._failing = False
        self._entries: dict[AllocationKey, str] = {}
        self.failures = 0
        engine.listeners.append(self._on_commit)

    @property
    def path(self) -> str:
        return str(self._file.path)

    def arm(self) -> None:
        """From now on the file is ipamd's to write (after start-up's takeover read it)."""
        allocations = self._engine.state.allocations().values()
        ordered = sorted(allocations, key=lambda a: (a.created_at, a.key.container_id))
        self._entries = {a.key: entries_of(a) for a in ordered}
        self._armed = True
        self._changed.set()

    def _on_commit(self, m: Mutation, _removed: tuple[AllocationRecord, ...]) -> None:
        if not (m.put_allocations or m.delete_allocations):
            return
        self._wanted += 1
        if not self._armed:
            return  # arm() reads every allocation afresh
        for key in m.delete_allocations:
            self._entries.pop(key, None)
        for alloc in m.put_allocations:
            self._entries[alloc.key] = entries_of(alloc)
        self._changed.set()

    async def run(self) -> None:
        """The writer: one write at a time, each of the state as it is then."""
        while True:
            await self._changed.wait()
            self._changed.clear()
            target = self._wanted
            data = document(self._entries.values())
            try:
                await asyncio.to_thread(self._write, data)
            except OSError as err:
                self.failures += 1
                self._failing = True
                logger.warning("checkpoint.write_failed path=%s error=%s", self.path, err)
                await asyncio.sleep(self._retry_s)
                self._changed.set()
                continue
            self._failing = False
            async with self._done:
                self._written = max(self._written, target)
                self._done.notify_all()

    async def covering(self) -> None:
        """Wait until the file holds every allocation committed so far (at most `wait_s`; not at
        all while writes fail, which the writer logs)."""
        if not self._armed or self._failing:
            return
        target = self._wanted
        try:
            async with asyncio.timeout(self._wait_s), self._done:
                await self._done.wait_for(lambda: self._written >= target)
        except TimeoutError:
            logger.warning("checkpoint.behind path=%s waited_s=%.1f", self.path, self._wait_s)

    def write_now(self) -> None:
        """The last write, on a clean stop (the loop is winding down: written inline)."""
        if not self._armed:
            return
        try:
            self._write(document(self._entries.values()))
        except OSError as err:
            logger.warning("checkpoint.write_failed path=%s error=%s", self.path, err)


class PodAddressesLike(Protocol):
    """What `CheckpointedPods` wraps: the API's `PodAddresses` (a layer above this one)."""

    async def add(self, key: AllocationKey, pod: PodRef | None) -> AllocationRecord: ...

    async def release(self, key: AllocationKey) -> tuple[AllocationRecord, ...]: ...


class CheckpointedPods:
    """ADD and DEL as the API serves them (`ipamd.api.app.PodAddresses`), an ADD answered only once
    the checkpoint holds it."""

    def __init__(self, inner: PodAddressesLike, keeper: CheckpointKeeper) -> None:
        self._inner = inner
        self._keeper = keeper

    async def add(self, key: AllocationKey, pod: PodRef | None) -> AllocationRecord:
        record = await self._inner.add(key, pod)
        await self._keeper.covering()
        return record

    async def release(self, key: AllocationKey) -> tuple[AllocationRecord, ...]:
        return await self._inner.release(key)
