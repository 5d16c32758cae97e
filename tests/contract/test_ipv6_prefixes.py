"""IPv6 prefixes on ENIs, as IPv6 mode uses them: one /80 from the subnet's /64 on an ENI, asked for
with AssignIpv6Addresses' Ipv6PrefixCount. The port's behaviour runs against both implementations
(`Boto3Ec2` on the embedded EC2, and `FakeEc2`); what only the embedded EC2 has (EC2's API itself,
the cloud file) runs against it alone.

EC2 API reference, AssignIpv6Addresses: "Ipv6PrefixCount: The number of IPv6 delegated prefixes to
assign to the network interface", exclusive of Ipv6Prefixes and of addresses; the answer's
AssignedIpv6Prefixes lists what was assigned. EC2 User Guide, "Assign prefixes to network
interfaces": on Nitro instances an IPv6 prefix is a /80 of the subnet's IPv6 CIDR block, and a
subnet has at most one IPv6 block, a /64 (EC2 API reference, AssociateSubnetCidrBlock)."""

from __future__ import annotations

import ipaddress
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from cloud.calls import CallLog
from cloud.ec2 import Boto3Ec2, client_config
from cloud.embedded import cloud_file
from cloud.embedded.cloud_keeper import start_kept_world
from cloud.embedded.cloud_restore import capture
from cloud.embedded.world import World
from cloud.embedded.world_layout import Layout, SubnetSpec
from cloud.errors import Rejected
from cloud.fakes import FakeEc2
from cloud.models import NetworkInterface
from cloud.ratelimit import RetryPolicy
from ipamd.clock import FakeClock
from tests.contract.support import attach, create_eni, describe_eni, error_of

V6 = Layout(subnets=(SubnetSpec("10.0.128.0/18"),), ipv6=True)
"""The node's subnet and one more, each with a /64 of the VPC's /56."""
FAKE_64 = "2600:1f14:abc:d00::/64"


@dataclass(frozen=True)
class Node:
    ec2: Any
    instance_id: str
    subnet_id: str
    security_groups: tuple[str, ...]


def _moto(make_world: Callable[..., World], ipv6: bool) -> Node:
    world = make_world(subnet_cidr="10.0.0.0/17", seed=5, layout=V6 if ipv6 else Layout())
    adapter = Boto3Ec2(
        world.client(client_config(timeout_s=5.0)),
        recorder=CallLog(),
        retry=RetryPolicy(max_attempts=1),
        rng=random.Random(3),
    )
    return Node(adapter, world.instance_id, world.subnet_id, (world.security_group_id,))


def _fake(ipv6: bool) -> Node:
    fake = FakeEc2(FakeClock(), subnet_ipv6_cidr=FAKE_64 if ipv6 else "")
    return Node(fake, fake.instance_id, fake.subnet_id, ("sg-0fake",))


@pytest.fixture(params=["moto", "fake"])
def make_node(request: pytest.FixtureRequest) -> Callable[[bool], Node]:
    def make(ipv6: bool) -> Node:
        if request.param == "fake":
            return _fake(ipv6)
        return _moto(request.getfixturevalue("make_world"), ipv6)

    return make


async def _primary(node: Node) -> NetworkInterface:
    enis: tuple[NetworkInterface, ...] = await node.ec2.describe_enis(node.instance_id)
    return next(e for e in enis if e.is_primary)


async def _listed(node: Node, eni_id: str) -> NetworkInterface:
    enis: tuple[NetworkInterface, ...] = await node.ec2.describe_enis(node.instance_id)
    return next(e for e in enis if e.eni_id == eni_id)


async def test_the_subnet_shows_its_64_or_none(make_node: Callable[[bool], Node]) -> None:
    """DescribeSubnets' Ipv6CidrBlockAssociationSet: a subnet has one /64 or no IPv6 block."""
    v6 = make_node(True)
    block = ipaddress.IPv6Network((await v6.ec2.subnet(v6.subnet_id)).ipv6_cidr)
    assert block.prefixlen == 64
    v4 = make_node(False)
    assert (await v4.ec2.subnet(v4.subnet_id)).ipv6_cidr == ""


