"""The node's subnet runs dry under its primary ENI: with subnet discovery and a tagged subnet that
has room, new ENIs there take over at once (one failed assign, no exhaustion cooldown), the full
subnet's ENIs are not asked again until a view shows it with room, and then they grow again.
Without anywhere else to go, exhaustion pauses growth as before (docs/architecture.md §5.6 and
docs/architecture.md §5.8). Each runs the daemon's own wiring (`ipamd.node.engine_parts`) on the in-memory EC2
and ends with the shared invariant check."""

from __future__ import annotations

import ipaddress
import random
from pathlib import Path
from typing import Any

import pytest

from cloud.fakes import FakeEc2, FakeImds
from datastore.store import STATE_FILE_NAME
from ipamd.clock import FakeClock
from ipamd.config.groups import ReconcileSettings, SubnetSettings
from ipamd.engine.invariants import check_invariants
from ipamd.errors import NoAddressAvailable
from ipamd.node.cloud_node import node_config
from ipamd.node.engine_parts import Parts, describe_node, open_parts
from ipamd.pool.manager import PoolManager
from ipamd.runtime.fake import FakeRuntime
from ipamd.sizing.inputs import PoolTargets
from ipamd.sizing.subnets import ROLE_TAG
from tests.support.node import key

TARGETS = PoolTargets(warm_eni_target=1, min_eni_lifetime_s=0)
"""VPC CNI's default: an ENI's worth (9 on this instance) of free addresses."""
HALF_HOUR_S = 1800.0
EXHAUSTED = "InsufficientFreeAddresses"


def _dry_node_subnet(clock: FakeClock, free: int) -> tuple[FakeEc2, str]:
    """An m5.large-like instance (3 ENIs of 10 addresses) whose /27 keeps `free` addresses (the
    others taken by other instances), and a tagged /16 in its zone; the tagged subnet's ID."""
    ec2 = FakeEc2(clock, subnet_cidr="10.0.0.0/27", max_enis=3, ipv4_per_eni=10)
    node = ec2.subnets[ec2.subnet_id]
    while node.available > free:
        node.draw("ip")
    return ec2, ec2.add_subnet("100.64.0.0/16", {ROLE_TAG: "1"})


def _others_leave(ec2: FakeEc2) -> None:
    """The other instances of the node's subnet are gone: only the node's addresses stay."""
    node = ec2.subnets[ec2.subnet_id]
    mine = [e for e in ec2.enis.values() if e.subnet_id == ec2.subnet_id and not e.deleted]
    held = {f"{e.primary_ip}/32" for e in mine} | {c for e in mine for c in e.units}
    for value in sorted(node.used):
        cidr = f"{ipaddress.IPv4Address(value)}/32"
        if cidr not in held:
            node.free(cidr)


async def _open(tmp_path: Path, ec2: FakeEc2, clock: FakeClock, **values: Any) -> Parts:
    config = node_config(tmp_path, TARGETS, reconcile=ReconcileSettings(grace_s=0.0), **values)
    parts = await open_parts(
        config,
        await describe_node(ec2, ec2.instance_id),
        ec2=ec2,
        imds=FakeImds(ec2),
        runtime=FakeRuntime(clock),
        clock=clock,
        rng=random.Random(1),
    )
    await parts.engine.claim_instance(ec2.instance_id)
    await parts.pool.adopt()
    return parts


async def _rounds(parts: Parts, clock: FakeClock, n: int = 10) -> None:
    """`n` pool rounds, each past the backoff of the one before."""
    for _ in range(n):
        clock.advance(max(parts.pool.conditions.backoff_until - clock.now(), 0.0) + 5.0)
        await parts.pool.run_once()


def _secondary_subnets(ec2: FakeEc2) -> list[str]:
    attached = [e for e in ec2.enis.values() if e.device_index not in (None, 0)]
    return [e.subnet_id for e in sorted(attached, key=lambda e: e.device_index or 0)]


def _primary_units(ec2: FakeEc2) -> int:
    return len(next(e for e in ec2.enis.values() if e.device_index == 0).units)


