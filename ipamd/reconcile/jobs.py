"""The reconcile schedule: the only home of APScheduler.

Each job is a reconciler's `run_once`, run with `max_instances=1` (a slow round is never overlapped
by the next), `coalesce` (missed rounds collapse into one) and jitter (a fleet restarted together does
not sweep EC2 together). A job that fails with an expected error (the cloud or the runtime answering
badly, or the state disk refusing a write: full, read-only) is logged and counted, and runs again
next time; any other exception is a bug: it is recorded in `fatal` and `failed` is set, so the
daemon stops loudly instead of limping on.

Every round is background work: no pod waits on it, so the reconcilers are handed the EC2 adapter's
background view (`cloud.ports.CallPolicy.BACKGROUND`, in `ipamd.node.engine_parts.open_parts`), a
call EC2 throttles is not retried within the round, and the account's tokens go to the pool rounds
pods wait for (docs/architecture.md §5.6).
"""

from __future__ import annotations

import asyncio
import logging
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


class Jobs:
    def __init__(self) -> None:
        self._scheduler = AsyncIOScheduler()
        self.outcomes: Counter[tuple[str, str]] = Counter()
        self.failed = asyncio.Event()
        self.fatal: BaseException | None = None

    def add(self, job: Job) -> None:
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
            self.outcomes[(job.name, type(err).__name__)] += 1
            logger.warning("job.failed job=%s error=%s", job.name, err)
            return False
        except Exception as err:
            self.outcomes[(job.name, "crash")] += 1
            logger.exception("job.crashed job=%s", job.name)
            self.fatal = err
            self.failed.set()
            return False
        self.outcomes[(job.name, "ok")] += 1
        return True

    def start(self) -> None:
        """Start the schedule on the running event loop."""
        self._scheduler.start()

    def shutdown(self) -> None:
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)