async def test_an_eni_gets_one_80_of_its_subnets_64_and_describe_lists_it(
    make_node: Callable[[bool], Node],
) -> None:
    """AssignIpv6Addresses with Ipv6PrefixCount 1 assigns one /80 of the subnet's /64 (Nitro), and
    DescribeNetworkInterfaces lists it in the ENI's Ipv6Prefixes."""
    node = make_node(True)
    block = ipaddress.IPv6Network((await node.ec2.subnet(node.subnet_id)).ipv6_cidr)
    primary = await _primary(node)
    assert primary.ipv6_prefixes == ()
    prefix = await node.ec2.assign_ipv6_prefix(primary.eni_id)
    network = ipaddress.IPv6Network(prefix)
    assert network.prefixlen == 80 and network.subnet_of(block)
    assert (await _primary(node)).ipv6_prefixes == (prefix,)
    assert primary.prefixes == () and (await _primary(node)).secondary_ips == ()


async def test_two_enis_get_different_80s(make_node: Callable[[bool], Node]) -> None:
    """EC2 delegates each /80 of a subnet to one ENI at a time."""
    node = make_node(True)
    primary = await _primary(node)
    other = await node.ec2.create_eni(node.subnet_id, node.security_groups, "pods", {"k": "v"})
    await node.ec2.attach_eni(other.eni_id, node.instance_id, 1)
    first = await node.ec2.assign_ipv6_prefix(primary.eni_id)
    second = await node.ec2.assign_ipv6_prefix(other.eni_id)
    assert not ipaddress.IPv6Network(first).overlaps(ipaddress.IPv6Network(second))
    assert (await _listed(node, other.eni_id)).ipv6_prefixes == (second,)
    assert (await _primary(node)).ipv6_prefixes == (first,)


async def test_a_subnet_without_an_ipv6_block_is_refused(make_node: Callable[[bool], Node]) -> None:
    """An IPv6 assignment in a subnet with no IPv6 CIDR block is refused with EC2's
    InvalidParameterValue (a `Rejected`, not retried), and the ENI is left as it was."""
    node = make_node(False)
    primary = await _primary(node)
    with pytest.raises(Rejected) as refused:
        await node.ec2.assign_ipv6_prefix(primary.eni_id)
    assert refused.value.code == "InvalidParameterValue" and not refused.value.retryable
    assert (await _primary(node)).ipv6_prefixes == ()


# -- EC2's API on the embedded EC2 ----------------------------------------------------------------


def test_a_v6_world_gives_each_subnet_a_64_of_the_vpcs_56(make_world: Callable[..., World]) -> None:
    """AssociateVpcCidrBlock (AmazonProvidedIpv6CidrBlock) gives the VPC a /56 and
    AssociateSubnetCidrBlock each subnet a /64 of it (EC2 API reference): the node's subnet first."""
    world = make_world(subnet_cidr="10.0.0.0/17", layout=V6)
    ec2 = world.client()
    vpc = ec2.describe_vpcs(VpcIds=[world.vpc_id])["Vpcs"][0]
    (association,) = vpc["Ipv6CidrBlockAssociationSet"]
    block = ipaddress.IPv6Network(association["Ipv6CidrBlock"])
    assert block.prefixlen == 56
    subnets = ec2.describe_subnets(SubnetIds=[world.subnet_id, world.subnets[0].subnet_id])
    found = {
        s["SubnetId"]: ipaddress.IPv6Network(s["Ipv6CidrBlockAssociationSet"][0]["Ipv6CidrBlock"])
        for s in subnets["Subnets"]
    }
    first, second = list(block.subnets(new_prefix=64))[:2]
    assert found == {world.subnet_id: first, world.subnets[0].subnet_id: second}
    assert world.subnets[0].ipv6_cidr == str(second)