async def test_a_tagged_subnet_takes_over_when_the_nodes_runs_dry_under_the_primary(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    ec2, pods = _dry_node_subnet(clock, free=4)
    parts = await _open(tmp_path, ec2, clock)
    health = parts.pool.health
    conditions = parts.pool.conditions
    try:
        await parts.pool.run_once()  # the first view, then the primary's 9: 4 are left
        assert health.errors_by_code == {EXHAUSTED: 1}
        assert conditions.subnet_exhausted_until == 0.0, "no cooldown: another subnet takes over"
        assert parts.pool.subnets.growth_closed() == {ec2.subnet_id}

        await _rounds(parts, clock, 3)
        assert _secondary_subnets(ec2) == [pods] and _primary_units(ec2) == 0
        for n in range(18):  # the pod-subnet ENIs' 18 addresses, a new ENI on the way
            await parts.engine.assign(key(f"pod-{n}"))
            await _rounds(parts, clock, 1)
        assert _secondary_subnets(ec2) == [pods, pods]

        # At the ENI limit and short of the warm target: the primary is not asked again (its
        # subnet read again a minute after it was found full: still 4 free), so no call fails.
        assigns = ec2.calls["assign_units"]
        await _rounds(parts, clock, 30)
        assert ec2.calls["subnets_in"] == 2 and ec2.calls["assign_units"] == assigns
        assert health.errors_by_code == {EXHAUSTED: 1}
        with pytest.raises(NoAddressAvailable):
            await parts.engine.assign(key("pod-18"))

        # Instances go and the node's subnet has room again: the next read (half an hour after
        # the last) reopens it, and the primary grows.
        _others_leave(ec2)
        clock.advance(HALF_HOUR_S)
        await _rounds(parts, clock, 3)
        assert parts.pool.subnets.growth_closed() == frozenset()
        assert _primary_units(ec2) == 9
        await parts.engine.assign(key("pod-18"))
        check_invariants(parts.engine, tmp_path / STATE_FILE_NAME, clock.now())
    finally:
        await parts.engine.close()


async def test_without_discovery_exhaustion_pauses_growth_as_before(tmp_path: Path) -> None:
    clock = FakeClock()
    ec2, _ = _dry_node_subnet(clock, free=4)
    parts = await _open(tmp_path, ec2, clock, subnets=SubnetSettings(discovery=False))
    try:
        await parts.pool.run_once()
        assert parts.pool.conditions.subnet_exhausted_until == clock.now() + 120.0
        await _rounds(parts, clock, 5)
        assert _secondary_subnets(ec2) == [], "growth paused, and only the node's subnet anyway"
        check_invariants(parts.engine, tmp_path / STATE_FILE_NAME, clock.now())
    finally:
        await parts.engine.close()


async def test_when_every_candidate_is_full_exhaustion_pauses_growth(tmp_path: Path) -> None:
    """The tagged subnet turns out full too: the create tries both, nothing takes over, and growth
    waits out the cooldown instead of creating again at every round."""
    clock = FakeClock()
    ec2, pods = _dry_node_subnet(clock, free=0)
    tagged = ec2.subnets[pods]
    parts = await _open(tmp_path, ec2, clock)
    conditions = parts.pool.conditions
    try:
        assert isinstance(parts.pool, PoolManager)  # an IPv4 node's
        await parts.pool.refresh_subnets()
        tagged.used.update(range(tagged.first, tagged.last + 1))  # after the view was read
        await parts.pool.run_once()
        assert conditions.subnet_exhausted_until == 0.0, "the tagged subnet could still take over"
        clock.advance(max(conditions.backoff_until - clock.now(), 0.0) + 1.0)
        await parts.pool.run_once()
        assert ec2.calls["create_eni"] == 2, "the tagged subnet, then the node's"
        assert conditions.subnet_exhausted_until == clock.now() + 120.0
        assert parts.pool.subnets.growth_closed() == frozenset()
        check_invariants(parts.engine, tmp_path / STATE_FILE_NAME, clock.now())
    finally:
        await parts.engine.close()
