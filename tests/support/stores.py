"""Stores with real faults, for tests: SQLite's own errors (read-only, a transaction aborted
half-way), a removed file, and a commit that waits at a gate so a test can hold a write mid-flight
(the engine must then write off the loop's thread: `Engine.open(..., inline_writes=False)`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Sequence

from datastore.records import Mutation
from datastore.store import Store


class FaultyStore(Store):
    """A real store that can be told to fail its next commits the way a sick disk does."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.faults: list[str] = []
        self.gate: threading.Event | None = None
        self.entered = threading.Event()
        self.commits = 0
        self.last_mutation: Mutation | None = None

    def fail_next(self, *kinds: str) -> None:
        """Queue faults for the next commits: `read_only` (SQLite refuses writes), `removed` (the
        file was moved away) or `half_way` (the transaction breaks off after some statements)."""
        self.faults.extend(kinds)

    def commit_all(self, mutations: Sequence[Mutation]) -> None:
        """One transaction (one `commits` tick) for the batch, held at the gate, faulted on demand."""
        self.entered.set()
        if self.gate is not None:
            if _on_a_loop():
                raise AssertionError(
                    "a commit held at a gate would hold the event loop: open the engine with "
                    "inline_writes=False"
                )
            self.gate.wait(timeout=30)
        fault = self.faults.pop(0) if self.faults else None
        if fault is None:
            super().commit_all(mutations)
            self.last_mutation = mutations[-1]
            self.commits += 1
            return
        with self._fault(fault):
            super().commit_all(mutations)

    @contextlib.contextmanager
    def _fault(self, kind: str):  # type: ignore[no-untyped-def]
        conn = self._conn
        if kind == "half_way":
            # Fails the transaction after its first statements ran: at the second address an
            # allocation writes (a write that breaks off half-way must leave nothing behind).
            conn.execute(
                "CREATE TEMP TRIGGER half_way BEFORE INSERT ON allocation_addresses"
                " WHEN NEW.position = 1 BEGIN SELECT RAISE(ABORT, 'injected failure'); END"
            )
            try:
                yield
            finally:
                conn.execute("DROP TRIGGER half_way")
        elif kind == "read_only":
            conn.execute("PRAGMA query_only = ON")
            try:
                yield
            finally:
                conn.execute("PRAGMA query_only = OFF")
        elif kind == "removed":
            moved = self.path.with_name(self.path.name + ".moved")
            os.rename(self.path, moved)
            try:
                yield
            finally:
                os.rename(moved, self.path)
        else:
            raise ValueError(kind)


def _on_a_loop() -> bool:
    """Whether this thread runs an event loop (a commit here would block it)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
