"""ipamd's copy of VPC CNI's checkpoint, kept current so that aws-node, started again on this node
(a rollback), restores every running pod and hands out no address a pod holds.

An ADD is answered only once the file holds its allocation (`CheckpointedPods`): aws-node started
from a file without a live pod could hand that pod's address to another. The ADD writes the file
itself, on the event loop, unless an earlier ADD's write already covered it, so a burst of ADDs that
one commit answered shares one write. Each allocation's entry is kept as JSON text from its commit
on, so a write joins strings rather than serializing every pod again. A DEL does not wait (a stale
entry only makes aws-node hold an address longer, and aws-node drops entries whose veth is gone):
its removal goes out with the next ADD's write, or from the writer task after `defer_s`. A write
that fails (a full or read-only disk) is logged and retried by the writer task, and ADDs do not
wait for it meanwhile: the state file, not this copy, is what ipamd answers from.

Nothing is written before `arm()`: start-up's takeover reads aws-node's file first, and writing
ipamd's over it sooner would erase what it is about to adopt.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from datastore.records import AllocationKey, AllocationRecord, Mutation
from ipamd.awsnode.checkpoint import CheckpointFile, document, entries_of
from ipamd.engine.engine import Engine, PodAddresses
from ipamd.model import PodRef

logger = logging.getLogger(__name__)

RETRY_S = 1.0
DEFER_S = 1.0
"""How long a change that only removes allocations may wait for company before it is written."""


class CheckpointKeeper:
    def __init__(
        self,
        engine: Engine,
        file: CheckpointFile,
        *,
        retry_s: float = RETRY_S,
        defer_s: float = DEFER_S,
        write: Callable[[bytes], None] | None = None,
    ) -> None:
        self._engine = engine
        self._file = file
        self._write = write or file.write
        self._retry_s = retry_s
        self._defer_s = defer_s
        self._wanted = 1  # the first write after arm() marks the file as ipamd's
        self._written = 0
        self._armed = False
        self._behind = asyncio.Event()
        """Something is not written yet (removals, or a write that failed)."""
        self._failing = False
        self._entries: dict[AllocationKey, str] = {}
        self.failures = 0
        engine.subscribe(self._on_commit)

    @property
    def path(self) -> str:
        return str(self._file.path)

    def arm(self) -> None:
        """From now on the file is ipamd's to write (after start-up's takeover read it)."""
        allocations = self._engine.state.allocations().values()
        ordered = sorted(allocations, key=lambda a: (a.created_at, a.key.container_id))
        self._entries = {a.key: entries_of(a) for a in ordered}
        self._armed = True
        self.write_now()

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
        self._behind.set()

    async def run(self) -> None:
        """What no ADD writes: removals (after `defer_s`, unless an ADD's write took them first,
        so that a DEL costs no write of its own on a node that churns) and failed writes (after
        `retry_s`)."""
        while True:
            await self._behind.wait()
            await asyncio.sleep(self._retry_s if self._failing else self._defer_s)
            self._behind.clear()
            if self._written < self._wanted:
                self.write_now()

    async def covering(self) -> None:
        """Return once the file holds every allocation committed so far: written here and now,
        on the loop, unless an earlier caller's write already covered it (a burst of ADDs
        answered by one commit shares one write). Not while writes fail (the writer logs and
        retries): the state file, not this copy, is what ipamd answers from."""
        if self._armed and not self._failing and self._written < self._wanted:
            self.write_now()

    def write_now(self) -> None:
        """Write the file as the state is now (also the last write, on a clean stop).

        On the loop, not in a thread: a few syscalls on a tmpfs, where a thread would wait for
        the GIL at each of them while the loop serves a burst of ADDs (5 ms a switch: tens of ms a
        write, measured as the API's tail under 32 clients)."""
        if not self._armed:
            return
        target = self._wanted
        try:
            self._write(document(self._entries.values()))
        except OSError as err:
            self.failures += 1
            self._failing = True
            self._behind.set()
            logger.warning("checkpoint.write_failed path=%s error=%s", self.path, err)
            return
        self._failing = False
        self._written = max(self._written, target)


class CheckpointedPods:
    """ADD and DEL as the API serves them (`ipamd.engine.engine.PodAddresses`), an ADD answered only once
    the checkpoint holds it."""

    def __init__(self, inner: PodAddresses, keeper: CheckpointKeeper) -> None:
        self._inner = inner
        self._keeper = keeper

    async def add(self, key: AllocationKey, pod: PodRef | None) -> AllocationRecord:
        record = await self._inner.add(key, pod)
        await self._keeper.covering()
        return record

    async def release(self, key: AllocationKey) -> tuple[AllocationRecord, ...]:
        return await self._inner.release(key)
