"""The EC2 port's contract, run against both of its implementations: `Boto3Ec2` on the embedded EC2
(moto with our extension) and the in-memory `FakeEc2` that the scenario, property and cluster tests
run on. Whatever ipamd's logic is proved against in the fake must hold for the adapter users run, so
each behaviour here is one ipamd relies on: what comes back, and which typed error a refusal is."""

from __future__ import annotations

import asyncio
import ipaddress
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from cloud.calls import CallLog
from cloud.ec2 import Boto3Ec2, client_config
from cloud.embedded.world import World
from cloud.embedded.world_layout import CLUSTER_TAG_PREFIX, CNI_ROLE_TAG, Layout, SubnetSpec
from cloud.errors import (
    AddressLimitExceeded,
    AttachmentLimitExceeded,
    InUse,
    NotFound,
    Rejected,
    SubnetExhausted,
)
from cloud.fakes import FakeEc2
from cloud.models import NetworkInterface
from cloud.ratelimit import RetryPolicy
from ipamd.clock import FakeClock


@dataclass(frozen=True)
class Node:
    """One instance of an m5.large (3 ENIs, 10 addresses each) behind one implementation."""

    ec2: Any
    instance_id: str
    subnet_id: str
    subnet_cidr: str
    security_groups: tuple[str, ...]
    vpc_id: str = ""
    zone: str = ""
    subnets: dict[str, str] | None = None
    """The layout's subnets: CIDR -> subnet ID."""
    world: World | None = None
    """The embedded world, on moto; None on the fake."""


class _NoWait:
    """A clock for the adapter's backoff and rate limiter that moves only when something waits."""

    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


def _moto(make_world: Callable[..., World], subnet_cidr: str, layout: Layout) -> Node:
    world = make_world(subnet_cidr=subnet_cidr, seed=11, layout=layout)
    wait = _NoWait()
    adapter = Boto3Ec2(
        world.client(client_config(timeout_s=5.0)),
        recorder=CallLog(),
        retry=RetryPolicy(max_attempts=1),
        clock=wait.clock,
        sleep=wait.sleep,
        rng=random.Random(3),
    )
    subnets = {s.cidr: s.subnet_id for s in world.subnets}
    return Node(
        adapter,
        world.instance_id,
        world.subnet_id,
        subnet_cidr,
        (world.security_group_id,),
        world.vpc_id,
        world.availability_zone,
        subnets,
        world,
    )


def _fake(subnet_cidr: str, layout: Layout) -> Node:
    fake = FakeEc2(FakeClock(), subnet_cidr=subnet_cidr, max_enis=3, ipv4_per_eni=10)
    fake.tag_subnet(fake.subnet_id, layout.node_subnet_tags)
    subnets = {
        spec.cidr: fake.add_subnet(spec.cidr, spec.tags, spec.zone_in("us-west-2", fake.zone))
        for spec in layout.subnets
    }
    return Node(
        fake,
        fake.instance_id,
        fake.subnet_id,
        subnet_cidr,
        ("sg-0fake",),
        fake.vpc_id,
        fake.zone,
        subnets,
    )


@pytest.fixture(params=["moto", "fake"])
def make_node(request: pytest.FixtureRequest) -> Callable[..., Node]:
    def make(subnet_cidr: str = "10.0.0.0/16", layout: Layout | None = None) -> Node:
        if request.param == "fake":
            return _fake(subnet_cidr, layout or Layout())
        return _moto(request.getfixturevalue("make_world"), subnet_cidr, layout or Layout())

    return make


@pytest.fixture
def node(make_node: Callable[..., Node]) -> Node:
    return make_node()


async def _attached(node: Node, index: int, tags: dict[str, str] | None = None) -> str:
    eni = await node.ec2.create_eni(
        node.subnet_id, node.security_groups, "pods", tags or {"a": "b"}
    )
    await node.ec2.attach_eni(eni.eni_id, node.instance_id, index)
    eni_id: str = eni.eni_id
    return eni_id


async def _eni(node: Node, eni_id: str) -> NetworkInterface:
    described: tuple[NetworkInterface, ...] = await node.ec2.describe_enis(node.instance_id)
    return next(e for e in described if e.eni_id == eni_id)


def _in_subnet(node: Node, cidr: str) -> bool:
    return ipaddress.IPv4Network(cidr).subnet_of(ipaddress.IPv4Network(node.subnet_cidr))


