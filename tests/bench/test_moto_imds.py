"""The simulator's IMDS (`bench.cluster.node.MotoImds`) shows an instance's ENIs as moto holds them,
and builds its answer again only when one of them changed: a change to another ENI, in the same
subnet, leaves it as it was."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench.cluster.moto_client import run_instance
from bench.cluster.node import MotoImds
from cloud.embedded.world import IMAGE_ID, EmbeddedEc2, World


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    with EmbeddedEc2() as host:
        yield host.world("m5.large", seed=12)


async def test_the_answer_follows_the_instances_enis_and_only_them(world: World) -> None:
    ec2, backend = world.client(), world.backend()
    instance = run_instance(
        backend, world.region, IMAGE_ID, "m5.large", world.subnet_id, world.security_group_id
    )
    imds = MotoImds(instance, world.region)
    first = await imds.interfaces()
    (primary,) = first
    other = ec2.create_network_interface(SubnetId=world.subnet_id)["NetworkInterface"]
    ec2.assign_private_ip_addresses(
        NetworkInterfaceId=other["NetworkInterfaceId"], SecondaryPrivateIpAddressCount=2
    )
    assert await imds.interfaces() is first, "another ENI of the subnet changed: kept"
    added = ec2.assign_private_ip_addresses(
        NetworkInterfaceId=primary.eni_id, SecondaryPrivateIpAddressCount=1
    )["AssignedPrivateIpAddresses"]
    (shown,) = await imds.interfaces()
    assert shown.local_ipv4s == (*primary.local_ipv4s, added[0]["PrivateIpAddress"])
    prefixed = ec2.assign_private_ip_addresses(NetworkInterfaceId=primary.eni_id, Ipv4PrefixCount=1)
    (again,) = await imds.interfaces()
    assert again.ipv4_prefixes == (prefixed["AssignedIpv4Prefixes"][0]["Ipv4Prefix"],)
    attached = ec2.create_network_interface(SubnetId=world.subnet_id)["NetworkInterface"]
    ec2.attach_network_interface(
        NetworkInterfaceId=attached["NetworkInterfaceId"], InstanceId=instance.id, DeviceIndex=1
    )
    assert [i.eni_id for i in await imds.interfaces()] == [
        primary.eni_id,
        attached["NetworkInterfaceId"],
    ]
