"""The reconcile schedule: the only home of APScheduler.

Each job is a reconciler's `run_once`, run with `max_instances=1` (a slow round is never overlapped
by the next), `coalesce` (missed rounds collapse into one) and jitter (a fleet restarted together does
not sweep EC2 together). A job that fails with an expected error (the cloud or the runtime answering
badly, or the state disk refusing a write: full, read-only) is logged and counted, and runs again
next time; any other exception is a bug: it is recorded in `fatal` and `failed` is set, so the
daemon stops loudly instead of limping on.

Every round is background work: no pod waits on it, so the reconcilers are handed the EC2 adapter's
background view (`cloud.ports.CallUrgency.BACKGROUND`, in `ipamd.node.engine_parts.open_parts`), a
call EC2 throttles is not retried within the round, and the account's tokens go to the pool rounds
pods wait for (docs/architecture.md §5.6).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from cloud.errors import CloudError
from ipamd.errors import StoreWriteFailed
from ipamd.hostnet.ports import HostNetError
from ipamd.runtime.ports import RuntimeUnavailable

logger = logging.getLogger(__name__)

EXPECTED = (CloudError, RuntimeUnavailable, StoreWriteFailed, HostNetError)
"""A failed write changed nothing (ipamd's memory follows the state file), so the round is simply
tried again; the API answers ADD with a retryable error meanwhile."""


@dataclass(frozen=True, slots=True)
class Job:
    name: str
    run: Callable[[], Awaitable[object]]
    interval_s: float
    jitter_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Scheduled:
    """One job of the schedule, as `Jobs.scheduled` lists it."""

    name: str
    interval_s: float
    jitter_s: float
    last_run_at: float | None
    """When its last round ended (the clock's seconds; None: it has not run)."""
    last_outcome: str
    """`ok`, the expected error's class, `crash`, or "" before its first round."""


class Jobs:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._scheduler = AsyncIOScheduler()
        self._clock = clock
        self._jobs: dict[str, Job] = {}
        self._last: dict[str, tuple[float, str]] = {}
        self.outcomes: Counter[tuple[str, str]] = Counter()
        self.failed = asyncio.Event()
        self.fatal: BaseException | None = None

    def scheduled(self) -> tuple[Scheduled, ...]:
        """Every job added, in the order added, with when it last ran and how that went."""
        return tuple(
            Scheduled(job.name, job.interval_s, job.jitter_s, *self._last.get(job.name, (None, "")))
            for job in self._jobs.values()
        )

    def add(self, job: Job) -> None:
        self._jobs[job.name] = job
        self._scheduler.add_job(
            self._guarded(job),
            "interval",
            seconds=job.interval_s,
            jitter=job.jitter_s or None,
            id=job.name,
            name=job.name,
            max_instances=1,
            coalesce=True,
        )

    def _guarded(self, job: Job) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            await self.run_now(job)

        return run

    async def run_now(self, job: Job) -> bool:
        """Run one round of `job` as the schedule would; True if it succeeded."""
        try:
            await job.run()
        except EXPECTED as err:
            self._count(job, type(err).__name__)
            logger.warning("job.failed job=%s error=%s", job.name, err)
            return False
        except Exception as err:
            self._count(job, "crash")
            logger.exception("job.crashed job=%s", job.name)
            self.fatal = err
            self.failed.set()
            return False
        self._count(job, "ok")
        return True

    def _count(self, job: Job, outcome: str) -> None:
        self.outcomes[(job.name, outcome)] += 1
        self._last[job.name] = (self._clock(), outcome)

    def start(self) -> None:
        """Start the schedule on the running event loop."""
        self._scheduler.start()

    def shutdown(self) -> None:
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)
