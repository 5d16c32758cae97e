"""/28 IPv4 prefix delegation on ENIs, as EC2 documents it and moto (alone) lacks."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
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
    prefixes,
    reserved_addresses,
)


def test_assign_describe_unassign_round_trip(world: World, ec2: Any) -> None:
    """EC2 API reference, AssignPrivateIpAddresses / DescribeNetworkInterfaces /
    UnassignPrivateIpAddresses: Ipv4PrefixCount delegates that many /28 prefixes to the ENI, the answer
    lists them in AssignedIpv4Prefixes (and nothing else), Describe shows them in Ipv4Prefixes, and
    Unassign with Ipv4Prefixes takes them back."""
    answer = ec2.assign_private_ip_addresses(
        NetworkInterfaceId=world.primary_eni_id, Ipv4PrefixCount=2
    )
    assigned = [p["Ipv4Prefix"] for p in answer["AssignedIpv4Prefixes"]]

    assert len(assigned) == 2
    assert answer["AssignedPrivateIpAddresses"] == []
    assert all(ipaddress.IPv4Network(p).prefixlen == 28 for p in assigned)
    assert sorted(prefixes(ec2, world.primary_eni_id)) == sorted(assigned)

    ec2.unassign_private_ip_addresses(
        NetworkInterfaceId=world.primary_eni_id, Ipv4Prefixes=assigned[:1]
    )
    assert prefixes(ec2, world.primary_eni_id) == assigned[1:]


def test_named_prefix_is_delegated_and_counts_sixteen_addresses(world: World, ec2: Any) -> None:
    """EC2 API reference, AssignPrivateIpAddresses (Ipv4Prefixes) and DescribeSubnets
    (AvailableIpAddressCount): a named free /28 is delegated as named, and the subnet has 16 fewer
    available addresses while it is."""
    before = available_count(ec2, world.subnet_id)
    taken = {ipaddress.IPv4Address(a) for a in all_addresses(ec2, world.primary_eni_id)}
    prefix = next(
        str(block)
        for block in ipaddress.IPv4Network(world.subnet_cidr).subnets(new_prefix=28)
        if block.network_address.packed[-1] != 0 and not any(a in block for a in taken)
    )

    answer = ec2.assign_private_ip_addresses(
        NetworkInterfaceId=world.primary_eni_id, Ipv4Prefixes=[prefix]
    )

    assert answer["AssignedIpv4Prefixes"] == [{"Ipv4Prefix": prefix}]
    assert available_count(ec2, world.subnet_id) == before - 16
    ec2.unassign_private_ip_addresses(
        NetworkInterfaceId=world.primary_eni_id, Ipv4Prefixes=[prefix]
    )
    assert available_count(ec2, world.subnet_id) == before


def test_prefixes_are_aligned_disjoint_and_avoid_used_and_reserved_addresses(
    make_world: Callable[..., World],
) -> None:
    """EC2 User Guide, "Assign prefixes to network interfaces": a delegated prefix is an aligned /28
    block of the subnet that holds no address in use (primary or secondary, on any ENI) and no
    reserved address; two delegated prefixes never overlap; and addresses assigned later never fall
    inside a delegated prefix. A /24 has 14 eligible blocks (the first holds .0-.3, the last .255);
    the 6 delegated here leave 251 - 96 = 155 addresses, of which 60 more are drawn afterwards."""
    world = make_world(instance_type="c5.18xlarge", subnet_cidr="10.0.3.0/24")
    ec2 = world.client(NO_RETRIES)
    enis = [world.primary_eni_id]
    for index in (1, 2):
        eni = create_eni(ec2, world.subnet_id, SecondaryPrivateIpAddressCount=2)
        attach(ec2, eni, world.instance_id, index)
        enis.append(eni)
    delegated: list[str] = []
    for eni in enis:
        answer = ec2.assign_private_ip_addresses(NetworkInterfaceId=eni, Ipv4PrefixCount=2)
        delegated += [p["Ipv4Prefix"] for p in answer["AssignedIpv4Prefixes"]]
    for eni in enis:
        ec2.assign_private_ip_addresses(NetworkInterfaceId=eni, SecondaryPrivateIpAddressCount=20)

    blocks = [ipaddress.IPv4Network(p) for p in delegated]
    addresses = [ipaddress.IPv4Address(a) for eni in enis for a in all_addresses(ec2, eni)]
    reserved = [ipaddress.IPv4Address(a) for a in reserved_addresses(world.subnet_cidr)]
    subnet = ipaddress.IPv4Network(world.subnet_cidr)
    assert len(blocks) == 6
    assert all(b.prefixlen == 28 and b.subnet_of(subnet) for b in blocks)  # strict: aligned
    assert all(not a.overlaps(b) for i, a in enumerate(blocks) for b in blocks[i + 1 :])
    assert not any(a in b for a in addresses + reserved for b in blocks)


def test_prefixes_on_create(world: World, ec2: Any) -> None:
    """EC2 API reference, CreateNetworkInterface: Ipv4PrefixCount (or Ipv4Prefixes) delegates /28
    prefixes to the new ENI, shown in the answer and by Describe; the two parameters exclude each
    other."""
    eni = ec2.create_network_interface(SubnetId=world.subnet_id, Ipv4PrefixCount=3)[
        "NetworkInterface"
    ]
    created = [p["Ipv4Prefix"] for p in eni["Ipv4Prefixes"]]

    assert len(created) == 3
    assert sorted(prefixes(ec2, eni["NetworkInterfaceId"])) == sorted(created)
    primary = ipaddress.IPv4Address(eni["PrivateIpAddress"])
    assert not any(primary in ipaddress.IPv4Network(p) for p in created)

    with pytest.raises(ClientError) as excinfo:
        ec2.create_network_interface(
            SubnetId=world.subnet_id, Ipv4PrefixCount=1, Ipv4Prefixes=[{"Ipv4Prefix": created[0]}]
        )
    assert error_of(excinfo)[0] == "InvalidParameterCombination"


@pytest.mark.parametrize(
    "prefix",
    ["10.0.0.8/28", "10.0.0.0/28", "10.0.0.16/27", "10.1.0.16/28"],
    ids=["unaligned", "holds-reserved", "not-28", "outside-subnet"],
)
def test_unusable_named_prefix_is_refused(world: World, ec2: Any, prefix: str) -> None:
    """EC2 API reference, AssignPrivateIpAddresses (Ipv4Prefixes): a named prefix must be a /28 of
    the subnet that holds no reserved address; anything else is an InvalidParameterValue."""
    with pytest.raises(ClientError) as excinfo:
        ec2.assign_private_ip_addresses(
            NetworkInterfaceId=world.primary_eni_id, Ipv4Prefixes=[prefix]
        )
    assert error_of(excinfo)[0] == "InvalidParameterValue"
    assert describe_eni(ec2, world.primary_eni_id).get("Ipv4Prefixes", []) == []


def test_named_prefix_overlapping_a_used_address_is_refused(world: World, ec2: Any) -> None:
    """EC2 User Guide, "Assign prefixes to network interfaces": a prefix cannot include an address
    already in use in the subnet; nor can another ENI take a delegated prefix."""
    primary = ipaddress.IPv4Address(describe_eni(ec2, world.primary_eni_id)["PrivateIpAddress"])
    around_primary = str(ipaddress.IPv4Network(f"{primary}/28", strict=False))
    other = create_eni(ec2, world.subnet_id)

    with pytest.raises(ClientError) as excinfo:
        ec2.assign_private_ip_addresses(NetworkInterfaceId=other, Ipv4Prefixes=[around_primary])
    assert error_of(excinfo)[0] == "InvalidParameterValue"

    answer = ec2.assign_private_ip_addresses(
        NetworkInterfaceId=world.primary_eni_id, Ipv4PrefixCount=1
    )
    taken = answer["AssignedIpv4Prefixes"][0]["Ipv4Prefix"]
    with pytest.raises(ClientError) as excinfo:
        ec2.assign_private_ip_addresses(NetworkInterfaceId=other, Ipv4Prefixes=[taken])
    assert error_of(excinfo)[0] == "InvalidParameterValue"
