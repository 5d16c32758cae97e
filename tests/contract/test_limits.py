"""Per-ENI address limits and per-instance ENI limits from the instance type."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError

from cloud.embedded.eni_limits import limits_for, unattached_ipv4_limit
from cloud.embedded.world import World
from tests.contract.conftest import NO_RETRIES
from tests.contract.support import attach, create_eni, error_of, prefixes, secondaries

TYPES = [("t3.small", 3, 4), ("m5.large", 3, 10), ("c5.18xlarge", 15, 50)]


@pytest.mark.parametrize(("instance_type", "max_enis", "ipv4_per_eni"), TYPES)
def test_instance_type_data(
    make_world: Callable[..., World], instance_type: str, max_enis: int, ipv4_per_eni: int
) -> None:
    """EC2 API reference, DescribeInstanceTypes (NetworkInfo): the limits ipamd sizes pools with, as
    published for these types; the extension enforces the same numbers."""
    world = make_world(instance_type=instance_type)
    answer = world.client(NO_RETRIES).describe_instance_types(InstanceTypes=[instance_type])
    network = answer["InstanceTypes"][0]["NetworkInfo"]

    assert (network["MaximumNetworkInterfaces"], network["Ipv4AddressesPerInterface"]) == (
        max_enis,
        ipv4_per_eni,
    )
    limits = limits_for(instance_type)
    assert limits is not None
    assert (limits.max_enis, limits.ipv4_per_eni) == (max_enis, ipv4_per_eni)


@pytest.mark.parametrize(("instance_type", "max_enis", "ipv4_per_eni"), TYPES)
def test_secondary_address_limit_per_eni(
    make_world: Callable[..., World], instance_type: str, max_enis: int, ipv4_per_eni: int
) -> None:
    """EC2 API reference, AssignPrivateIpAddresses; EC2 User Guide, "IP addresses per network
    interface per instance type": an attached ENI holds at most Ipv4AddressesPerInterface private
    addresses, the primary included; one more is PrivateIpAddressLimitExceeded."""
    world = make_world(instance_type=instance_type)
    ec2 = world.client(NO_RETRIES)
    ec2.assign_private_ip_addresses(
        NetworkInterfaceId=world.primary_eni_id, SecondaryPrivateIpAddressCount=ipv4_per_eni - 1
    )

    with pytest.raises(ClientError) as excinfo:
        ec2.assign_private_ip_addresses(
            NetworkInterfaceId=world.primary_eni_id, SecondaryPrivateIpAddressCount=1
        )
    assert error_of(excinfo) == (
        "PrivateIpAddressLimitExceeded",
        "Number of private addresses will exceed limit.",
    )
    assert len(secondaries(ec2, world.primary_eni_id)) == ipv4_per_eni - 1


@pytest.mark.parametrize(("instance_type", "max_enis", "ipv4_per_eni"), TYPES)
def test_prefixes_share_the_slots_of_addresses(
    make_world: Callable[..., World], instance_type: str, max_enis: int, ipv4_per_eni: int
) -> None:
    """EC2 User Guide, "Assign prefixes to network interfaces": each /28 prefix takes one of the
    ENI's Ipv4AddressesPerInterface slots, shared with secondary addresses. A request that would pass
    the limit is refused whole."""
    world = make_world(instance_type=instance_type)
    ec2 = world.client(NO_RETRIES)
    eni = world.primary_eni_id
    half = (ipv4_per_eni - 1) // 2
    ec2.assign_private_ip_addresses(NetworkInterfaceId=eni, SecondaryPrivateIpAddressCount=half)
    ec2.assign_private_ip_addresses(NetworkInterfaceId=eni, Ipv4PrefixCount=ipv4_per_eni - 1 - half)

    for extra in ({"Ipv4PrefixCount": 1}, {"SecondaryPrivateIpAddressCount": 1}):
        with pytest.raises(ClientError) as excinfo:
            ec2.assign_private_ip_addresses(NetworkInterfaceId=eni, **extra)
        assert error_of(excinfo)[0] == "PrivateIpAddressLimitExceeded"
    assert len(prefixes(ec2, eni)) == ipv4_per_eni - 1 - half
    assert len(secondaries(ec2, eni)) == half


@pytest.mark.parametrize(("instance_type", "max_enis", "ipv4_per_eni"), TYPES)
def test_attachment_limit_per_instance(
    make_world: Callable[..., World], instance_type: str, max_enis: int, ipv4_per_eni: int
) -> None:
    """EC2 API reference, AttachNetworkInterface and error codes: an instance attaches at most
    MaximumNetworkInterfaces ENIs (its primary included); one more is AttachmentLimitExceeded."""
    world = make_world(instance_type=instance_type)
    ec2 = world.client(NO_RETRIES)
    for index in range(1, max_enis):
        attach(ec2, create_eni(ec2, world.subnet_id), world.instance_id, index)
    spare = create_eni(ec2, world.subnet_id)

    with pytest.raises(ClientError) as excinfo:
        attach(ec2, spare, world.instance_id, max_enis)
    assert error_of(excinfo)[0] == "AttachmentLimitExceeded"
    attached = ec2.describe_network_interfaces(
        Filters=[{"Name": "attachment.instance-id", "Values": [world.instance_id]}]
    )["NetworkInterfaces"]
    assert len(attached) == max_enis


def test_device_index_in_use(world: World, ec2: Any) -> None:
    """EC2 API reference, AttachNetworkInterface: a device index the instance already uses is an
    InvalidParameterValue ("Instance '...' already has an interface attached at device index
    '...'")."""
    attach(ec2, create_eni(ec2, world.subnet_id), world.instance_id, 1)

    with pytest.raises(ClientError) as excinfo:
        attach(ec2, create_eni(ec2, world.subnet_id), world.instance_id, 1)
    code, message = error_of(excinfo)
    assert code == "InvalidParameterValue"
    assert "already has an interface attached at device index '1'" in message


def test_attaching_an_attached_eni_is_in_use(world: World, ec2: Any) -> None:
    """EC2 API reference, error codes: InvalidNetworkInterface.InUse — the interface is attached and
    cannot be attached to another instance (or index)."""
    eni = create_eni(ec2, world.subnet_id)
    attach(ec2, eni, world.instance_id, 1)

    with pytest.raises(ClientError) as excinfo:
        attach(ec2, eni, world.instance_id, 2)
    assert error_of(excinfo)[0] == "InvalidNetworkInterface.InUse"


def test_unattached_eni_is_checked_again_when_attached(make_world: Callable[..., World]) -> None:
    """EC2 checks an ENI's addresses against an instance type when the ENI is attached: no type
    applies to an unattached ENI (ours caps it at the largest Ipv4AddressesPerInterface of any type,
    64 in moto's data), and attaching one that holds more than the instance allows per ENI is refused
    with PrivateIpAddressLimitExceeded (our choice of code)."""
    world = make_world(instance_type="t3.small")
    ec2 = world.client(NO_RETRIES)
    eni = create_eni(ec2, world.subnet_id, SecondaryPrivateIpAddressCount=5)

    with pytest.raises(ClientError) as excinfo:
        attach(ec2, eni, world.instance_id, 1)
    assert error_of(excinfo)[0] == "PrivateIpAddressLimitExceeded"

    with pytest.raises(ClientError) as excinfo:
        create_eni(ec2, world.subnet_id, SecondaryPrivateIpAddressCount=unattached_ipv4_limit())
    assert error_of(excinfo)[0] == "PrivateIpAddressLimitExceeded"