async def test_the_primary_eni_is_at_device_index_0(node: Node) -> None:
    (primary,) = await node.ec2.describe_enis(node.instance_id)
    assert primary.is_primary and primary.device_index == 0 and primary.status == "in-use"
    assert primary.instance_id == node.instance_id and primary.attachment_id
    assert _in_subnet(node, f"{primary.primary_ip}/32") and primary.mac
    assert primary.secondary_ips == () and primary.prefixes == ()


async def test_describe_of_another_instance_lists_nothing(node: Node) -> None:
    assert await node.ec2.describe_enis("i-0000000000000dead") == ()


async def test_a_created_eni_is_available_until_attached_then_listed_at_its_index(
    node: Node,
) -> None:
    eni = await node.ec2.create_eni(node.subnet_id, node.security_groups, "pods", {"k": "v"})
    assert eni.status == "available" and eni.device_index is None and eni.attachment_id is None
    assert dict(eni.tags) == {"k": "v"}
    attachment_id = await node.ec2.attach_eni(eni.eni_id, node.instance_id, 2)
    listed = await _eni(node, eni.eni_id)
    assert listed.device_index == 2 and listed.attachment_id == attachment_id
    assert listed.status == "in-use" and not listed.is_primary and listed.mac
    await node.ec2.set_delete_on_termination(eni.eni_id, attachment_id)
    assert (await _eni(node, eni.eni_id)).delete_on_termination


async def test_assign_returns_exactly_the_new_addresses(node: Node) -> None:
    eni_id = await _attached(node, 1)
    first = await node.ec2.assign_units(eni_id, "ip", 3)
    second = await node.ec2.assign_units(eni_id, "ip", 2)
    assert len(first) == 3 and len(second) == 2 and not set(first) & set(second)
    assert all(c.endswith("/32") and _in_subnet(node, c) for c in first + second)
    listed = await _eni(node, eni_id)
    assert sorted(f"{a}/32" for a in listed.secondary_ips) == sorted(first + second)
    assert f"{listed.primary_ip}/32" not in first + second


async def test_prefixes_are_aligned_28s_of_the_subnet(node: Node) -> None:
    eni_id = await _attached(node, 1)
    cidrs = await node.ec2.assign_units(eni_id, "prefix", 2)
    assert len(cidrs) == 2
    for cidr in cidrs:
        net = ipaddress.IPv4Network(cidr)
        assert net.prefixlen == 28 and _in_subnet(node, cidr)
    assert sorted((await _eni(node, eni_id)).prefixes) == sorted(cidrs)


async def test_past_the_per_eni_limit_assign_is_refused_and_changes_nothing(node: Node) -> None:
    eni_id = await _attached(node, 1)
    held = await node.ec2.assign_units(eni_id, "ip", 9)
    with pytest.raises(AddressLimitExceeded):
        await node.ec2.assign_units(eni_id, "ip", 1)
    assert sorted(f"{a}/32" for a in (await _eni(node, eni_id)).secondary_ips) == sorted(held)


async def test_past_the_instance_limit_attach_is_refused(node: Node) -> None:
    await _attached(node, 1)
    await _attached(node, 2)
    extra = await node.ec2.create_eni(node.subnet_id, node.security_groups, "pods", {"a": "b"})
    with pytest.raises(AttachmentLimitExceeded):
        await node.ec2.attach_eni(extra.eni_id, node.instance_id, 3)
    assert len(await node.ec2.describe_enis(node.instance_id)) == 3


async def test_attaching_an_attached_eni_is_in_use(node: Node) -> None:
    eni_id = await _attached(node, 1)
    with pytest.raises(InUse):
        await node.ec2.attach_eni(eni_id, node.instance_id, 2)


async def test_unassign_removes_only_the_named_units(node: Node) -> None:
    eni_id = await _attached(node, 1)
    a, b, c = await node.ec2.assign_units(eni_id, "ip", 3)
    await node.ec2.unassign_units(eni_id, "ip", [a, c])
    assert (await _eni(node, eni_id)).secondary_ips == (b.removesuffix("/32"),)


async def test_unassign_of_an_address_not_on_the_eni_is_refused_and_changes_nothing(
    node: Node,
) -> None:
    first = await _attached(node, 1)
    second = await _attached(node, 2)
    (mine,) = await node.ec2.assign_units(first, "ip", 1)
    (theirs,) = await node.ec2.assign_units(second, "ip", 1)
    with pytest.raises(Rejected):
        await node.ec2.unassign_units(first, "ip", [mine, theirs])
    assert (await _eni(node, first)).secondary_ips == (mine.removesuffix("/32"),)
    assert (await _eni(node, second)).secondary_ips == (theirs.removesuffix("/32"),)


