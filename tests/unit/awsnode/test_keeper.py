"""ipamd's copy of the checkpoint: an ADD is answered only once the file holds it, a burst costs
few writes, nothing is written before the takeover read the file, and a failing disk delays no pod
for longer than the keeper's wait."""

from __future__ import annotations

import asyncio
from pathlib import Path

from datastore.records import AllocationKey, AllocationRecord
from ipamd.awsnode.checkpoint import CheckpointFile, parse, render
from ipamd.awsnode.keeper import CheckpointedPods, CheckpointKeeper
from ipamd.clock import FakeClock
from ipamd.engine.allocator import EngineParams
from ipamd.engine.engine import Engine
from ipamd.model import PodRef
from tests.support.node import NodeFixture


class Addresses:
    """ADD and DEL on the engine alone (the API's `EngineOnly`)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def add(self, key: AllocationKey, pod: PodRef | None) -> AllocationRecord:
        return await self.engine.assign(key, pod)

    async def release(self, key: AllocationKey) -> tuple[AllocationRecord, ...]:
        return await self.engine.release(key)


class Order:
    """What happened, in order: each write (the keys it held) and each ADD answered."""

    def __init__(self, file: CheckpointFile) -> None:
        self.file = file
        self.events: list[tuple[str, frozenset[AllocationKey]]] = []
        self.writes = 0

    def write(self, data: bytes) -> None:
        self.file.write(data)
        self.writes += 1
        self.events.append(("write", frozenset(e.key for e in parse(data).entries)))

    async def add(self, pods: CheckpointedPods, k: AllocationKey) -> None:
        await pods.add(k, None)
        self.events.append(("answered", frozenset({k})))

    def written_before_answered(self, k: AllocationKey) -> bool:
        for kind, keys in self.events:
            if k in keys:
                return kind == "write"
        return False


def key(cid: str) -> AllocationKey:
    return AllocationKey("aws-cni", cid, "eth0")


async def test_an_add_is_answered_only_once_the_checkpoint_holds_it(tmp_path: Path) -> None:
    node = NodeFixture(tmp_path / "state.db", FakeClock(), EngineParams(cooldown_s=0))
    await node.seed(enis=1, per_eni=8)
    assert node.engine is not None
    file = CheckpointFile(tmp_path / "ipam.json")
    order = Order(file)
    keeper = CheckpointKeeper(node.engine, file, write=order.write)
    pods = CheckpointedPods(Addresses(node.engine), keeper)
    writer = asyncio.create_task(keeper.run())
    try:
        keeper.arm()
        keys = [key(f"c{i}") for i in range(5)]
        await asyncio.gather(*(order.add(pods, k) for k in keys))

        assert all(order.written_before_answered(k) for k in keys), order.events
        raw = file.read()
        assert raw is not None
        assert {e.key for e in parse(raw).entries} == set(keys)
        assert order.writes <= 4, "the burst shares writes"

        await pods.release(key("c2"))
        keeper.write_now()
        raw = file.read()
        assert raw is not None
        assert raw == render(node.engine.state.allocations().values()), "the kept entries agree"
    finally:
        writer.cancel()
        await node.close()


async def test_nothing_is_written_before_arm(tmp_path: Path) -> None:
    node = NodeFixture(tmp_path / "state.db", FakeClock(), EngineParams())
    await node.seed(enis=1, per_eni=4)
    assert node.engine is not None
    file = CheckpointFile(tmp_path / "ipam.json")
    file.write(b"aws-node's")
    keeper = CheckpointKeeper(node.engine, file)
    pods = CheckpointedPods(Addresses(node.engine), keeper)
    writer = asyncio.create_task(keeper.run())
    try:
        await pods.add(key("early"), None)  # not armed: does not wait
        keeper.write_now()
        for _ in range(10):
            await asyncio.sleep(0)
        assert file.read() == b"aws-node's"
    finally:
        writer.cancel()
        await node.close()


async def test_a_failing_disk_delays_no_add_and_is_retried(tmp_path: Path) -> None:
    node = NodeFixture(tmp_path / "state.db", FakeClock(), EngineParams())
    await node.seed(enis=1, per_eni=4)
    assert node.engine is not None
    file = CheckpointFile(tmp_path / "ipam.json")
    failures = {"left": 2}
    written = asyncio.Event()

    def flaky(data: bytes) -> None:
        if failures["left"]:
            failures["left"] -= 1
            raise OSError(28, "No space left on device")
        file.write(data)
        written.set()

    keeper = CheckpointKeeper(node.engine, file, write=flaky, retry_s=0.0)
    pods = CheckpointedPods(Addresses(node.engine), keeper)
    writer = asyncio.create_task(keeper.run())
    try:
        keeper.arm()
        record = await pods.add(key("c1"), None)  # answered although the write failed
        assert record.key == key("c1")
        await written.wait()
        raw = file.read()
        assert raw is not None and [e.key for e in parse(raw).entries] == [key("c1")]
        assert keeper.failures == 2
    finally:
        writer.cancel()
        await node.close()


async def test_a_removal_waits_for_the_next_adds_write(tmp_path: Path) -> None:
    """A DEL costs no write of its own: its removal goes out with the next ADD's (or after
    `defer_s`); a stale entry only makes aws-node hold an address longer."""
    node = NodeFixture(tmp_path / "state.db", FakeClock(), EngineParams(cooldown_s=0))
    await node.seed(enis=1, per_eni=4)
    assert node.engine is not None
    file = CheckpointFile(tmp_path / "ipam.json")
    written: list[bytes] = []

    def record(data: bytes) -> None:
        file.write(data)
        written.append(data)

    keeper = CheckpointKeeper(node.engine, file, write=record, defer_s=3600)
    pods = CheckpointedPods(Addresses(node.engine), keeper)
    writer = asyncio.create_task(keeper.run())
    try:
        keeper.arm()
        await pods.add(key("a"), None)
        before = len(written)
        await pods.release(key("a"))
        for _ in range(50):
            await asyncio.sleep(0)
        assert len(written) == before, "the DEL alone wrote nothing"

        await pods.add(key("b"), None)

        raw = file.read()
        assert raw is not None
        assert [e.key for e in parse(raw).entries] == [key("b")], "the ADD's write took both"
    finally:
        writer.cancel()
        await node.close()
