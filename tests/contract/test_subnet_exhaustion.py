"""A subnet that cannot supply what is asked: EC2 answers with an error (moto alone loops forever)."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

import pytest
from botocore.exceptions import ClientError

from cloud.embedded.world import World
from tests.contract.conftest import NO_RETRIES
from tests.contract.support import (
    all_addresses,
    attach,
    available_count,
    create_eni,
    error_of,
    prefixes,
)


def test_secondary_addresses_exhaust_a_small_subnet(make_world: Callable[..., World]) -> None:
    """EC2 API reference, error codes: InsufficientFreeAddressesInSubnet — the subnet does not have
    enough free addresses for AssignPrivateIpAddresses or CreateNetworkInterface. A /28 offers 11
    addresses (16 less the 5 reserved); the instance's primary takes one."""
    world = make_world(instance_type="c5.18xlarge", subnet_cidr="10.0.7.0/28")
    ec2 = world.client(NO_RETRIES)
    assert available_count(ec2, world.subnet_id) == 10

    with pytest.raises(ClientError) as excinfo:
        ec2.assign_private_ip_addresses(
            NetworkInterfaceId=world.primary_eni_id, SecondaryPrivateIpAddressCount=11
        )
    assert error_of(excinfo)[0] == "InsufficientFreeAddressesInSubnet"
    assert len(all_addresses(ec2, world.primary_eni_id)) == 1  # all or nothing

    ec2.assign_private_ip_addresses(
        NetworkInterfaceId=world.primary_eni_id, SecondaryPrivateIpAddressCount=10
    )
    assert available_count(ec2, world.subnet_id) == 0
    for call in (
        lambda: ec2.assign_private_ip_addresses(
            NetworkInterfaceId=world.primary_eni_id, SecondaryPrivateIpAddressCount=1
        ),
        lambda: create_eni(ec2, world.subnet_id),
    ):
        with pytest.raises(ClientError) as excinfo:
            call()
        assert error_of(excinfo)[0] == "InsufficientFreeAddressesInSubnet"


def test_addresses_are_freed_for_reuse(make_world: Callable[..., World]) -> None:
    """EC2 API reference, UnassignPrivateIpAddresses and DeleteNetworkInterface: released addresses
    return to the subnet and can be assigned again."""
    world = make_world(instance_type="c5.18xlarge", subnet_cidr="10.0.7.0/28")
    ec2 = world.client(NO_RETRIES)
    eni = create_eni(ec2, world.subnet_id, SecondaryPrivateIpAddressCount=4)
    ec2.assign_private_ip_addresses(
        NetworkInterfaceId=world.primary_eni_id, SecondaryPrivateIpAddressCount=5
    )
    assert available_count(ec2, world.subnet_id) == 0

    ec2.delete_network_interface(NetworkInterfaceId=eni)
    assert available_count(ec2, world.subnet_id) == 5
    ec2.assign_private_ip_addresses(
        NetworkInterfaceId=world.primary_eni_id, SecondaryPrivateIpAddressCount=5
    )
    assert available_count(ec2, world.subnet_id) == 0


def test_no_aligned_block_in_a_small_subnet(make_world: Callable[..., World]) -> None:
    """EC2 API reference, error codes: InsufficientCidrBlocks — no free aligned /28 is left for
    Ipv4PrefixCount. In a /27 both /28 blocks hold reserved addresses (.0-.3 and the last), so
    none can be delegated even though addresses are free."""
    world = make_world(subnet_cidr="10.0.7.0/27")
    ec2 = world.client(NO_RETRIES)

    for call in (
        lambda: ec2.assign_private_ip_addresses(
            NetworkInterfaceId=world.primary_eni_id, Ipv4PrefixCount=1
        ),
        lambda: create_eni(ec2, world.subnet_id, Ipv4PrefixCount=1),
    ):
        with pytest.raises(ClientError) as excinfo:
            call()
        assert error_of(excinfo)[0] == "InsufficientCidrBlocks"
    ec2.assign_private_ip_addresses(
        NetworkInterfaceId=world.primary_eni_id, SecondaryPrivateIpAddressCount=1
    )


def test_prefixes_exhaust_when_every_block_is_taken_or_fragmented(
    make_world: Callable[..., World],
) -> None:
    """EC2 API reference, error codes: InsufficientCidrBlocks. A /24 has 14 eligible /28 blocks;
    secondary addresses scattered over it fragment them. Delegation goes on until no block is free,
    then fails, while free single addresses may remain (fragmentation)."""
    world = make_world(instance_type="c5.18xlarge", subnet_cidr="10.0.9.0/24")
    ec2 = world.client(NO_RETRIES)
    helper = create_eni(ec2, world.subnet_id, SecondaryPrivateIpAddressCount=6)
    attach(ec2, helper, world.instance_id, 1)

    delegated: list[str] = []
    with pytest.raises(ClientError) as excinfo:
        for _ in range(15):
            answer = ec2.assign_private_ip_addresses(
                NetworkInterfaceId=world.primary_eni_id, Ipv4PrefixCount=1
            )
            delegated += [p["Ipv4Prefix"] for p in answer["AssignedIpv4Prefixes"]]
    assert error_of(excinfo)[0] == "InsufficientCidrBlocks"

    used = {
        ipaddress.IPv4Address(a)
        for eni in (world.primary_eni_id, helper)
        for a in all_addresses(ec2, eni)
    }
    taken = {ipaddress.IPv4Network(p) for p in delegated}
    free_blocks = [
        block
        for block in list(ipaddress.IPv4Network(world.subnet_cidr).subnets(new_prefix=28))[1:-1]
        if block not in taken and not any(a in block for a in used)
    ]
    assert free_blocks == []
    assert sorted(prefixes(ec2, world.primary_eni_id)) == sorted(delegated)
    assert available_count(ec2, world.subnet_id) == 251 - len(used) - 16 * len(delegated)
