"""The pods of one simulated node that wait for an address, and when each retries its ADD.

A waiting pod retries every `retry_s` from its first ADD, as kubelet retries a sandbox that failed to
start. A retry whose answer could not differ from the node's last refusal (`node.Refusal`) is
refused without the engine, so it changes nothing but the clock; in a ramp at the account's limit
thousands of pods wait at once, and one timer per pod and retry was most of a large run. So the node
wakes a waiting pod only at the first of its own retry instants at which the answer may differ:
once the last refusal is `retry_s` old or an address leaves its cooldown (both known in advance),
after a commit or a change of the ENIs held back (`changed`: the node's commit listener and
`WatchedEngine` call it), at the pod's deadline, and when the node goes. It wakes the earliest such
pod alone: what that pod's ADD does (a new refusal, a commit) decides when the next one wakes. One
timer per node, and the pods' instants are those they would retry at.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ipamd.clock import Clock
from ipamd.engine.engine import Engine

EPS_S = 1e-6
"""Instants this close are one: the node's clock reads the loop's time plus an epoch, and the sum
is not exact."""


def instant_at_or_after(anchor: float, retry_s: float, t: float) -> float:
    """The first of `anchor + k * retry_s` (k = 0, 1, ...) that is not before `t`."""
    if t == math.inf:
        return t
    k = max(0, math.ceil((t - anchor) / retry_s - EPS_S))
    return anchor + k * retry_s


@dataclass(eq=False, slots=True)
class _Waiter:
    anchor: float
    """Its instants are this plus whole retries: when its last ADD was refused."""
    earliest: float
    """Its next instant is not before this (the one after the instant it was refused at)."""
    deadline: float
    """Its first instant past the deadline: it is woken there to fail."""
    woken: asyncio.Future[None] = field(repr=False)
    key: tuple[float, int] = (0.0, 0)
    """Its place among the node's waiters: its instants' phase within `retry_s`, then its turn."""


class Waiting:
    """A node's waiting pods; `stands_until` says until when the node's last refusal stands if
    nothing changes (-inf: it does not stand now).

    Every pod retries every `retry_s`, so whose instant comes first after a time is a matter of
    phase: the waiters are kept in phase order, and the next one found by bisection (a heap holds
    their deadlines), so a node with hundreds of pods waiting plans its next wake as cheaply as one
    with a single pod."""

    def __init__(
        self,
        clock: Clock,
        retry_s: float,
        deadline_s: float,
        stands_until: Callable[[], float],
    ) -> None:
        self._clock = clock
        self._retry_s = retry_s
        self._deadline_s = deadline_s
        self._stands_until = stands_until
        self._keys: list[tuple[float, int]] = []
        """The waiters' keys, in order."""
        self._waiters: dict[tuple[float, int], _Waiter] = {}
        self._deadlines: list[tuple[float, tuple[float, int]]] = []
        """(deadline, key) of every waiter, a heap; entries of waiters gone are dropped lazily."""
        self._serial = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._loop: asyncio.AbstractEventLoop | None = None
        self._epoch_s = 0.0
        """The node's clock less the loop's time: the waiters' instants are the loop's own times,
        as a pod's sleep would have made them (the node's clock, an epoch added, rounds them)."""

    def __len__(self) -> int:
        return len(self._waiters)

    async def turn(self, started: float) -> None:
        """Until the next retry instant, at which its ADD may be answered differently, of a pod
        whose first ADD was at `started` and whose last was refused now: its instants are whole
        retries from now, as kubelet retries a sandbox `retry_s` after it last failed (an ADD the
        node refused without the engine took no time, so the instants stay those of its last ADD
        the engine refused)."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._epoch_s = self._clock.now() - self._loop.time()
        now, r = self._loop.time(), self._retry_s
        deadline = instant_at_or_after(now, r, started - self._epoch_s + self._deadline_s)
        self._serial += 1
        waiter = _Waiter(
            now,
            now + r - EPS_S,
            deadline,
            self._loop.create_future(),
            (math.fmod(now, r), self._serial),
        )
        bisect.insort(self._keys, waiter.key)
        self._waiters[waiter.key] = waiter
        heapq.heappush(self._deadlines, (deadline, waiter.key))
        try:
            self._plan()
            await waiter.woken
        finally:
            if waiter.key in self._waiters:  # cancelled while it waited
                self._remove(waiter)
                self._plan()

    def changed(self) -> None:
        """Something an ADD's answer depends on changed (or the node went): plan the next wake."""
        if self._waiters:
            self._plan()

    def _remove(self, waiter: _Waiter) -> None:
        del self._waiters[waiter.key]
        del self._keys[bisect.bisect_left(self._keys, waiter.key)]

    def _due(self, waiter: _Waiter, not_before: float) -> float:
        return instant_at_or_after(waiter.anchor, self._retry_s, max(waiter.earliest, not_before))

    def _next(self) -> tuple[float, _Waiter | None]:
        """The first wake: its time and the waiter it is for (by its instants, or its deadline)."""
        first, chosen = math.inf, None
        assert self._loop is not None, "a waiter came first"
        now = self._loop.time() - EPS_S  # an instant gone by is gone
        deadlines = self._deadlines
        while deadlines and deadlines[0][1] not in self._waiters:
            heapq.heappop(deadlines)
        if deadlines:
            chosen = self._waiters[deadlines[0][1]]
            first = max(deadlines[0][0], self._due(chosen, now))
        standing = max(self._stands_until() - self._epoch_s, now)
        if standing == math.inf or not self._keys:
            return first, chosen
        # The phases from `standing`'s on, then round again: the first waiter whose instant there
        # is not before its own earliest has the first instant; one passed over (refused at this
        # very instant) is due a whole retry later, after every phase in between.
        keys, n = self._keys, len(self._keys)
        start = bisect.bisect_left(keys, (math.fmod(standing, self._retry_s) - 2 * EPS_S, 0))
        for i in range(n):
            waiter = self._waiters[keys[(start + i) % n]]
            due = self._due(waiter, standing)
            if due < first:
                first, chosen = due, waiter
            if waiter.earliest <= instant_at_or_after(waiter.anchor, self._retry_s, standing):
                break
        return first, chosen

    def _plan(self) -> None:
        first, _ = self._next()
        if first == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = first
        if first < math.inf:
            assert self._loop is not None
            self._timer = self._loop.call_at(first, self._wake)

    def _wake(self) -> None:
        self._timer, self._timer_at = None, math.inf
        assert self._loop is not None
        now = self._loop.time()
        while self._waiters:
            due, waiter = self._next()
            if waiter is None or due > now + EPS_S:
                break
            self._remove(waiter)
            if not waiter.woken.done():
                waiter.woken.set_result(None)
        self._plan()


class WatchedEngine(Engine):
    """The engine, telling `on_held_change` whenever the ENIs it holds back (`Engine.held_back`) may
    have changed: an ENI blocked or unblocked, or other subnets closed."""

    on_held_change: Callable[[], None] = staticmethod(lambda: None)

    def watch(self, on_held_change: Callable[[], None]) -> None:
        """From now on tell `on_held_change` (set once the node that listens exists)."""
        self.on_held_change = on_held_change

    def block_eni(self, eni_id: str, reason: str) -> None:
        super().block_eni(eni_id, reason)
        self._held_changed()

    def unblock_eni(self, eni_id: str) -> bool:
        unblocked = super().unblock_eni(eni_id)
        if unblocked:
            self._held_changed()
        return unblocked

    def close_subnets(self, subnets: Iterable[str]) -> None:
        before = self.closed_subnets
        super().close_subnets(subnets)
        if self.closed_subnets != before:
            self._held_changed()

    def _held_changed(self) -> None:
        self.on_held_change()  # looked up each time: `watch` comes after the engine is made
