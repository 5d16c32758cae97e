"""Private addresses are unique across every ENI of a subnet; EC2's reserved addresses are never handed
out; addresses outside the subnet are refused."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from botocore.exceptions import ClientError

from cloud.embedded.world import World
from tests.contract.conftest import NO_RETRIES
from tests.contract.support import (
    all_addresses,
    attach,
    available_count,
    create_eni,
    describe_eni,
    error_of,
    reserved_addresses,
    secondaries,
)


def test_unique_across_enis_drawing_many_addresses(make_world: Callable[..., World]) -> None:
    """EC2 User Guide, "IP addressing for your VPCs and subnets": a private IPv4 address belongs to
    one network interface at a time in its subnet. Three ENIs drawing 49 addresses each from a /24
    (251 usable) get 150 distinct addresses, all inside the subnet, none reserved, and the subnet's
    AvailableIpAddressCount drops by exactly as many."""
    world = make_world(instance_type="c5.18xlarge", subnet_cidr="10.0.5.0/24")
    ec2 = world.client(NO_RETRIES)
    enis = [world.primary_eni_id]
    for index in (1, 2):
        eni = create_eni(ec2, world.subnet_id)
        attach(ec2, eni, world.instance_id, index)
        enis.append(eni)
    for _ in range(7):
        for eni in enis:
            ec2.assign_private_ip_addresses(
                NetworkInterfaceId=eni, SecondaryPrivateIpAddressCount=7
            )

    addresses = [a for eni in enis for a in all_addresses(ec2, eni)]
    subnet = ipaddress.IPv4Network(world.subnet_cidr)
    assert len(addresses) == 150
    assert len(set(addresses)) == 150
    assert all(ipaddress.IPv4Address(a) in subnet for a in addresses)
    assert not set(addresses) & reserved_addresses(world.subnet_cidr)
    assert available_count(ec2, world.subnet_id) == 251 - 150


def test_reserved_addresses_never_handed_out(make_world: Callable[..., World]) -> None:
    """EC2 User Guide, "Subnet CIDR blocks": the first four and the last address of every subnet are
    reserved and cannot be assigned. Filling a /28 hands out exactly the other 11."""
    world = make_world(instance_type="c5.18xlarge", subnet_cidr="10.0.7.16/28")
    ec2 = world.client(NO_RETRIES)
    ec2.assign_private_ip_addresses(
        NetworkInterfaceId=world.primary_eni_id, SecondaryPrivateIpAddressCount=10
    )

    handed_out = set(all_addresses(ec2, world.primary_eni_id))
    every = {str(a) for a in ipaddress.IPv4Network(world.subnet_cidr)}
    assert handed_out == every - reserved_addresses(world.subnet_cidr)


@pytest.mark.parametrize(
    "address", ["10.0.0.0", "10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.255.255"]
)
def test_named_reserved_address_is_refused(world: World, ec2: Any, address: str) -> None:
    """EC2 User Guide, "Subnet CIDR blocks" (reserved addresses); EC2 API reference,
    AssignPrivateIpAddresses: naming one is an InvalidParameterValue."""
    with pytest.raises(ClientError) as excinfo:
        ec2.assign_private_ip_addresses(
            NetworkInterfaceId=world.primary_eni_id, PrivateIpAddresses=[address]
        )
    assert error_of(excinfo)[0] == "InvalidParameterValue"


def test_address_outside_the_subnet_is_refused(world: World, ec2: Any) -> None:
    """EC2 API reference, AssignPrivateIpAddresses and CreateNetworkInterface: an address outside the
    subnet's CIDR block is an InvalidParameterValue."""
    with pytest.raises(ClientError) as excinfo:
        ec2.assign_private_ip_addresses(
            NetworkInterfaceId=world.primary_eni_id, PrivateIpAddresses=["10.1.0.9"]
        )
    assert error_of(excinfo)[0] == "InvalidParameterValue"
    with pytest.raises(ClientError) as excinfo:
        create_eni(ec2, world.subnet_id, PrivateIpAddress="192.168.0.9")
    assert error_of(excinfo)[0] == "InvalidParameterValue"


