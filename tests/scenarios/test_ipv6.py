"""IPv6 mode through the paths IPv4 takes: a node on the embedded EC2 (moto with ipamd's extension)
whose pool keeps one /80 on the primary ENI, wired by `open_parts` as the daemon wires it. ADD and DEL
are idempotent, the /80 is reconciled with EC2 by content inside and outside the grace window, and
the engine's invariants (and EC2 = ipamd) hold after each. The leak GC (S11, `test_runtime_gc.py`)
and the rebuild of a state file gone bad (S9, `test_rebuild.py`) run on both families.

What each scenario replays, and which tests prove it: docs/failure-scenarios.md."""

from __future__ import annotations

import ipaddress
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from cloud.embedded.ipv6_rules import eni_ipv6_prefixes
from cloud.embedded.world import EmbeddedEc2
from ipamd.errors import DeleteIntentActive
from ipamd.model import AddressState
from ipamd.node.cloud_node import CloudNode, open_cloud_node
from ipamd.pool.ipv6 import Ipv6Pool
from ipamd.pool.manager import PoolManager
from tests.support.node import key


@pytest.fixture
async def node(embedded: EmbeddedEc2, tmp_path: Path) -> AsyncIterator[CloudNode]:
    async with open_cloud_node(embedded, tmp_path, ipv6=True) as opened:
        yield opened


def _primary(node: CloudNode) -> str:
    return next(e for e, r in node.engine.state.enis().items() if r.is_primary)


def _backend_eni(node: CloudNode, eni_id: str) -> Any:
    return node.world.backend().get_network_interface(eni_id)


def _prefix(node: CloudNode) -> ipaddress.IPv6Network:
    (cidr,) = node.engine.state.units_on(_primary(node))
    return ipaddress.IPv6Network(cidr)


async def test_the_node_holds_one_80_on_its_primary_eni_and_nothing_else(node: CloudNode) -> None:
    prefix = _prefix(node)

    assert prefix.prefixlen == 80
    assert node.ec2_units() == {_primary(node): {str(prefix)}}
    assert (await node.pool.run_once()).is_empty(), "no warm pool to plan"
    assert len(node.world.client().describe_network_interfaces()["NetworkInterfaces"]) == 1
    assert node.engine.settings.max_pods == 110, "EKS's IPv6 max pods on an m5.large"
    node.check()


async def test_add_and_del_are_idempotent_and_a_released_address_cools_down(
    node: CloudNode,
) -> None:
    prefix, engine = _prefix(node), node.engine

    first = await engine.assign(key("pod-a"))
    again = await engine.assign(key("pod-a"))
    other = await engine.assign(key("pod-b"))

    assert again.addresses == first.addresses, "a retried ADD gets the same /128"
    assert ipaddress.IPv6Address(first.addresses[0]) in prefix
    assert other.addresses != first.addresses
    released = await engine.release(key("pod-a"))
    assert [r.addresses for r in released] == [first.addresses]
    assert await engine.release(key("pod-a")) == (), "a repeated DEL releases nothing"
    with pytest.raises(DeleteIntentActive):
        await engine.assign(key("pod-a"))  # the runtime's late ADD of a deleted sandbox
    fresh = await engine.assign(key("pod-c"))
    assert fresh.addresses != first.addresses, "the released address is cooling down"
    assert engine.snapshot().counts[AddressState.COOLING] == 1
    node.check()


async def test_the_80_is_reconciled_by_content_with_the_grace_window(node: CloudNode) -> None:
    """EC2 swaps the /80 behind ipamd's back: one listed, one held, equal counts. Inside the grace
    window nothing moves; outside, the held /80 with a pod on it is lost (its pod's address never
    free), the new one enters free, and the pool does not ask for a third."""
    engine, primary = node.engine, _primary(node)
    old = str(_prefix(node))
    pod = await engine.assign(key("pod"))
    listed = eni_ipv6_prefixes(_backend_eni(node, primary))
    listed.remove(old)
    node.world.client().assign_ipv6_addresses(NetworkInterfaceId=primary, Ipv6PrefixCount=1)
    (new,) = eni_ipv6_prefixes(_backend_eni(node, primary))

    inside = await node.drift.run_once()
    assert inside.lost == [] and inside.added == [new]
    assert engine.state.units()[old].state == "active", "ipamd added it just now: left alone"
    node.clock.advance(node.config.reconcile.grace_s)
    outside = await node.drift.run_once()

    assert outside.lost == [old]
    assert engine.state.owner_of(pod.addresses[0]) == key("pod"), "lost, never free"
    assert engine.snapshot().counts[AddressState.LOST] == 1
    newcomer = await engine.assign(key("pod-2"))
    assert ipaddress.IPv6Address(newcomer.addresses[0]) in ipaddress.IPv6Network(new)
    assert (await node.pool.run_once()).is_empty()
    assert eni_ipv6_prefixes(_backend_eni(node, primary)) == [new], "no third /80 asked for"
    # EC2 gives the old /80 back: the pod's address is assigned again, never free.
    listed.append(old)
    assert (await node.drift.run_once()).found_again == [old]
    assert engine.state.owner_of(pod.addresses[0]) == key("pod")
    node.check()


async def test_the_ipv6_pool_is_its_own_not_an_ipv4_pool_manager(node: CloudNode) -> None:
    """IPv6's pool composes the rounds every pool has and builds none of IPv4's ENI maker, releaser
    or plan: it has no ENI in the making or release in flight, and nothing for the drift's
    listing."""
    pool = node.pool
    assert isinstance(pool, Ipv6Pool) and not isinstance(pool, PoolManager)
    assert not any(hasattr(pool, name) for name in ("_enis", "_releaser", "_stats", "_apply"))
    assert pool.new_enis is None
    assert (pool.pending_enis, pool.unbound_enis, pool.releases_in_flight) == (set(), set(), set())
    assert pool.plan().is_empty() and pool.report().creating_enis is False
    with pytest.raises(TypeError, match="not a PoolManager"):
        node.manager  # noqa: B018 - the property raises


async def test_a_lost_80_is_replaced_by_the_pool_when_ec2_lists_none(node: CloudNode) -> None:
    engine, primary = node.engine, _primary(node)
    old = str(_prefix(node))
    node.clock.advance(node.config.reconcile.grace_s)
    eni_ipv6_prefixes(_backend_eni(node, primary)).clear()

    assert (await node.drift.run_once()).dropped == [old], "free, it just leaves"
    assert isinstance(node.pool, Ipv6Pool) and not node.pool.has_prefix()
    await node.pool.run_once()

    (new,) = engine.state.units_on(primary)
    assert new != old and eni_ipv6_prefixes(_backend_eni(node, primary)) == [new]
    assert ipaddress.IPv6Address((await engine.assign(key("p"))).addresses[0]) in (
        ipaddress.IPv6Network(new)
    )
    node.check()


async def test_a_restart_reads_the_80_and_the_pods_back(node: CloudNode) -> None:
    prefix = str(_prefix(node))
    pods = {name: (await node.engine.assign(key(name))).addresses for name in ("a", "b")}
    await node.engine.close()

    await node.reopen()
    await node.pool.before_ready()

    assert list(node.engine.state.units_on(_primary(node))) == [prefix]
    for name, addresses in pods.items():
        assert (await node.engine.assign(key(name))).addresses == addresses
    assert eni_ipv6_prefixes(_backend_eni(node, _primary(node))) == [prefix]
    node.check()
