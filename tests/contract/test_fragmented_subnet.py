"""A fragmented subnet: plenty of free addresses, no aligned /28 wholly free. EC2 then refuses
prefixes (InsufficientCidrBlocks) but still grants secondary addresses, and delegates a /28 again as
soon as one aligned block is free. `cloud.embedded.fragment` makes such a subnet on purpose."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError

from cloud.embedded.fragment import PARKING_TAG, fragment_subnet, free_blocks
from cloud.embedded.world import World
from cloud.embedded.world_layout import CNI_ROLE_TAG, Layout, SubnetSpec
from tests.contract.conftest import NO_RETRIES
from tests.contract.support import (
    attach,
    available_count,
    create_eni,
    describe_eni,
    error_of,
    prefixes,
    secondaries,
)

POD_SUBNET = "10.0.16.0/24"
"""14 aligned /28 blocks hold no reserved address: the first holds .0-.3, the last .255."""


@pytest.fixture
def world(make_world: Callable[..., World]) -> World:
    layout = Layout(subnets=(SubnetSpec(POD_SUBNET, tags={CNI_ROLE_TAG: "1"}),))
    return make_world(instance_type="c5.18xlarge", subnet_cidr="10.0.0.0/20", layout=layout)


@pytest.fixture
def pod_eni(world: World, ec2: Any) -> str:
    """An ENI of the pod subnet attached to the instance (device index 1), as ipamd would make it;
    its primary in the first block, which holds reserved addresses and is never delegated anyway."""
    eni = create_eni(ec2, world.subnet(POD_SUBNET).subnet_id, PrivateIpAddress="10.0.16.4")
    attach(ec2, eni, world.instance_id, 1)
    return eni


def _refused_prefix(ec2: Any, eni: str) -> None:
    with pytest.raises(ClientError) as excinfo:
        ec2.assign_private_ip_addresses(NetworkInterfaceId=eni, Ipv4PrefixCount=1)
    assert error_of(excinfo)[0] == "InsufficientCidrBlocks"
    assert prefixes(ec2, eni) == []


def test_fragmenting_blocks_every_aligned_block_and_little_else(
    world: World, ec2: Any, pod_eni: str
) -> None:
    """One parked address per free block: 14 blockers on an ENI of their own, tagged as parking and
    attached to nothing, each in a different inner /28; the subnet keeps 251 - 1 - 14 addresses,
    more than the 14 blocks would hold."""
    subnet = world.subnet(POD_SUBNET).subnet_id
    free_before = [str(b) for b in free_blocks(ec2, subnet)]
    assert len(free_before) == 14

    parked = fragment_subnet(ec2, subnet)

    assert free_blocks(ec2, subnet) == []
    assert list(parked.blockers) == free_before
    assert all(
        ipaddress.IPv4Address(a) == ipaddress.IPv4Network(b).network_address + 8
        for b, a in parked.blockers.items()
    )
    assert available_count(ec2, subnet) == 251 - 1 - 14
    assert available_count(ec2, subnet) > 16 * 14
    assert len(parked.eni_ids) == 1
    eni = describe_eni(ec2, parked.eni_ids[0])
    assert eni["Status"] == "available" and "Attachment" not in eni
    assert {t["Key"]: t["Value"] for t in eni["TagSet"]} == {PARKING_TAG: subnet}
    assert sorted(a["PrivateIpAddress"] for a in eni["PrivateIpAddresses"]) == sorted(
        parked.blockers.values()
    )


def test_prefixes_are_refused_while_secondary_addresses_are_granted(
    world: World, ec2: Any, pod_eni: str
) -> None:
    """EC2 API reference, error codes: InsufficientCidrBlocks, "the specified subnet does not have
    enough contiguous free space" — for AssignPrivateIpAddresses and CreateNetworkInterface with
    Ipv4PrefixCount alike, while SecondaryPrivateIpAddressCount is granted from the same subnet."""
    subnet = world.subnet(POD_SUBNET).subnet_id
    fragment_subnet(ec2, subnet)
    before = available_count(ec2, subnet)

    _refused_prefix(ec2, pod_eni)
    with pytest.raises(ClientError) as excinfo:
        create_eni(ec2, subnet, Ipv4PrefixCount=1)
    assert error_of(excinfo)[0] == "InsufficientCidrBlocks"

    ec2.assign_private_ip_addresses(NetworkInterfaceId=pod_eni, SecondaryPrivateIpAddressCount=40)
    assert len(secondaries(ec2, pod_eni)) == 40
    assert available_count(ec2, subnet) == before - 40
    assert prefixes(ec2, pod_eni) == []


def test_scattered_frees_do_not_help_but_one_aligned_block_does(
    world: World, ec2: Any, pod_eni: str
) -> None:
    """16 addresses freed across blocks that stay blocked give no /28; freeing the one address
    that blocks an aligned block does, and that very block is delegated."""
    subnet = world.subnet(POD_SUBNET).subnet_id
    parked = fragment_subnet(ec2, subnet)
    drawn = ec2.assign_private_ip_addresses(
        NetworkInterfaceId=pod_eni, SecondaryPrivateIpAddressCount=16
    )["AssignedPrivateIpAddresses"]
    ec2.unassign_private_ip_addresses(
        NetworkInterfaceId=pod_eni, PrivateIpAddresses=[a["PrivateIpAddress"] for a in drawn]
    )
    _refused_prefix(ec2, pod_eni)

    released = parked.release(ec2, blocks=1)

    assert [str(b) for b in free_blocks(ec2, subnet)] == released
    answer = ec2.assign_private_ip_addresses(NetworkInterfaceId=pod_eni, Ipv4PrefixCount=1)
    assert [p["Ipv4Prefix"] for p in answer["AssignedIpv4Prefixes"]] == released
    assert parked.blocked == [b for b in parked.blockers if b not in released]
    _refused_prefix(ec2, create_eni(ec2, subnet))


def test_some_blocks_can_be_left_free(world: World, ec2: Any, pod_eni: str) -> None:
    """`leave_free_blocks`: the subnet delegates exactly that many more /28s."""
    subnet = world.subnet(POD_SUBNET).subnet_id
    fragment_subnet(ec2, subnet, leave_free_blocks=2)
    assert len(free_blocks(ec2, subnet)) == 2

    answer = ec2.assign_private_ip_addresses(NetworkInterfaceId=pod_eni, Ipv4PrefixCount=2)
    assert len(answer["AssignedIpv4Prefixes"]) == 2
    _refused_prefix(ec2, create_eni(ec2, subnet))


def test_release_and_remove(world: World, ec2: Any, pod_eni: str) -> None:
    """A parking ENI's primary can be freed only with the ENI: 13 of 14 blockers can be released
    one by one, and `remove` gives every block back."""
    subnet = world.subnet(POD_SUBNET).subnet_id
    parked = fragment_subnet(ec2, subnet)
    with pytest.raises(ValueError, match="13 blocks can be released"):
        parked.release(ec2, blocks=14)
    assert free_blocks(ec2, subnet) == []

    assert len(parked.release(ec2, blocks=13)) == 13
    assert len(free_blocks(ec2, subnet)) == 13
    parked.remove(ec2)
    assert len(free_blocks(ec2, subnet)) == 14
    assert parked.blocked == []
    assert available_count(ec2, subnet) == 251 - 1


def test_a_large_subnet_takes_several_parking_enis(make_world: Callable[..., World]) -> None:
    """A /20 (254 inner blocks) needs eight parking ENIs of at most 32 addresses; the node's own
    subnet can be fragmented as well as any other."""
    world = make_world(instance_type="c5.18xlarge", subnet_cidr="10.0.0.0/20")
    ec2 = world.client(NO_RETRIES)
    free = len(free_blocks(ec2, world.subnet_id))
    assert free in (253, 254)  # the instance's primary may lie in an inner block

    parked = fragment_subnet(ec2, world.subnet_id)

    assert len(parked.eni_ids) == 8
    assert len(parked.blockers) == free
    assert free_blocks(ec2, world.subnet_id) == []
    _refused_prefix(ec2, world.primary_eni_id)
    ec2.assign_private_ip_addresses(
        NetworkInterfaceId=world.primary_eni_id, SecondaryPrivateIpAddressCount=10
    )


def test_offset_must_lie_in_a_block(world: World, ec2: Any) -> None:
    with pytest.raises(ValueError, match="offset 16"):
        fragment_subnet(ec2, world.subnet(POD_SUBNET).subnet_id, offset=16)
