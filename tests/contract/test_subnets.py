"""A VPC with several subnets, as subnet discovery and custom networking use it: the node's subnet,
tagged subnets in its zone and another, some in a secondary VPC CIDR block (EKS's 100.64.0.0/16)."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from botocore.exceptions import ClientError

from cloud.embedded.imds_sim import ImdsSimulator
from cloud.embedded.world import World
from cloud.embedded.world_layout import CLUSTER_TAG_PREFIX, CNI_ROLE_TAG, Layout, SubnetSpec
from tests.contract.conftest import NO_RETRIES
from tests.contract.support import (
    all_addresses,
    attach,
    available_count,
    create_eni,
    describe_eni,
    error_of,
)

NODE_SUBNET = "10.0.0.0/20"
SAME_ZONE = "10.0.16.0/20"
"""Tagged for discovery, in the VPC's primary block."""
OTHER_CLUSTER = "100.64.0.0/19"
"""Tagged for discovery, but for another cluster only."""
OTHER_ZONE = "100.64.32.0/19"
"""Tagged for discovery, in zone b."""
OPTED_OUT = "100.64.64.0/24"
UNTAGGED = "100.64.65.0/24"

LAYOUT = Layout(
    secondary_cidrs=("100.64.0.0/16",),
    subnets=(
        SubnetSpec(SAME_ZONE, tags={CNI_ROLE_TAG: "1"}),
        SubnetSpec(OTHER_CLUSTER, tags={CNI_ROLE_TAG: "1", f"{CLUSTER_TAG_PREFIX}other": "1"}),
        SubnetSpec(OTHER_ZONE, zone="b", tags={CNI_ROLE_TAG: "1"}),
        SubnetSpec(OPTED_OUT, tags={CNI_ROLE_TAG: "0"}),
        SubnetSpec(UNTAGGED),
    ),
)


@pytest.fixture
def world(make_world: Callable[..., World]) -> World:
    return make_world(instance_type="c5.18xlarge", subnet_cidr=NODE_SUBNET, layout=LAYOUT)


def _cidrs(ec2: Any, *filters: tuple[str, str]) -> list[str]:
    answer = ec2.describe_subnets(Filters=[{"Name": n, "Values": [v]} for n, v in filters])
    return sorted(s["CidrBlock"] for s in answer["Subnets"])


def _usable(cidr: str) -> int:
    """EC2 reserves five addresses of every subnet."""
    return ipaddress.IPv4Network(cidr).num_addresses - 5


def test_the_default_world_has_one_subnet_and_one_block(make_world: Callable[..., World]) -> None:
    world = make_world()
    ec2 = world.client(NO_RETRIES)

    assert (world.subnets, world.secondary_cidrs) == ((), ())
    assert _cidrs(ec2, ("vpc-id", world.vpc_id)) == ["10.0.0.0/16"]
    vpc = ec2.describe_vpcs(VpcIds=[world.vpc_id])["Vpcs"][0]
    assert [a["CidrBlock"] for a in vpc["CidrBlockAssociationSet"]] == ["10.0.0.0/16"]


def test_the_layout_is_built_as_asked(world: World, ec2: Any) -> None:
    """Amazon VPC User Guide, "VPC CIDR blocks" and DescribeSubnets: the secondary block is
    associated with the VPC, and every subnet has its CIDR, zone, VPC and tags."""
    vpc = ec2.describe_vpcs(VpcIds=[world.vpc_id])["Vpcs"][0]
    blocks = {a["CidrBlock"]: a["CidrBlockState"]["State"] for a in vpc["CidrBlockAssociationSet"]}
    assert blocks == {"10.0.0.0/16": "associated", "100.64.0.0/16": "associated"}
    assert world.secondary_cidrs == ("100.64.0.0/16",)

    described = {s["SubnetId"]: s for s in ec2.describe_subnets()["Subnets"]}
    assert [s.cidr for s in world.subnets] == [spec.cidr for spec in LAYOUT.subnets]
    for made, spec in zip(world.subnets, LAYOUT.subnets, strict=True):
        subnet = described[made.subnet_id]
        assert subnet["VpcId"] == world.vpc_id
        assert subnet["CidrBlock"] == made.cidr == spec.cidr
        zone = "us-west-2b" if spec.zone == "b" else world.availability_zone
        assert subnet["AvailabilityZone"] == made.availability_zone == zone
        assert {t["Key"]: t["Value"] for t in subnet.get("Tags", [])} == dict(spec.tags)
    assert world.subnet(OTHER_ZONE).availability_zone == "us-west-2b"
    with pytest.raises(KeyError):
        world.subnet("10.0.32.0/20")


