"""Virtual time for the cluster simulator: an asyncio event loop whose clock jumps from one timer to
the next instead of waiting, and executors that never leave the loop's thread.

`VirtualTimeLoop.time()` is a virtual second count starting at 0. Whenever the loop has nothing ready
to run it would block in its selector until the next timer is due; here the selector instead moves
the virtual clock forward by exactly that wait and polls without blocking. Every `asyncio.sleep`,
`asyncio.timeout` and `call_later` therefore runs on virtual time, and an hour of cluster time costs
only the CPU of the work done in it. The price: nothing may wait on another thread, because the loop
would not notice the wait and time would run ahead of it. Hence the two executors:

- `InlineExecutor` runs a submitted call at once, on the loop's thread (the engines' SQLite stores:
  durability is not what the simulator measures, so their commits take no virtual time);
- `LatencyExecutor` (the loop's default executor, which `cloud.ec2.Boto3Ec2` sends its client calls
  to) runs the call at once, so EC2 acts when the request arrives, and hands the answer back after
  the call's latency in virtual seconds.

A loop with nothing ready and no timer left would wait forever: it raises `SimulationStalled`.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar, cast

P = ParamSpec("P")
T = TypeVar("T")

EPOCH_S = 1_700_000_000.0
"""Wall-clock seconds at virtual time 0 (ipamd persists wall-clock times)."""


class SimulationStalled(RuntimeError):
    """Every task waits and no timer is set: nothing could ever happen again."""


class _VirtualSelector(selectors.DefaultSelector):
    def __init__(self, advance: Callable[[float], None]) -> None:
        super().__init__()
        self._advance = advance

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise SimulationStalled("every task waits and no timer is set")
        if timeout > 0:
            self._advance(timeout)
        if len(self.get_map()) <= 1:
            # Only the loop's own wake-up pipe: nothing to poll (no thread answers here, and a
            # call from another thread is queued whether or not the pipe is read).
            return []
        return super().select(0)


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time (module docstring). Not thread-aware: see the executors."""

    def __init__(self) -> None:
        self._virtual_s = 0.0
        super().__init__(_VirtualSelector(self._advance))

    def time(self) -> float:
        return self._virtual_s

    def _advance(self, seconds: float) -> None:
        self._virtual_s += seconds


class VirtualClock:
    """`ipamd.clock.Clock` on a virtual-time loop: wall-clock seconds, `EPOCH_S` at virtual 0."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def now(self) -> float:
        return EPOCH_S + self._loop.time()

    def elapsed_s(self) -> float:
        """Virtual seconds since the simulation began."""
        return self._loop.time()


def _run_into(future: Future[T], fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> None:
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(fn(*args, **kwargs))
    except BaseException as exc:
        future.set_exception(exc)


Outcome = tuple[bool, Any]
"""(True, the call's result) or (False, the exception it raised)."""


def _call(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> Outcome:
    try:
        return True, fn(*args, **kwargs)
    except BaseException as exc:
        return False, exc


def _settle(answer: asyncio.Future[Any], outcome: Outcome) -> None:
    """Hand the outcome to the waiting coroutine, unless it stopped waiting."""
    if answer.cancelled():
        return
    ok, value = outcome
    if ok:
        answer.set_result(value)
    else:
        answer.set_exception(value)


def _as_submitted(answer: asyncio.Future[T]) -> Future[T]:
    """An asyncio future returned from `submit`: `run_in_executor` hands an asyncio future back as
    it is (`asyncio.wrap_future`), so the answer reaches its caller without the two
    `concurrent.futures.Future`s (a lock each), the chaining and the self-pipe write that a
    thread's answer needs. It is settled through `call_soon`, the one loop turn later at which
    `call_soon_threadsafe` would have settled a wrapped future: the order of events is the same."""
    return cast("Future[T]", answer)


class InlineExecutor(ThreadPoolExecutor):
    """Runs each call at once, on the caller's thread; it starts no thread."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not from a coroutine: a plain future, done
            future: Future[T] = Future()
            _run_into(future, fn, *args, **kwargs)
            return future
        answer: asyncio.Future[T] = loop.create_future()
        loop.call_soon(_settle, answer, _call(fn, *args, **kwargs))
        return _as_submitted(answer)


class LatencyExecutor(ThreadPoolExecutor):
    """Runs each call at once on the loop's thread and resolves its future `latency_s()` virtual
    seconds later; `latency_s` is read right after the call, so the call itself may set it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, latency_s: Callable[[], float]) -> None:
        super().__init__(max_workers=1)
        self._loop = loop
        self._latency_s = latency_s

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        answer: asyncio.Future[T] = self._loop.create_future()
        outcome = _call(fn, *args, **kwargs)
        delay_s = self._latency_s()
        if delay_s <= 0:
            self._loop.call_soon(_settle, answer, outcome)
        else:
            self._loop.call_later(delay_s, self._loop.call_soon, _settle, answer, outcome)
        return _as_submitted(answer)