def test_named_prefixes_are_checked_and_the_answer_lists_only_the_new(
    make_world: Callable[..., World],
) -> None:
    """AssignIpv6Addresses with Ipv6Prefixes: a /80 of the subnet's /64 that no ENI holds is
    assigned; one another ENI holds, one outside the subnet's block, or a count beside the names
    is refused, and the ENI is left as it was."""
    world = make_world(subnet_cidr="10.0.0.0/17", layout=V6)
    ec2 = world.client()
    subnet = ec2.describe_subnets(SubnetIds=[world.subnet_id])["Subnets"][0]
    node_64 = ipaddress.IPv6Network(subnet["Ipv6CidrBlockAssociationSet"][0]["Ipv6CidrBlock"])
    wanted = _nth_80(node_64, 7)
    named = ec2.assign_ipv6_addresses(
        NetworkInterfaceId=world.primary_eni_id, Ipv6Prefixes=[wanted]
    )
    assert named["AssignedIpv6Prefixes"] == [wanted]
    drawn = ec2.assign_ipv6_addresses(NetworkInterfaceId=world.primary_eni_id, Ipv6PrefixCount=1)
    assert len(drawn["AssignedIpv6Prefixes"]) == 1 and drawn["AssignedIpv6Prefixes"] != [wanted]
    other = create_eni(ec2, world.subnet_id)
    in_the_other_subnet = _nth_80(ipaddress.IPv6Network(world.subnets[0].ipv6_cidr), 1)
    refusals: list[tuple[dict[str, Any], str]] = [
        ({"Ipv6Prefixes": [wanted]}, "InvalidParameterValue"),
        ({"Ipv6Prefixes": [in_the_other_subnet]}, "InvalidParameterValue"),
        (
            {"Ipv6Prefixes": [_nth_80(node_64, 9)], "Ipv6PrefixCount": 1},
            "InvalidParameterCombination",
        ),
    ]
    for params, code in refusals:
        with pytest.raises(ClientError) as refused:
            ec2.assign_ipv6_addresses(NetworkInterfaceId=other, **params)
        assert error_of(refused)[0] == code, params
    assert describe_eni(ec2, other).get("Ipv6Prefixes", []) == []
    listed = [p["Ipv6Prefix"] for p in describe_eni(ec2, world.primary_eni_id)["Ipv6Prefixes"]]
    assert listed == [wanted, *drawn["AssignedIpv6Prefixes"]]


def _nth_80(block: ipaddress.IPv6Network, n: int) -> str:
    return str(ipaddress.IPv6Network((int(block.network_address) + (n << 48), 80)))


def test_the_80s_survive_a_restart_from_the_cloud_file(tmp_path: Path) -> None:
    """The embedded cloud's file keeps the VPC's /56, the subnets' /64s and each ENI's /80s: after
    a restart DescribeNetworkInterfaces lists the same /80 on the same ENI, and a new one is not it."""
    path = tmp_path / "embedded-cloud.json"
    first = start_kept_world(path, "m5.large", "us-west-2", subnet_cidr="10.0.0.0/17", layout=V6)
    try:
        ec2 = first.world.client()
        eni = first.world.primary_eni_id
        other = create_eni(ec2, first.world.subnets[0].subnet_id)
        attach(ec2, other, first.world.instance_id, 1)
        kept = ec2.assign_ipv6_addresses(NetworkInterfaceId=eni, Ipv6PrefixCount=1)
        facts = capture(first.world)
    finally:
        first.close()
    assert cloud_file.load(path) == facts
    assert '"format": 3' in path.read_text()

    second = start_kept_world(path, "m5.large", "us-west-2")
    try:
        assert second.restored and capture(second.world) == facts
        ec2 = second.world.client()
        listed = describe_eni(ec2, eni)["Ipv6Prefixes"]
        assert [p["Ipv6Prefix"] for p in listed] == kept["AssignedIpv6Prefixes"]
        subnets = ec2.describe_subnets(SubnetIds=[second.world.subnet_id])["Subnets"]
        assert (
            subnets[0]["Ipv6CidrBlockAssociationSet"][0]["Ipv6CidrBlock"] == facts.subnet_ipv6_cidr
        )
        again = ec2.assign_ipv6_addresses(NetworkInterfaceId=other, Ipv6PrefixCount=1)
        assert again["AssignedIpv6Prefixes"] != kept["AssignedIpv6Prefixes"]
    finally:
        second.close()