def test_describe_subnets_filters_pick_exactly_the_right_subnets(world: World, ec2: Any) -> None:
    """EC2 API reference, DescribeSubnets (filters vpc-id, availability-zone, tag:<key>, tag-key):
    what subnet discovery asks for. The region's default VPC and its subnets never match the
    world's VPC."""
    vpc = ("vpc-id", world.vpc_id)
    zone_a = ("availability-zone", world.availability_zone)
    everything = [NODE_SUBNET, SAME_ZONE, OTHER_CLUSTER, OTHER_ZONE, OPTED_OUT, UNTAGGED]

    assert _cidrs(ec2, vpc) == sorted(everything)
    assert _cidrs(ec2, vpc, zone_a) == sorted(set(everything) - {OTHER_ZONE})
    assert _cidrs(ec2, vpc, ("availability-zone", "us-west-2b")) == [OTHER_ZONE]
    assert _cidrs(ec2, vpc, zone_a, (f"tag:{CNI_ROLE_TAG}", "1")) == sorted(
        [SAME_ZONE, OTHER_CLUSTER]
    )
    assert _cidrs(ec2, vpc, (f"tag:{CNI_ROLE_TAG}", "0")) == [OPTED_OUT]
    assert _cidrs(ec2, vpc, ("tag-key", CNI_ROLE_TAG)) == sorted(
        [SAME_ZONE, OTHER_CLUSTER, OTHER_ZONE, OPTED_OUT]
    )
    assert _cidrs(ec2, vpc, ("tag-key", f"{CLUSTER_TAG_PREFIX}other")) == [OTHER_CLUSTER]
    assert _cidrs(ec2, vpc, ("availability-zone", "us-west-2c")) == []


def test_available_counts_of_fresh_subnets(world: World, ec2: Any) -> None:
    """DescribeSubnets, AvailableIpAddressCount: the subnet's size less the five reserved addresses
    and the addresses in use (the instance's primary, in the node's subnet)."""
    subnets = ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [world.vpc_id]}])
    counts = {s["CidrBlock"]: s["AvailableIpAddressCount"] for s in subnets["Subnets"]}

    expected = {s.cidr: _usable(s.cidr) for s in world.subnets}
    expected[NODE_SUBNET] = _usable(NODE_SUBNET) - 1
    assert counts == expected


def test_an_eni_in_another_subnet_of_the_zone_attaches(world: World, ec2: Any) -> None:
    """EC2 User Guide, "Network interfaces": an interface of another subnet of the instance's VPC
    and zone can be attached; it takes its addresses from its own subnet (here the secondary block),
    and so do secondary addresses and prefixes assigned to it later."""
    subnet = world.subnet(OTHER_CLUSTER)
    eni = create_eni(ec2, subnet.subnet_id, Groups=[world.security_group_id])
    attach(ec2, eni, world.instance_id, 1)
    ec2.assign_private_ip_addresses(NetworkInterfaceId=eni, SecondaryPrivateIpAddressCount=5)
    answer = ec2.assign_private_ip_addresses(NetworkInterfaceId=eni, Ipv4PrefixCount=1)

    described = describe_eni(ec2, eni)
    assert described["SubnetId"] == subnet.subnet_id
    assert described["AvailabilityZone"] == world.availability_zone
    assert described["Attachment"]["InstanceId"] == world.instance_id
    assert described["Attachment"]["DeviceIndex"] == 1
    network = ipaddress.IPv4Network(subnet.cidr)
    assert len(all_addresses(ec2, eni)) == 6
    assert all(ipaddress.IPv4Address(a) in network for a in all_addresses(ec2, eni))
    prefix = ipaddress.IPv4Network(answer["AssignedIpv4Prefixes"][0]["Ipv4Prefix"])
    assert prefix.subnet_of(network)
    instance = ec2.describe_instances(InstanceIds=[world.instance_id])["Reservations"][0][
        "Instances"
    ][0]
    by_index = {
        n["Attachment"]["DeviceIndex"]: n["SubnetId"] for n in instance["NetworkInterfaces"]
    }
    assert by_index == {0: world.subnet_id, 1: subnet.subnet_id}


