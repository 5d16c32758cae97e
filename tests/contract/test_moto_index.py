"""The indexes over moto's state (`cloud.embedded.moto_index`) find exactly what moto's own scans
find, in the same order, through creates, attaches, detaches, deletes and a termination."""

from __future__ import annotations

from typing import Any

import pytest
from moto.ec2.exceptions import (
    InvalidInstanceIdError,
    InvalidNetworkAttachmentIdError,
    InvalidNetworkInterfaceIdError,
)

from cloud.embedded import moto_index
from cloud.embedded.world import IMAGE_ID, World
from tests.contract.conftest import NO_RETRIES


def _scan_subnet(backend: Any, subnet_id: str) -> list[str]:
    return [e.id for e in list(backend.enis.values()) if e.subnet.id == subnet_id]


def _scan_available(backend: Any) -> list[str]:
    return [e.id for e in list(backend.enis.values()) if e.status == "available"]


def _agree(backend: Any, subnet_ids: list[str]) -> None:
    assert isinstance(backend.enis, moto_index.EniTable)
    for subnet_id in subnet_ids:
        subnet = backend.get_subnet(subnet_id)
        assert [e.id for e in moto_index.subnet_enis(subnet)] == _scan_subnet(backend, subnet_id)
    assert [e.id for e in moto_index.available_enis(backend)] == _scan_available(backend)


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
    _agree(backend, subnets)
    assert moto_index.attached_eni(backend, attachment) is None
    assert [e.id for e in moto_index.available_enis(backend)] == made  # back in its place
    ec2.delete_network_interface(NetworkInterfaceId=made[1])
    _agree(backend, subnets)

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
    with pytest.raises(InvalidNetworkInterfaceIdError, match="eni-00000000000000000"):
        backend.get_network_interface("eni-00000000000000000")
    with pytest.raises(InvalidInstanceIdError, match="i-00000000000000000"):
        backend.get_instance("i-00000000000000000")
