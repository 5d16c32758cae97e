"""Where a node's addresses come from: subnet discovery (tagged subnets of the node's zone, the most
free first, the cluster tag scoping them, a `0` tag closing a subnet and draining its ENIs), custom
networking's ENIConfig (its subnet and security groups), and ENIs of other users left alone. Each
runs the daemon's own wiring (`ipamd.node.engine_parts`) on the in-memory EC2, with several subnets, and ends
with the shared invariant check."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from cloud.embedded.world import EmbeddedEc2
from cloud.embedded.world_layout import CLUSTER_TAG_PREFIX as LAYOUT_CLUSTER_PREFIX
from cloud.embedded.world_layout import CNI_ROLE_TAG, Layout, SubnetSpec
from cloud.fakes import FakeEc2, FakeImds
from cloud.ports import MANAGED_BY, TAG_CREATED_AT, TAG_INSTANCE_ID, TAG_MANAGED_BY
from datastore.store import STATE_FILE_NAME
from ipamd.clock import FakeClock
from ipamd.config.eniconfig import EniConfig
from ipamd.config.groups import ReconcileSettings
from ipamd.engine.invariants import check_invariants
from ipamd.errors import NoAddressAvailable
from ipamd.node.cloud_node import CloudNode, node_config, open_cloud_node
from ipamd.node.engine_parts import Parts, describe_node, open_parts
from ipamd.pool.manager import PoolManager
from ipamd.runtime.fake import FakeRuntime
from ipamd.sizing.inputs import PoolTargets
from ipamd.sizing.subnets import CLUSTER_TAG_PREFIX, NO_MANAGE_TAG, ROLE_TAG
from tests.support.node import key

# Grow a new ENI as soon as the primary (9 addresses) cannot keep 12 free; give back at once.
TARGETS = PoolTargets(warm_ip_target=12, min_eni_lifetime_s=0)
HALF_HOUR_S = 1800.0


def _ec2(clock: FakeClock, max_enis: int = 3) -> FakeEc2:
    """An m5.large-like instance (10 addresses per ENI) in a /24 of 250 free addresses."""
    return FakeEc2(clock, subnet_cidr="10.0.0.0/24", max_enis=max_enis, ipv4_per_eni=10)


async def _open(
    tmp_path: Path,
    ec2: FakeEc2,
    clock: FakeClock,
    targets: PoolTargets = TARGETS,
    eni_config: EniConfig | None = None,
    **values: Any,
) -> Parts:
    config = node_config(tmp_path, targets, reconcile=ReconcileSettings(grace_s=0.0), **values)
    facts = await describe_node(ec2, ec2.instance_id)
    parts = await open_parts(
        config,
        facts,
        ec2=ec2,
        imds=FakeImds(ec2),
        runtime=FakeRuntime(clock),
        clock=clock,
        rng=random.Random(1),
        eni_config=eni_config,
    )
    await parts.engine.claim_instance(ec2.instance_id)
    await parts.pool.adopt()
    return parts


async def _settle(parts: Parts, rounds: int = 20) -> None:
    for _ in range(rounds):
        if (await parts.pool.run_once()).is_empty():
            return
    raise AssertionError(f"the pool did not settle: {parts.pool.plan()}")


def _secondary_subnets(ec2: FakeEc2) -> list[str]:
    attached = sorted(
        (e for e in ec2.enis.values() if e.device_index not in (None, 0)),
        key=lambda e: e.device_index or 0,
    )
    return [e.subnet_id for e in attached]


def _check(parts: Parts, tmp_path: Path, clock: FakeClock) -> None:
    check_invariants(parts.engine, tmp_path / STATE_FILE_NAME, clock.now())


async def test_enis_go_to_the_tagged_subnet_with_the_most_free_addresses(
    tmp_path: Path,
) -> None:
    """Of the zone's subnets opted in (and the node's own), the new ENI goes to the one with the
    most free addresses; an untagged, a `0`-tagged and another zone's subnet are never used, however
    large. DescribeSubnets is read once for both ENIs, and the choice follows the counts it reads
    half an hour later."""
    clock = FakeClock()
    ec2 = _ec2(clock, max_enis=4)
    small = ec2.add_subnet("10.0.16.0/26", {ROLE_TAG: "1"})  # 59 free
    big = ec2.add_subnet("10.0.32.0/22", {ROLE_TAG: "1"})  # 1019 free
    ec2.add_subnet("10.0.64.0/20")  # untagged
    ec2.add_subnet("10.1.0.0/16", {ROLE_TAG: "0"})
    ec2.add_subnet("10.2.0.0/16", {ROLE_TAG: "1"}, zone="us-west-2b")
    parts = await _open(tmp_path, ec2, clock)

    await _settle(parts)
    assert _secondary_subnets(ec2) == [big]
    for n in range(12):
        await parts.engine.assign(key(f"pod-{n}"))
    await _settle(parts)
    assert _secondary_subnets(ec2) == [big, big]
    assert ec2.calls["subnets_in"] == 1, "one read for both ENIs"

    # Someone else takes all but 10 of the big subnet's addresses: the next read ranks the node's
    # own subnet (over 200 free) first, then the small one (59).
    ec2.subnets[big].used.update(range(ec2.subnets[big].first, ec2.subnets[big].last - 9))
    clock.advance(HALF_HOUR_S)
    for n in range(12, 24):
        await parts.engine.assign(key(f"pod-{n}"))
    await _settle(parts)
    assert ec2.calls["subnets_in"] == 2
    assert _secondary_subnets(ec2) == [big, big, ec2.subnet_id]
    assert small not in _secondary_subnets(ec2)
    _check(parts, tmp_path, clock)
    await parts.engine.close()


async def test_a_create_that_finds_its_subnet_full_tries_the_next_and_reads_again_soon(
    tmp_path: Path,
) -> None:
    """The view's free counts may be stale: the best subnet turns out full, the next one takes the
    ENI (VPC CNI does the same), and the view is read again a minute after the last read, not in
    half an hour."""
    clock = FakeClock()
    ec2 = _ec2(clock)
    big = ec2.add_subnet("10.0.32.0/22", {ROLE_TAG: "1"})
    parts = await _open(tmp_path, ec2, clock)
    assert isinstance(parts.pool, PoolManager)  # an IPv4 node's
    await parts.pool.refresh_subnets()
    full = ec2.subnets[big]
    full.used.update(range(full.first, full.last + 1))

    await _settle(parts)
    assert _secondary_subnets(ec2) == [ec2.subnet_id]
    assert parts.pool.health.failures == 0
    clock.advance(60.0)
    await parts.pool.run_once()
    assert ec2.calls["subnets_in"] == 2
    _check(parts, tmp_path, clock)
    await parts.engine.close()


async def test_a_zero_tag_excludes_the_nodes_subnet_and_drains_its_enis(tmp_path: Path) -> None:
    """The node's subnet tagged `kubernetes.io/role/cni=0` after its ENIs hold pods: from the next
    read on, no new pod gets an address there, a new ENI goes to the tagged subnet, the free units
    of the closed ENIs go back to EC2, and the secondary ENI goes once its pods are deleted (the
    primary stays: it goes only with the instance)."""
    clock = FakeClock()
    ec2 = _ec2(clock)
    pods_subnet = ec2.add_subnet("10.0.16.0/26", {ROLE_TAG: "1"})  # fewer free than the node's
    parts = await _open(tmp_path, ec2, clock, PoolTargets(warm_ip_target=2, min_eni_lifetime_s=0))
    engine = parts.engine
    await _settle(parts)
    for n in range(12):
        await engine.assign(key(f"old-{n}"))
        await _settle(parts)
    (closing,) = [e.eni_id for e in ec2.enis.values() if e.device_index == 1]
    assert ec2.enis[closing].subnet_id == ec2.subnet_id

    ec2.tag_subnet(ec2.subnet_id, {ROLE_TAG: "0"})
    clock.advance(HALF_HOUR_S)
    await _settle(parts)

    assert engine.closed_subnets == {ec2.subnet_id}
    assert engine.closed_enis() == {ec2.enis[closing].eni_id, next(iter(ec2.enis))}
    assert _secondary_subnets(ec2) == [ec2.subnet_id, pods_subnet]
    closed = engine.closed_enis()
    free_on_closed = [
        c
        for c in engine.state.units()
        if engine.state.units()[c].eni_id in closed and not engine.state.owned_in(c)
    ]
    assert free_on_closed == [], "the closed ENIs' free units went back to EC2"
    for n in range(3):
        record = await engine.assign(key(f"new-{n}"))
        assert record.eni_id not in closed
        await _settle(parts)

    for n in range(12):
        await engine.release(key(f"old-{n}"))
    clock.advance(31.0)  # past IP_COOLDOWN_PERIOD
    await _settle(parts)
    assert ec2.enis[closing].deleted, "the emptied ENI of the closed subnet was returned"
    assert _secondary_subnets(ec2) == [pods_subnet]
    primary = next(iter(ec2.enis))
    assert not ec2.enis[primary].units, "the primary keeps no free addresses either"
    _check(parts, tmp_path, clock)
    await engine.close()


async def test_the_cluster_tag_scopes_a_subnet_to_its_clusters(tmp_path: Path) -> None:
    """With CLUSTER_NAME=blue, a subnet tagged for green only is not used (and ENIs in it take no
    new pods), one tagged for blue is; without a cluster name the scope is ignored."""
    clock = FakeClock()
    ec2 = _ec2(clock)
    green = ec2.add_subnet("10.0.32.0/22", {ROLE_TAG: "1", f"{CLUSTER_TAG_PREFIX}green": "1"})
    blue = ec2.add_subnet("10.0.16.0/23", {ROLE_TAG: "1", f"{CLUSTER_TAG_PREFIX}blue": "1"})

    parts = await _open(tmp_path / "blue", ec2, clock, cluster_name="blue")
    await _settle(parts)
    assert _secondary_subnets(ec2) == [blue]
    assert parts.engine.closed_subnets == {green}
    await parts.engine.close()

    unscoped = _ec2(clock)
    green = unscoped.add_subnet("10.0.32.0/22", {ROLE_TAG: "1", f"{CLUSTER_TAG_PREFIX}green": "1"})
    unscoped.add_subnet("10.0.16.0/23", {ROLE_TAG: "1", f"{CLUSTER_TAG_PREFIX}blue": "1"})
    parts = await _open(tmp_path / "none", unscoped, clock, cluster_name="")
    await _settle(parts)
    assert _secondary_subnets(unscoped) == [green], "the most free, its cluster tag ignored"
    assert parts.engine.closed_subnets == frozenset()
    _check(parts, tmp_path / "none", clock)
    await parts.engine.close()


async def test_the_eni_config_puts_secondary_enis_in_its_subnet_with_its_security_groups(
    tmp_path: Path,
) -> None:
    """Custom networking: every new ENI goes to the ENIConfig's subnet (untagged, and smaller than
    the node's: discovery is off) with the ENIConfig's security groups; DescribeSubnets is never
    called."""
    clock = FakeClock()
    ec2 = _ec2(clock)
    custom = ec2.add_subnet("100.64.0.0/26")
    ec2.add_subnet("10.0.32.0/22", {ROLE_TAG: "1"})
    config = EniConfig("us-west-2a", custom, ("sg-pods", "sg-mesh"))
    parts = await _open(tmp_path, ec2, clock, eni_config=config)
    await _settle(parts)
    for n in range(12):
        await parts.engine.assign(key(f"pod-{n}"))
        await _settle(parts)

    secondaries = [e for e in ec2.enis.values() if e.device_index not in (None, 0)]
    assert [e.subnet_id for e in secondaries] == [custom, custom]
    assert all(e.groups == ("sg-pods", "sg-mesh") for e in secondaries)
    assert ec2.calls["subnets_in"] == 0
    _check(parts, tmp_path, clock)
    await parts.engine.close()


async def test_an_eni_config_without_groups_and_no_eni_config_give_the_primary_enis_groups(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    ec2 = _ec2(clock)
    custom = ec2.add_subnet("100.64.0.0/26")
    parts = await _open(tmp_path / "a", ec2, clock, eni_config=EniConfig("us-west-2a", custom))
    await _settle(parts)
    (eni,) = [e for e in ec2.enis.values() if e.device_index == 1]
    primary = next(e for e in ec2.enis.values() if e.device_index == 0)
    assert (eni.subnet_id, eni.groups) == (custom, primary.groups)
    await parts.engine.close()

    plain = _ec2(clock)
    parts = await _open(tmp_path / "b", plain, clock)
    await _settle(parts)
    (eni,) = [e for e in plain.enis.values() if e.device_index == 1]
    assert (eni.subnet_id, eni.groups) == (plain.subnet_id, ("sg-0fake",))
    await parts.engine.close()


async def test_enis_of_other_users_are_never_used_or_touched(tmp_path: Path) -> None:
    """An EFA, a trunk and an ENI tagged `no_manage=true`: not in the inventory, never given a pod,
    their addresses never unassigned, no IMDS disagreement about them; each still takes one of
    the instance's attachments, so the pool asks EC2 for no ENI it could not attach."""
    clock = FakeClock()
    ec2 = _ec2(clock, max_enis=5)
    foreign = {
        ec2.attach_foreign(1, interface_type="efa"),
        ec2.attach_foreign(2, interface_type="trunk"),
        ec2.attach_foreign(3, tags={NO_MANAGE_TAG: "true"}),
    }
    theirs = {eni_id: set(ec2.enis[eni_id].units) for eni_id in foreign}
    parts = await _open(tmp_path, ec2, clock)
    engine = parts.engine
    await _settle(parts)
    for n in range(18):  # what 2 ENIs of 9 addresses hold
        record = await engine.assign(key(f"pod-{n}"))
        assert record.eni_id not in foreign
        await _settle(parts)
    with pytest.raises(NoAddressAvailable):
        await engine.assign(key("one-too-many"))
    await _settle(parts)
    report = await parts.drift.run_once()

    assert not set(engine.state.enis()) & foreign and not report.changed()
    assert parts.pool.foreign_enis == foreign
    assert len(engine.state.enis()) == 2, "5 attachments, 3 of them someone else's"
    assert parts.pool.health.failures == 0
    assert {eni_id: set(ec2.enis[eni_id].units) for eni_id in foreign} == theirs
    assert not any(eni in foreign for _, eni, _ in ec2.unassigned)
    assert await parts.hint.run_once() == []
    _check(parts, tmp_path, clock)
    await engine.close()