async def test_an_attached_eni_cannot_be_deleted_a_detached_one_goes(node: Node) -> None:
    eni_id = await _attached(node, 1)
    await node.ec2.assign_units(eni_id, "ip", 2)
    with pytest.raises(InUse):
        await node.ec2.delete_eni(eni_id)
    await node.ec2.detach_eni((await _eni(node, eni_id)).attachment_id)
    # EC2 may show a detach late; both implementations here show it at once.
    assert eni_id not in {e.eni_id for e in await node.ec2.describe_enis(node.instance_id)}
    await node.ec2.delete_eni(eni_id)
    with pytest.raises(NotFound):
        await node.ec2.assign_units(eni_id, "ip", 1)
    with pytest.raises(NotFound):
        await node.ec2.delete_eni(eni_id)


async def test_find_enis_matches_every_tag_and_can_ask_for_detached_only(node: Node) -> None:
    mine = {"owner": "node-1", "role": "pods"}
    attached = await _attached(node, 1, mine)
    loose = await node.ec2.create_eni(node.subnet_id, node.security_groups, "pods", mine)
    await node.ec2.create_eni(node.subnet_id, node.security_groups, "pods", {"owner": "node-1"})
    found = await node.ec2.find_enis(mine)
    assert {e.eni_id for e in found} == {attached, loose.eni_id}
    detached = await node.ec2.find_enis(mine, available_only=True)
    assert [e.eni_id for e in detached] == [loose.eni_id]
    with pytest.raises(ValueError):
        await node.ec2.find_enis({})


async def test_a_full_subnet_is_subnet_exhausted(make_node: Callable[..., Node]) -> None:
    # A /28 has 11 usable addresses: the primary ENI holds one, each new ENI one more.
    node = make_node("10.0.9.0/28")
    first = await _attached(node, 1)
    await node.ec2.assign_units(first, "ip", 8)
    second = await _attached(node, 2)
    with pytest.raises(SubnetExhausted):
        await node.ec2.assign_units(second, "ip", 1)
    with pytest.raises(SubnetExhausted):
        await node.ec2.create_eni(node.subnet_id, node.security_groups, "pods", {"a": "b"})


async def test_a_subnet_without_a_free_28_refuses_prefixes_but_not_addresses(
    make_node: Callable[..., Node],
) -> None:
    # A /26 holds four aligned /28s; the first and the last hold addresses EC2 reserves, and the
    # ENIs' primary addresses may sit in the others. Prefixes run out while addresses remain.
    node = make_node("10.0.9.0/26")
    eni_id = await _attached(node, 1)
    prefixes: list[str] = []
    with pytest.raises(SubnetExhausted):
        for _ in range(4):
            prefixes += await node.ec2.assign_units(eni_id, "prefix", 1)
    assert len(prefixes) <= 2 and all(_in_subnet(node, p) for p in prefixes)
    assert len(await node.ec2.assign_units(eni_id, "ip", 1)) == 1


async def test_the_catalog_knows_the_instance_its_limits_and_its_subnet(node: Node) -> None:
    instance = await node.ec2.describe_instance(node.instance_id)
    assert instance.instance_type == "m5.large" and instance.subnet_id == node.subnet_id
    assert instance.security_groups
    limits = await node.ec2.instance_limits("m5.large")
    assert (limits.max_enis, limits.ipv4_per_eni) == (3, 10)
    before = await node.ec2.subnet(node.subnet_id)
    assert before.cidr == node.subnet_cidr
    await node.ec2.assign_units(await _attached(node, 1), "ip", 4)
    after = await node.ec2.subnet(node.subnet_id)
    assert before.available_ips - after.available_ips == 5
    with pytest.raises(NotFound):
        await node.ec2.describe_instance("i-0000000000000dead")


ZONE_LAYOUT = Layout(
    subnets=(
        SubnetSpec("10.0.16.0/24", tags={CNI_ROLE_TAG: "1"}),
        SubnetSpec("10.0.17.0/24", tags={CNI_ROLE_TAG: "1", f"{CLUSTER_TAG_PREFIX}blue": "1"}),
        SubnetSpec("10.0.18.0/24", zone="b", tags={CNI_ROLE_TAG: "1"}),
        SubnetSpec("10.0.19.0/28"),
    ),
    node_subnet_tags={CNI_ROLE_TAG: "0"},
)


