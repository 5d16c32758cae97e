"""A simulated node's waiting pods (`bench.cluster.waiting`): each wakes at its own retry instants,
and only at those at which its ADD may be answered differently from the node's last refusal."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import TypeVar

from bench.cluster.vtime import VirtualClock, VirtualTimeLoop
from bench.cluster.waiting import Waiting, WatchedEngine, instant_at_or_after
from tests.support.node import NodeFixture

T = TypeVar("T")
RETRY_S = 1.0
DEADLINE_S = 30.0


def run(body: Callable[[VirtualClock], Awaitable[T]]) -> T:
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(body(VirtualClock(loop)))
    finally:
        loop.close()


def test_instants_are_the_pods_own() -> None:
    assert instant_at_or_after(10.0, 1.0, 10.0) == 10.0
    assert instant_at_or_after(10.0, 1.0, 12.2) == 13.0
    assert instant_at_or_after(10.0, 1.0, 12.0 + 1e-9) == 12.0, "one instant, read with an epoch"
    assert instant_at_or_after(10.0, 1.0, 3.0) == 10.0


class Node:
    """What `Waiting` asks of a node: until when its last refusal stands (-inf: it does not). Each
    woken pod's ADD is refused anew, as a real one would be while the pool stays empty, unless the
    test says otherwise."""

    def __init__(self, clock: VirtualClock, standing: float = -math.inf) -> None:
        self.clock = clock
        self.standing = standing
        self.refuses = True
        self.waiting = Waiting(clock, RETRY_S, DEADLINE_S, lambda: self.standing)
        self.woken: list[tuple[int, float]] = []

    def start(self, starts: list[float], turns: int) -> list[asyncio.Task[None]]:
        base = self.clock.now()

        async def pod(n: int, started: float) -> None:
            await asyncio.sleep(started - self.clock.now())
            for _ in range(turns):
                await self.waiting.turn(started)
                self.woken.append((n, round(self.clock.now() - base, 6)))
                if self.refuses:
                    self.standing = self.clock.now() + RETRY_S
                    self.waiting.changed()

        return [asyncio.create_task(pod(n, base + s)) for n, s in enumerate(starts)]


async def _end(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def test_while_the_refusal_stands_no_pod_wakes_and_then_one_a_retry_interval() -> None:
    async def body(clock: VirtualClock) -> list[tuple[int, float]]:
        node = Node(clock, standing=clock.now() + 5.2)  # e.g. an address leaves its cooldown then
        tasks = node.start([0.0, 0.25, 0.5], turns=5)
        await asyncio.sleep(8.0)
        assert len(node.waiting) == 3
        await _end(tasks)
        assert len(node.waiting) == 0, "a pod that stops waiting leaves"
        return node.woken

    assert run(body) == [(1, 5.25), (1, 6.25), (1, 7.25)], (
        "the first instant at or after 5.2 s is pod 1's; its refusals cover the others' instants"
    )


def test_a_change_wakes_the_pods_at_their_next_instants_one_by_one() -> None:
    async def body(clock: VirtualClock) -> list[tuple[int, float]]:
        node = Node(clock, standing=math.inf)
        node.refuses = False  # each gets an address (a commit, so the next one tries too)
        tasks = node.start([0.0, 0.25, 0.5], turns=1)
        await asyncio.sleep(3.1)
        assert node.woken == []
        node.standing = -math.inf  # a commit: the refusal no longer stands
        node.waiting.changed()
        await asyncio.gather(*tasks)
        return node.woken

    assert run(body) == [(1, 3.25), (2, 3.5), (0, 4.0)], "each at its first instant after 3.1 s"


def test_a_pod_wakes_at_its_deadline_though_the_refusal_stands() -> None:
    async def body(clock: VirtualClock) -> list[tuple[int, float]]:
        node = Node(clock, standing=math.inf)
        node.waiting = Waiting(clock, 0.75, 2.0, lambda: node.standing)
        await asyncio.gather(*node.start([0.0], turns=1))
        return node.woken

    assert run(body) == [(0, 2.25)], "its first instant at or past the deadline"


async def test_the_watched_engine_tells_of_every_change_of_the_enis_held_back(
    node: NodeFixture,
) -> None:
    engine = await node.open()
    watched = WatchedEngine(
        engine._store, engine.state, node.clock, engine.settings, engine._executor
    )
    told: list[set[str]] = []
    watched.watch(lambda: told.append(set(watched.held_back())))
    watched.block_eni("eni-1", "no link yet")
    assert watched.unblock_eni("eni-1")
    watched.close_subnets({"subnet-1"})
    watched.close_subnets({"subnet-1"})  # the same: nothing to tell
    assert told == [{"eni-1"}, set(), set()]
    assert not watched.unblock_eni("eni-1"), "not blocked: nothing to tell"
    assert len(told) == 3