def test_named_address_in_use_elsewhere_is_refused(world: World, ec2: Any) -> None:
    """EC2 API reference, error codes: InvalidIPAddress.InUse — the address is already used by
    another ENI of the subnet (as its primary or a secondary)."""
    ec2.assign_private_ip_addresses(
        NetworkInterfaceId=world.primary_eni_id, SecondaryPrivateIpAddressCount=1
    )
    primary = describe_eni(ec2, world.primary_eni_id)["PrivateIpAddress"]
    secondary = secondaries(ec2, world.primary_eni_id)[0]
    other = create_eni(ec2, world.subnet_id)

    for address in (primary, secondary):
        with pytest.raises(ClientError) as excinfo:
            ec2.assign_private_ip_addresses(NetworkInterfaceId=other, PrivateIpAddresses=[address])
        assert error_of(excinfo)[0] == "InvalidIPAddress.InUse"
        with pytest.raises(ClientError) as excinfo:
            create_eni(ec2, world.subnet_id, PrivateIpAddress=address)
        assert error_of(excinfo)[0] == "InvalidIPAddress.InUse"


def test_allow_reassignment_moves_a_secondary(world: World, ec2: Any) -> None:
    """EC2 API reference, AssignPrivateIpAddresses (AllowReassignment): a secondary address of
    another ENI in the subnet moves to this one."""
    ec2.assign_private_ip_addresses(
        NetworkInterfaceId=world.primary_eni_id, SecondaryPrivateIpAddressCount=1
    )
    moving = secondaries(ec2, world.primary_eni_id)[0]
    other = create_eni(ec2, world.subnet_id)

    answer = ec2.assign_private_ip_addresses(
        NetworkInterfaceId=other, PrivateIpAddresses=[moving], AllowReassignment=True
    )

    assert answer["AssignedPrivateIpAddresses"] == [{"PrivateIpAddress": moving}]
    assert secondaries(ec2, other) == [moving]
    assert secondaries(ec2, world.primary_eni_id) == []


def test_instance_primaries_avoid_addresses_in_use(make_world: Callable[..., World]) -> None:
    """EC2 API reference, RunInstances: an instance's primary address is a free address of the
    subnet; in a /28 whose other addresses are all assigned, the next launch cannot get one."""
    world = make_world(instance_type="c5.18xlarge", subnet_cidr="10.0.7.0/28")
    ec2 = world.client(NO_RETRIES)
    ec2.assign_private_ip_addresses(
        NetworkInterfaceId=world.primary_eni_id, SecondaryPrivateIpAddressCount=9
    )
    free = (
        {str(a) for a in ipaddress.IPv4Network(world.subnet_cidr)}
        - reserved_addresses(world.subnet_cidr)
    ) - set(all_addresses(ec2, world.primary_eni_id))

    launched = ec2.run_instances(
        ImageId="ami-12c6146b", MinCount=1, MaxCount=1, SubnetId=world.subnet_id
    )
    assert launched["Instances"][0]["PrivateIpAddress"] in free
    with pytest.raises(ClientError) as excinfo:
        ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1, SubnetId=world.subnet_id)
    assert error_of(excinfo)[0] == "InsufficientFreeAddressesInSubnet"


def test_unique_under_concurrent_callers(make_world: Callable[..., World]) -> None:
    """EC2 serialises assignments: callers on several threads (as ipamd's worker threads are) still
    never receive the same address twice."""
    world = make_world(instance_type="c5.18xlarge", subnet_cidr="10.0.6.0/24")
    ec2 = world.client(NO_RETRIES)
    enis = [world.primary_eni_id] + [create_eni(ec2, world.subnet_id) for _ in range(2)]

    def grab(eni: str) -> list[str]:
        client = world.client(NO_RETRIES)
        got: list[str] = []
        for _ in range(8):
            answer = client.assign_private_ip_addresses(
                NetworkInterfaceId=eni, SecondaryPrivateIpAddressCount=3
            )
            got += [a["PrivateIpAddress"] for a in answer["AssignedPrivateIpAddresses"]]
        return got

    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(grab, enis * 2))

    handed_out = [a for got in results for a in got]
    assert len(handed_out) == 144
    assert len(set(handed_out) | {a for eni in enis for a in all_addresses(ec2, eni)}) == 147
