"""What the pool scenarios share: a pool that keeps no ENI longer than a test needs, readers of what
ipamd and EC2 hold, nodes on a faulty store or behind a fault injector, and pool rounds far enough
apart that no backoff skips one."""

from __future__ import annotations

import ipaddress
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from cloud.embedded.faults import FaultInjector
from cloud.embedded.world import EmbeddedEc2
from datastore.records import AllocationRecord
from ipamd.clock import Clock
from ipamd.config.groups import PoolSettings
from ipamd.engine.allocator import EngineParams
from ipamd.engine.engine import Engine
from ipamd.node.cloud_node import CloudNode, open_cloud_node
from ipamd.sizing.inputs import PoolTargets
from tests.support.ec2_doubles import (
    retrying_on,
)
from tests.support.node import key
from tests.support.stores import FaultyStore

# Every pool in this module keeps its ENIs no longer than the test needs them.
EAGER = PoolTargets(min_eni_lifetime_s=0)
NO_RELEASE_DELAY = {"pool": PoolSettings(release_delay_s=0.0)}
"""What is spare goes at the first round that may free it (IPAMD_RELEASE_DELAY=0): for the
scenarios about how a release goes, not when."""


def releasing(node: CloudNode) -> set[str]:
    return {c for c, u in node.engine.state.units().items() if u.state == "releasing"}


def addresses(cidrs: set[str]) -> set[str]:
    return {str(a) for c in cidrs for a in ipaddress.ip_network(c)}


def handed_out(allocations: list[AllocationRecord]) -> set[str]:
    return {a for alloc in allocations for a in alloc.addresses}


def all_ec2_units(node: CloudNode) -> set[str]:
    return {c for units in node.ec2_units().values() for c in units}


async def fill_then_empty(node: CloudNode, pods: int, tag: str) -> None:
    """Start `pods` pods (growing the pool as needed), then stop them all and let their addresses
    cool down: the pool now holds more than its targets, all of it free."""
    for i in range(pods):
        await node.settle()
        await node.engine.assign(key(f"{tag}-{i}"))
    await node.settle()
    for i in range(pods):
        await node.engine.release(key(f"{tag}-{i}"))
    node.clock.advance(node.engine.settings.cooldown_s + 1)


async def on_faulty_store(node: CloudNode, *, inline_writes: bool = True) -> FaultyStore:
    """The node's parts reopened with the engine on a `FaultyStore`; with `inline_writes=False`
    the engine writes off the loop's thread, so that a commit can be held at the store's gate."""
    await node.engine.close()
    stores: list[FaultyStore] = []

    def opener(path: Path) -> FaultyStore:
        store = FaultyStore.open(path)
        assert isinstance(store, FaultyStore)
        stores.append(store)
        return store

    async def open_engine(path: Path, clock: Clock, settings: EngineParams) -> Engine:
        return await Engine.open(
            path, clock, settings, store_opener=opener, inline_writes=inline_writes
        )

    await node.reopen(open_engine=open_engine)
    return stores[0]


@asynccontextmanager
async def faulty_node(
    embedded: EmbeddedEc2,
    tmp_path: Path,
    instance_type: str,
    targets: PoolTargets,
    faults: FaultInjector,
) -> AsyncIterator[CloudNode]:
    """A node whose EC2 calls go through `faults` (retried without sleeping); its engine closed on
    the way out."""
    async with open_cloud_node(
        embedded,
        tmp_path,
        instance_type,
        targets=targets,
        api_wrapper=retrying_on(faults),
        settings=NO_RELEASE_DELAY,
    ) as node:
        yield node


async def rounds(node: CloudNode, count: int = 5) -> None:
    """Pool ticks far enough apart that no backoff skips one."""
    for _ in range(count):
        node.clock.advance(61)
        await node.pool.run_once()