async def test_eni_gc_never_deletes_an_eni_tagged_no_manage(tmp_path: Path) -> None:
    clock = FakeClock()
    ec2 = _ec2(clock)
    born = datetime.fromtimestamp(clock.now(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    ours = {TAG_INSTANCE_ID: ec2.instance_id, TAG_MANAGED_BY: MANAGED_BY, TAG_CREATED_AT: born}
    kept = await ec2.create_eni(ec2.subnet_id, (), "handed over", {**ours, NO_MANAGE_TAG: "true"})
    leftover = await ec2.create_eni(ec2.subnet_id, (), "leftover", ours)
    parts = await _open(tmp_path, ec2, clock, cluster_name="")
    clock.advance(3600.0)

    assert await parts.eni_gc.run_once() == (leftover.eni_id,)
    assert not ec2.enis[kept.eni_id].deleted
    await parts.engine.close()


async def test_steady_state_reads_describe_subnets_at_most_twice_a_node_hour(
    tmp_path: Path,
) -> None:
    """The pool ticking every 5 s for two hours, pods coming and going and ENIs coming: no
    DescribeSubnets per tick or per ENI, only the slow refresh."""
    clock = FakeClock()
    ec2 = _ec2(clock)
    ec2.add_subnet("10.0.32.0/22", {ROLE_TAG: "1"})
    parts = await _open(tmp_path, ec2, clock)
    await parts.pool.run_once()
    reads = ec2.calls["subnets_in"]
    rng = random.Random(4)
    live: list[str] = []
    for tick in range(2 * 720):
        clock.advance(5.0)
        if rng.random() < 0.3:
            if live and rng.random() < 0.5:
                await parts.engine.release(key(live.pop(rng.randrange(len(live)))))
            elif len(live) < 15:
                try:
                    await parts.engine.assign(key(f"pod-{tick}"))
                    live.append(f"pod-{tick}")
                except NoAddressAvailable:  # the next tick grows the pool
                    pass
        await parts.pool.run_once()
    assert ec2.calls["subnets_in"] - reads <= 4
    assert ec2.calls["create_eni"] >= 1
    _check(parts, tmp_path, clock)
    await parts.engine.close()


# --- the same on the embedded EC2, through the boto3 adapter ------------------------------------

EC2_LAYOUT = Layout(
    secondary_cidrs=("100.64.0.0/16",),
    subnets=(
        SubnetSpec("10.0.16.0/22", tags={CNI_ROLE_TAG: "1"}),  # the most free of those usable
        SubnetSpec("100.64.0.0/19", tags={CNI_ROLE_TAG: "1", f"{LAYOUT_CLUSTER_PREFIX}green": "1"}),
        SubnetSpec("100.64.32.0/19", zone="b", tags={CNI_ROLE_TAG: "1"}),
        SubnetSpec("100.64.64.0/19"),  # untagged
        SubnetSpec("100.64.96.0/26"),  # untagged: custom networking's
    ),
)


@pytest.fixture(scope="module")
def embedded() -> Iterator[EmbeddedEc2]:
    with EmbeddedEc2() as host:
        yield host


def _ec2_subnets(node: CloudNode) -> list[str]:
    """The subnet of each secondary ENI attached to the instance, by device index."""
    instance = node.world.backend().get_instance(node.world.instance_id)
    return [nic.subnet.id for index, nic in sorted(instance.nics.items()) if index > 0]


async def test_on_ec2_enis_go_to_the_tagged_subnet_with_the_most_free_addresses(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    """Through the boto3 adapter on the embedded EC2: of a node /24, a tagged /22, a larger /19
    scoped to another cluster, another zone's and untagged ones, both new ENIs go to the /22, and
    the adapter's call log counts one DescribeSubnets for both."""
    async with open_cloud_node(
        embedded, tmp_path, targets=TARGETS, subnet_cidr="10.0.0.0/24", layout=EC2_LAYOUT
    ) as node:
        await node.settle()
        for n in range(18):
            await node.engine.assign(key(f"pod-{n}"))
            await node.settle()

        assert _ec2_subnets(node) == [node.world.subnet("10.0.16.0/22").subnet_id] * 2
        assert node.calls.count("DescribeSubnets") == 1
        green = node.world.subnet("100.64.0.0/19").subnet_id
        assert node.engine.closed_subnets == {green}, (
            "scoped to another cluster (test-cluster here)"
        )
        node.check()


async def test_on_ec2_a_zero_tag_on_the_nodes_subnet_drains_its_secondary_eni(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    async with open_cloud_node(
        embedded,
        tmp_path,
        targets=PoolTargets(warm_ip_target=2, min_eni_lifetime_s=0),
        subnet_cidr="10.0.0.0/20",
        layout=EC2_LAYOUT,
    ) as node:
        await node.settle()
        for n in range(12):
            await node.engine.assign(key(f"old-{n}"))
            await node.settle()
        assert _ec2_subnets(node) == [node.world.subnet_id], "the node's /20 has the most free"

        node.world.client().create_tags(
            Resources=[node.world.subnet_id], Tags=[{"Key": CNI_ROLE_TAG, "Value": "0"}]
        )
        node.clock.advance(HALF_HOUR_S)
        await node.settle()
        record = await node.engine.assign(key("new"))
        await node.settle()
        pods = node.world.subnet("10.0.16.0/22").subnet_id
        assert node.engine.state.enis()[record.eni_id].subnet_id == pods
        for n in range(12):
            await node.engine.release(key(f"old-{n}"))
        node.clock.advance(31.0)
        await node.settle()

        assert _ec2_subnets(node) == [pods]
        node.check()


async def test_on_ec2_the_eni_config_gives_its_subnet_and_security_groups(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    """Custom networking on the embedded EC2: the ENI is created in the ENIConfig's (untagged)
    subnet with the ENIConfig's security group, as DescribeNetworkInterfaces shows it."""
    async with open_cloud_node(
        embedded, tmp_path, targets=TARGETS, subnet_cidr="10.0.0.0/24", layout=EC2_LAYOUT
    ) as node:
        world = node.world
        group = world.client().create_security_group(
            GroupName="pods", Description="pods", VpcId=world.vpc_id
        )["GroupId"]
        custom = world.subnet("100.64.96.0/26").subnet_id
        node.eni_config = EniConfig(world.availability_zone, custom, (group,))
        await node.engine.close()
        await node.reopen()
        await node.settle()

        (eni_id,) = [e for e in node.engine.state.enis() if e != node.world.primary_eni_id]
        described = node.world.client().describe_network_interfaces(NetworkInterfaceIds=[eni_id])
        (eni,) = described["NetworkInterfaces"]
        assert eni["SubnetId"] == custom
        assert [g["GroupId"] for g in eni["Groups"]] == [group]
        assert node.calls.count("DescribeSubnets") == 0
        node.check()
