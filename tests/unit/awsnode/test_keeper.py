"""ipamd's copy of the checkpoint: an ADD is answered only once the file holds it, a burst costs
few writes, nothing is written before the takeover read the file, and a failing disk delays no pod
for longer than the keeper's wait."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from datastore.records import AllocationKey, AllocationRecord
from ipamd.awsnode.checkpoint import CheckpointFile, parse, render
from ipamd.awsnode.keeper import CheckpointedPods, CheckpointKeeper
from ipamd.clock import FakeClock
from ipamd.engine.allocator import EngineSettings
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


class GatedWrites:
    """A disk whose writes wait for the test's word (in the writer's thread)."""

    def __init__(self, file: CheckpointFile) -> None:
        self.file = file
        self.gate = threading.Event()
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.gate.wait(timeout=10)
        self.file.write(data)
        self.writes.append(data)


def key(cid: str) -> AllocationKey:
    return AllocationKey("aws-cni", cid, "eth0")


async def test_an_add_is_answered_only_once_the_checkpoint_holds_it(tmp_path: Path) -> None:
    node = NodeFixture(tmp_path / "state.db", FakeClock(), EngineSettings(cooldown_s=0))
    await node.seed(enis=1, per_eni=8)
    assert node.engine is not None
    file = CheckpointFile(tmp_path / "ipam.json")
    disk = GatedWrites(file)
    keeper = CheckpointKeeper(node.engine, file, write=disk.write, wait_s=30)
    pods = CheckpointedPods(Addresses(node.engine), keeper)
    writer = asyncio.create_task(keeper.run())
    try:
        keeper.arm()
        committed = asyncio.Event()
        engine = node.engine
        engine.listeners.append(
            lambda _m, _r: committed.set() if len(engine.state.allocations()) == 5 else None
        )
        adds = [asyncio.create_task(pods.add(key(f"c{i}"), None)) for i in range(5)]
        await committed.wait()  # in the store's thread, so not within a few loop turns
        for _ in range(20):
            await asyncio.sleep(0)
        assert not any(a.done() for a in adds), "no ADD answered before its write"

        disk.gate.set()
        await asyncio.gather(*adds)

        raw = file.read()
        assert raw is not None
        assert {e.key for e in parse(raw).entries} == {key(f"c{i}") for i in range(5)}
        assert len(disk.writes) <= 3, "the burst shares writes"

        await pods.release(key("c2"))
        keeper.write_now()
        raw = file.read()
        assert raw is not None
        assert raw == render(node.engine.state.allocations().values()), "the kept entries agree"
    finally:
        disk.gate.set()
        writer.cancel()
        await node.close()


async def test_nothing_is_written_before_arm(tmp_path: Path) -> None:
    node = NodeFixture(tmp_path / "state.db", FakeClock(), EngineSettings())
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


async def test_a_failing_disk_delays_an_add_by_the_wait_only_and_is_retried(tmp_path: Path) -> None:
    node = NodeFixture(tmp_path / "state.db", FakeClock(), EngineSettings())
    await node.seed(enis=1, per_eni=4)
    assert node.engine is not None
    file = CheckpointFile(tmp_path / "ipam.json")
    failures = {"left": 2}
    written = asyncio.Event()
    loop = asyncio.get_running_loop()

    def flaky(data: bytes) -> None:
        if failures["left"]:
            failures["left"] -= 1
            raise OSError(28, "No space left on device")
        file.write(data)
        loop.call_soon_threadsafe(written.set)

    keeper = CheckpointKeeper(node.engine, file, write=flaky, wait_s=0.0, retry_s=0.0)
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
