"""The indexes over moto's state (`cloud.embedded.moto_index`) find exactly what moto's own scans
find, in the same order, through creates, attaches, detaches, deletes, assigns, unassigns and a
termination; so does a subnet's space read through them (and kept between changes,
`cloud.embedded.space_watch`)."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

import pytest
from moto.ec2.exceptions import (
    InvalidInstanceIdError,
    InvalidNetworkAttachmentIdError,
    InvalidNetworkInterfaceIdError,
)

from cloud.embedded import eni_rules, moto_index
from cloud.embedded.world import IMAGE_ID, World
from tests.contract.conftest import NO_RETRIES


def _scan_subnet(backend: Any, subnet_id: str) -> list[str]:
    return [e.id for e in list(backend.enis.values()) if e.subnet.id == subnet_id]


def _scan_available(backend: Any) -> list[str]:
    return [e.id for e in list(backend.enis.values()) if e.status == "available"]


def _scan_attached(backend: Any, attachment_id: str) -> Any:
    return next((e for e in list(backend.enis.values()) if e.attachment_id == attachment_id), None)


def _scan_occupied(backend: Any, subnet_id: str) -> set[int]:
    """Every address in use in the subnet, from a scan of all ENIs, parsed afresh."""
    subnet = backend.get_subnet(subnet_id)
    occupied = {int(ipaddress.IPv4Address(a)) for a in subnet._subnet_ips}
    for eni in list(backend.enis.values()):
        if eni.subnet.id != subnet_id:
            continue
        occupied |= {
            int(ipaddress.IPv4Address(e["PrivateIpAddress"])) for e in eni.private_ip_addresses
        }
        for prefix in eni_rules.eni_prefixes(eni):
            occupied |= {int(a) for a in ipaddress.IPv4Network(prefix)}
    return occupied


def _agree(backend: Any, subnet_ids: list[str], attachments: Iterable[str] = ()) -> None:
    assert isinstance(backend.enis, moto_index.EniTable)
    for subnet_id in subnet_ids:
        subnet = backend.get_subnet(subnet_id)
        assert [e.id for e in moto_index.subnet_enis(subnet)] == _scan_subnet(backend, subnet_id)
        occupied = _scan_occupied(backend, subnet_id)
        space = eni_rules.subnet_space(subnet)
        assert space.occupied == occupied
        free = sum(1 for a in occupied if space.first_usable <= a <= space.last_usable)
        assert eni_rules.subnet_counts(subnet) == (space.usable_count, space.usable_count - free)
    assert [e.id for e in moto_index.available_enis(backend)] == _scan_available(backend)
    current = {e.attachment_id for e in backend.enis.values() if e.attachment_id is not None}
    for attachment_id in {*attachments, *current, "eni-attach-00000000"}:
        assert moto_index.attached_eni(backend, attachment_id) is _scan_attached(
            backend, attachment_id
        )


def test_the_indexes_follow_every_change(world: World) -> None:
    ec2 = world.client(NO_RETRIES)
    backend = world.backend()
    vpc = ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    other = ec2.create_subnet(
        VpcId=vpc, CidrBlock="10.9.0.0/24", AvailabilityZone=world.availability_zone
    )["Subnet"]["SubnetId"]
    subnets = [world.subnet_id, other]

    made = [
        ec2.create_network_interface(SubnetId=s)["NetworkInterface"]["NetworkInterfaceId"]
        for s in (world.subnet_id, other, world.subnet_id, other)
    ]
    _agree(backend, subnets)
    attachment = ec2.attach_network_interface(
        NetworkInterfaceId=made[0], InstanceId=world.instance_id, DeviceIndex=1
    )["AttachmentId"]
    _agree(backend, subnets)
    assert made[0] not in {e.id for e in moto_index.available_enis(backend)}
    assert moto_index.attached_eni(backend, attachment) is backend.enis[made[0]]
    ec2.detach_network_interface(AttachmentId=attachment)
    _agree(backend, subnets, [attachment])
    assert moto_index.attached_eni(backend, attachment) is None
    assert [e.id for e in moto_index.available_enis(backend)] == made  # back in its place
    ec2.assign_private_ip_addresses(NetworkInterfaceId=made[2], SecondaryPrivateIpAddressCount=3)
    ec2.assign_private_ip_addresses(NetworkInterfaceId=made[3], Ipv4PrefixCount=1)
    _agree(backend, subnets, [attachment])
    taken = [a for a in eni_rules.eni_secondaries(backend.enis[made[2]])][:2]
    ec2.unassign_private_ip_addresses(NetworkInterfaceId=made[2], PrivateIpAddresses=taken)
    ec2.unassign_private_ip_addresses(
        NetworkInterfaceId=made[3], Ipv4Prefixes=eni_rules.eni_prefixes(backend.enis[made[3]])
    )
    _agree(backend, subnets, [attachment])
    again = ec2.attach_network_interface(
        NetworkInterfaceId=made[2], InstanceId=world.instance_id, DeviceIndex=1
    )["AttachmentId"]
    _agree(backend, subnets, [attachment, again])
    ec2.detach_network_interface(AttachmentId=again)
    ec2.delete_network_interface(NetworkInterfaceId=made[1])
    _agree(backend, subnets, [attachment, again])

    launched = ec2.run_instances(
        ImageId=IMAGE_ID, InstanceType="m5.large", MinCount=1, MaxCount=1, SubnetId=other
    )["Instances"][0]["InstanceId"]
    _agree(backend, subnets)
    assert backend.get_instance(launched).id == launched
    assert backend.get_instance(world.instance_id).id == world.instance_id
    ec2.terminate_instances(InstanceIds=[launched])
    _agree(backend, subnets)
    assert backend.get_instance(launched).state == "terminated"


def test_lookups_of_unknown_ids_fail_as_moto_does(world: World) -> None:
    backend = world.backend()
    with pytest.raises(InvalidNetworkAttachmentIdError, match="eni-attach-00000000"):
        backend.detach_network_interface("eni-attach-00000000")
    assert moto_index.attached_eni(backend, "eni-attach-00000000") is None
    with pytest.raises(InvalidNetworkInterfaceIdError, match="eni-00000000000000000"):
        backend.get_network_interface("eni-00000000000000000")
    with pytest.raises(InvalidInstanceIdError, match="i-00000000000000000"):
        backend.get_instance("i-00000000000000000")
