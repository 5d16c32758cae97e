"""With custom networking (`EngineParams.pods_on_primary=False`) no pod gets an address of the
primary ENI, even when it holds free ones and every other ENI is full."""

from __future__ import annotations

import pytest

from ipamd.engine.allocator import EngineParams
from ipamd.errors import NoAddressAvailable
from tests.support.node import NodeFixture, key


@pytest.fixture
def custom(node: NodeFixture) -> NodeFixture:
    node.settings = EngineParams(pods_on_primary=False)
    return node


async def test_pods_get_secondary_eni_addresses_only(custom: NodeFixture) -> None:
    engine = await custom.open()
    layout = await custom.seed(enis=3, per_eni=3)

    allocs = [await engine.assign(key(f"c{i}")) for i in range(6)]

    assert {a.eni_id for a in allocs} == {"eni-0001", "eni-0002"}
    assert not {c for a in allocs for c in a.unit_cidrs} & set(layout[0])
    with pytest.raises(NoAddressAvailable):
        await engine.assign(key("one-more"))
    custom.check()


async def test_a_multi_address_allocation_never_lands_on_the_primary(custom: NodeFixture) -> None:
    engine = await custom.open()
    await custom.seed(enis=2, per_eni=3)

    alloc = await engine.assign(key("a"), count=3)

    assert alloc.eni_id == "eni-0001"
    with pytest.raises(NoAddressAvailable):
        await engine.assign(key("b"), count=2)


async def test_without_custom_networking_the_primary_carries_pods(node: NodeFixture) -> None:
    engine = await node.open()
    await node.seed(enis=2, per_eni=3)

    assert (await engine.assign(key("a"))).eni_id == "eni-0000"
