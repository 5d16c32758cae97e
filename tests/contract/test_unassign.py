"""UnassignPrivateIpAddresses of what the ENI does not hold."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from cloud.embedded.world import World
from tests.contract.support import describe_eni, error_of, prefixes, secondaries


def test_unassigning_an_address_the_eni_lacks(world: World, ec2: Any) -> None:
    """EC2 API reference, UnassignPrivateIpAddresses: an address not assigned to the interface is an
    InvalidParameterValue ("Some of the specified addresses are not assigned to interface ..."), and
    nothing is unassigned, not even the addresses that were."""
    ec2.assign_private_ip_addresses(
        NetworkInterfaceId=world.primary_eni_id, SecondaryPrivateIpAddressCount=2
    )
    held = secondaries(ec2, world.primary_eni_id)

    with pytest.raises(ClientError) as excinfo:
        ec2.unassign_private_ip_addresses(
            NetworkInterfaceId=world.primary_eni_id, PrivateIpAddresses=[held[0], "10.0.200.200"]
        )
    assert error_of(excinfo) == (
        "InvalidParameterValue",
        f"Some of the specified addresses are not assigned to interface {world.primary_eni_id}",
    )
    assert sorted(secondaries(ec2, world.primary_eni_id)) == sorted(held)


def test_unassigning_a_prefix_the_eni_lacks(world: World, ec2: Any) -> None:
    """EC2 API reference, UnassignPrivateIpAddresses (Ipv4Prefixes): a prefix not delegated to the
    interface is refused the same way, and the interface keeps its prefixes."""
    answer = ec2.assign_private_ip_addresses(
        NetworkInterfaceId=world.primary_eni_id, Ipv4PrefixCount=1
    )
    held = answer["AssignedIpv4Prefixes"][0]["Ipv4Prefix"]
    other = "10.0.250.0/28" if held != "10.0.250.0/28" else "10.0.251.0/28"

    with pytest.raises(ClientError) as excinfo:
        ec2.unassign_private_ip_addresses(
            NetworkInterfaceId=world.primary_eni_id, Ipv4Prefixes=[held, other]
        )
    code, message = error_of(excinfo)
    assert code == "InvalidParameterValue"
    assert message.startswith("Some of the specified addresses are not assigned to interface")
    assert prefixes(ec2, world.primary_eni_id) == [held]


def test_the_primary_address_cannot_be_unassigned(world: World, ec2: Any) -> None:
    """EC2 API reference, UnassignPrivateIpAddresses: the primary private address of an interface
    cannot be unassigned (InvalidParameterValue)."""
    primary = describe_eni(ec2, world.primary_eni_id)["PrivateIpAddress"]

    with pytest.raises(ClientError) as excinfo:
        ec2.unassign_private_ip_addresses(
            NetworkInterfaceId=world.primary_eni_id, PrivateIpAddresses=[primary]
        )
    assert error_of(excinfo)[0] == "InvalidParameterValue"
    assert describe_eni(ec2, world.primary_eni_id)["PrivateIpAddress"] == primary
