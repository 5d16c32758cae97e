"""A test node: an engine on a real state file, reopened at will, with inventory seeded the way EC2's
evidence would add it."""

from __future__ import annotations

from pathlib import Path

from datastore.records import AllocationKey, EniRecord, UnitKind
from ipamd.clock import FakeClock
from ipamd.engine.allocator import EngineParams
from ipamd.engine.engine import Engine
from ipamd.engine.invariants import check_invariants
from tests.support.stores import FaultyStore


def key(container_id: str, ifname: str = "eth0", network: str = "k8s-pod-network") -> AllocationKey:
    return AllocationKey(network, container_id, ifname)


def secondary_ips(eni_index: int, count: int, first: int = 10) -> list[str]:
    return [f"10.0.{eni_index}.{first + i}/32" for i in range(count)]


def prefixes(eni_index: int, count: int) -> list[str]:
    return [f"10.1.{eni_index}.{16 * i}/28" for i in range(count)]


class NodeFixture:
    def __init__(self, path: Path, clock: FakeClock, settings: EngineParams) -> None:
        self.path = path
        self.clock = clock
        self.settings = settings
        self.engine: Engine | None = None
        self.store: FaultyStore | None = None
        self.inline_writes = True
        """Whether the engine may write a lone change on the loop's thread; False for a test that
        holds commits at the store's gate."""

    async def open(self, live_containers: frozenset[str] | None = None) -> Engine:
        await self.close()
        stores: list[FaultyStore] = []

        def opener(path: Path) -> FaultyStore:
            store = FaultyStore.open(path)
            assert isinstance(store, FaultyStore)
            stores.append(store)
            return store

        self.engine = await Engine.open(
            self.path,
            self.clock,
            self.settings,
            live_containers,
            store_opener=opener,
            inline_writes=self.inline_writes,
        )
        self.store = stores[0] if stores else None
        return self.engine

    async def restart(self, live_containers: frozenset[str] | None = None) -> Engine:
        """Close and reopen from disk, as after a clean restart."""
        return await self.open(live_containers)

    async def open_damaged(self) -> Engine:
        """Reopen on a state file that cannot be trusted (not SQLite at all, as after damage to the
        disk): the engine refuses every change, as ipamd does after such a start."""
        await self.close()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_bytes(b"not a state file")
        engine = await self.open()
        assert engine.unavailable is not None
        return engine

    async def close(self) -> None:
        if self.engine is not None:
            await self.engine.close()
            self.engine = None

    async def seed(self, enis: int = 1, per_eni: int = 4, kind: UnitKind = "ip") -> list[list[str]]:
        """Attach `enis` ENIs with `per_eni` units each; returns the unit CIDRs per ENI."""
        engine = self.engine or await self.open()
        layout = []
        for index in range(enis):
            eni_id = f"eni-{index:04d}"
            await engine.add_eni(EniRecord(eni_id, index, "subnet-1", index == 0, self.clock.now()))
            cidrs = secondary_ips(index, per_eni) if kind == "ip" else prefixes(index, per_eni)
            await engine.add_units(eni_id, cidrs, kind)
            layout.append(cidrs)
        return layout

    def check(self) -> None:
        assert self.engine is not None
        check_invariants(self.engine, self.path, self.clock.now())