def test_an_eni_of_another_zone_is_refused(world: World, ec2: Any) -> None:
    """EC2 User Guide, "Network interfaces": the interface and the instance must be in the same
    availability zone. An interface of a subnet in zone b is created, but attaching it to the zone-a
    instance is InvalidParameterCombination, and nothing changes."""
    eni = create_eni(ec2, world.subnet(OTHER_ZONE).subnet_id)
    assert describe_eni(ec2, eni)["AvailabilityZone"] == "us-west-2b"

    with pytest.raises(ClientError) as excinfo:
        attach(ec2, eni, world.instance_id, 1)
    assert error_of(excinfo) == (
        "InvalidParameterCombination",
        "You may not attach a network interface to an instance if they are not in the same "
        "availability zone",
    )
    described = describe_eni(ec2, eni)
    assert described["Status"] == "available"
    assert "Attachment" not in described
    attached = ec2.describe_network_interfaces(
        Filters=[{"Name": "attachment.instance-id", "Values": [world.instance_id]}]
    )["NetworkInterfaces"]
    assert [e["NetworkInterfaceId"] for e in attached] == [world.primary_eni_id]


def test_available_count_follows_each_subnet(world: World, ec2: Any) -> None:
    """DescribeSubnets, AvailableIpAddressCount: addresses and prefixes taken in one subnet lower its
    count (16 per prefix) and no other's; releasing them gives them back."""
    subnet = world.subnet(SAME_ZONE).subnet_id
    others = [s.subnet_id for s in world.subnets if s.subnet_id != subnet] + [world.subnet_id]
    before = {s: available_count(ec2, s) for s in [subnet, *others]}

    eni = create_eni(ec2, subnet, SecondaryPrivateIpAddressCount=3)
    assert available_count(ec2, subnet) == before[subnet] - 4
    added = ec2.assign_private_ip_addresses(
        NetworkInterfaceId=eni, SecondaryPrivateIpAddressCount=6
    )
    prefixes = ec2.assign_private_ip_addresses(NetworkInterfaceId=eni, Ipv4PrefixCount=2)
    assert available_count(ec2, subnet) == before[subnet] - 4 - 6 - 32
    assert {s: available_count(ec2, s) for s in others} == {s: before[s] for s in others}

    ec2.unassign_private_ip_addresses(
        NetworkInterfaceId=eni,
        PrivateIpAddresses=[a["PrivateIpAddress"] for a in added["AssignedPrivateIpAddresses"]],
        Ipv4Prefixes=[p["Ipv4Prefix"] for p in prefixes["AssignedIpv4Prefixes"]],
    )
    assert available_count(ec2, subnet) == before[subnet] - 4
    ec2.delete_network_interface(NetworkInterfaceId=eni)
    assert available_count(ec2, subnet) == before[subnet]


async def test_imds_describes_an_eni_of_another_subnet(world: World, ec2: Any) -> None:
    """EC2 User Guide, "Instance metadata categories" (network/interfaces/macs/<mac>/): an ENI's
    subnet-id and subnet-ipv4-cidr-block are its own subnet's; vpc-ipv4-cidr-blocks lists every
    block of the VPC, the secondary one included."""
    subnet = world.subnet(OTHER_CLUSTER)
    eni = create_eni(ec2, subnet.subnet_id)
    attach(ec2, eni, world.instance_id, 1)
    macs = {
        e["NetworkInterfaceId"]: e["MacAddress"]
        for e in ec2.describe_network_interfaces()["NetworkInterfaces"]
    }

    async with ImdsSimulator(world) as sim, aiohttp.ClientSession() as session:
        async with session.put(
            f"{sim.base_url}/latest/api/token",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"},
        ) as answer:
            token = await answer.text()

        async def read(mac: str, key: str) -> str:
            url = f"{sim.base_url}/latest/meta-data/network/interfaces/macs/{mac}/{key}"
            async with session.get(url, headers={"X-aws-ec2-metadata-token": token}) as answer:
                assert answer.status == 200, key
                return await answer.text()

        assert await read(macs[eni], "subnet-id") == subnet.subnet_id
        assert await read(macs[eni], "subnet-ipv4-cidr-block") == OTHER_CLUSTER
        assert await read(macs[world.primary_eni_id], "subnet-ipv4-cidr-block") == NODE_SUBNET
        blocks = await read(macs[eni], "vpc-ipv4-cidr-blocks")
        assert blocks.split("\n") == ["10.0.0.0/16", "100.64.0.0/16"]