async def test_the_catalog_lists_the_subnets_of_the_vpc_and_zone_with_tags_and_free_counts(
    make_node: Callable[..., Node],
) -> None:
    """DescribeSubnets filtered on vpc-id and availability-zone: every subnet of the instance's
    zone (the node's own included, the other zone's not), each with its tags and free count."""
    node = make_node("10.0.0.0/20", ZONE_LAYOUT)
    assert node.subnets is not None
    instance = await node.ec2.describe_instance(node.instance_id)
    assert (instance.vpc_id, instance.availability_zone) == (node.vpc_id, node.zone)

    listed = await node.ec2.subnets_in(instance.vpc_id, instance.availability_zone)

    by_cidr = {s.cidr: s for s in listed}
    assert sorted(by_cidr) == ["10.0.0.0/20", "10.0.16.0/24", "10.0.17.0/24", "10.0.19.0/28"]
    assert [s.subnet_id for s in listed] == sorted(s.subnet_id for s in listed)
    assert by_cidr["10.0.0.0/20"].subnet_id == node.subnet_id
    assert dict(by_cidr["10.0.0.0/20"].tags) == {CNI_ROLE_TAG: "0"}
    assert dict(by_cidr["10.0.17.0/24"].tags) == {
        CNI_ROLE_TAG: "1",
        f"{CLUSTER_TAG_PREFIX}blue": "1",
    }
    assert dict(by_cidr["10.0.19.0/28"].tags) == {}
    # EC2 reserves five addresses per subnet; the instance's primary address is in its own.
    assert by_cidr["10.0.16.0/24"].available_ips == 256 - 5
    assert by_cidr["10.0.19.0/28"].available_ips == 16 - 5
    assert by_cidr["10.0.0.0/20"].available_ips == 4096 - 5 - 1
    assert all(s.vpc_id == node.vpc_id and s.availability_zone == node.zone for s in listed)
    assert await node.ec2.subnets_in(instance.vpc_id, "us-west-2c") == ()


async def test_an_eni_of_another_subnet_takes_its_addresses_there(
    make_node: Callable[..., Node],
) -> None:
    """An ENI created in another subnet of the zone attaches and draws its addresses and prefixes
    from that subnet, whose free count falls by what it took."""
    node = make_node("10.0.0.0/20", ZONE_LAYOUT)
    assert node.subnets is not None
    pods = node.subnets["10.0.16.0/24"]
    eni = await node.ec2.create_eni(pods, node.security_groups, "pods", {"a": "b"})
    await node.ec2.attach_eni(eni.eni_id, node.instance_id, 1)
    ips = await node.ec2.assign_units(eni.eni_id, "ip", 2)
    prefixes = await node.ec2.assign_units(eni.eni_id, "prefix", 1)

    listed = await _eni(node, eni.eni_id)
    net = ipaddress.IPv4Network("10.0.16.0/24")
    assert listed.subnet_id == pods
    assert all(ipaddress.IPv4Network(c).subnet_of(net) for c in (*ips, *prefixes))
    assert ipaddress.IPv4Address(listed.primary_ip) in net
    zone = await node.ec2.subnets_in(node.vpc_id, node.zone)
    assert next(s for s in zone if s.subnet_id == pods).available_ips == 256 - 5 - 3 - 16


async def test_an_ordinary_eni_is_an_interface_and_an_efa_one_says_so(
    make_node: Callable[..., Node],
) -> None:
    """DescribeNetworkInterfaces' InterfaceType: `interface` for the ENIs ipamd makes; an EFA
    attached by someone else is listed as `efa` (set on moto's model: CreateNetworkInterface there
    takes no InterfaceType)."""
    node = make_node()
    mine = await _attached(node, 1)
    if node.world is not None:
        efa = await _attached(node, 2)
        node.world.backend().enis[efa].interface_type = "efa"
    else:
        assert isinstance(node.ec2, FakeEc2)
        efa = node.ec2.attach_foreign(2, interface_type="efa")

    listed = {e.eni_id: e for e in await node.ec2.describe_enis(node.instance_id)}
    assert listed[mine].interface_type == "interface"
    assert listed[efa].interface_type == "efa"
    assert next(e for e in listed.values() if e.is_primary).interface_type == "interface"
