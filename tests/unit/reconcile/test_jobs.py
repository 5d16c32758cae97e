"""The schedule's guard: expected failures are counted and retried, anything else stops the daemon."""

from __future__ import annotations

from cloud.errors import Throttled
from ipamd.errors import StoreWriteFailed
from ipamd.reconcile.jobs import Job, Jobs
from ipamd.runtime.ports import RuntimeUnavailable


async def test_expected_failures_are_counted_and_crashes_are_fatal() -> None:
    jobs = Jobs()
    calls: list[str] = []

    async def flaky() -> None:
        calls.append("flaky")
        if len(calls) == 1:
            raise Throttled("DescribeNetworkInterfaces", "RequestLimitExceeded")
        if len(calls) == 2:
            raise RuntimeUnavailable("socket gone")
        if len(calls) == 3:
            raise StoreWriteFailed("write to ipamd.db failed: database or disk is full")

    async def broken() -> None:
        raise KeyError("a bug")

    job = Job("drift", flaky, 60.0)
    assert not await jobs.run_now(job)
    assert not await jobs.run_now(job)
    assert not await jobs.run_now(job)
    assert await jobs.run_now(job)
    assert jobs.outcomes == {
        ("drift", "Throttled"): 1,
        ("drift", "RuntimeUnavailable"): 1,
        ("drift", "StoreWriteFailed"): 1,
        ("drift", "ok"): 1,
    }
    assert not jobs.failed.is_set()
    assert not await jobs.run_now(Job("gc", broken, 60.0))
    assert jobs.failed.is_set() and isinstance(jobs.fatal, KeyError)


async def test_schedule_starts_and_stops_on_the_running_loop() -> None:
    jobs = Jobs()

    async def nothing() -> None:
        return None

    jobs.add(Job("hint", nothing, 5.0, jitter_s=1.0))
    jobs.start()
    jobs.shutdown()
    assert not jobs.failed.is_set()


async def test_the_schedule_lists_each_job_with_its_last_round() -> None:
    now = [100.0]
    jobs = Jobs(clock=lambda: now[0])

    async def nothing() -> None:
        return None

    async def refused() -> None:
        raise Throttled("DescribeSubnets", "RequestLimitExceeded")

    hint, drift = Job("hint", nothing, 5.0, jitter_s=1.0), Job("drift", refused, 300.0)
    jobs.add(hint)
    jobs.add(drift)
    assert [
        (j.name, j.interval_s, j.jitter_s, j.last_run_at, j.last_outcome) for j in jobs.scheduled()
    ] == [
        ("hint", 5.0, 1.0, None, ""),
        ("drift", 300.0, 0.0, None, ""),
    ]
    await jobs.run_now(hint)
    now[0] = 160.0
    await jobs.run_now(drift)
    assert [(j.name, j.last_run_at, j.last_outcome) for j in jobs.scheduled()] == [
        ("hint", 100.0, "ok"),
        ("drift", 160.0, "Throttled"),
    ]
