"""Deleting, detaching and terminating: InUse, DeleteOnTermination, and the primary ENI."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from cloud.embedded.world import World
from tests.contract.support import attach, create_eni, describe_eni, error_of


def test_deleting_an_attached_eni_is_in_use(world: World, ec2: Any) -> None:
    """EC2 API reference, DeleteNetworkInterface and error codes: an attached interface cannot be
    deleted (InvalidNetworkInterface.InUse); once detached it can."""
    eni = create_eni(ec2, world.subnet_id)
    attachment = attach(ec2, eni, world.instance_id, 1)

    with pytest.raises(ClientError) as excinfo:
        ec2.delete_network_interface(NetworkInterfaceId=eni)
    assert error_of(excinfo)[0] == "InvalidNetworkInterface.InUse"
    assert describe_eni(ec2, eni)["Status"] == "in-use"

    ec2.detach_network_interface(AttachmentId=attachment)
    ec2.delete_network_interface(NetworkInterfaceId=eni)
    with pytest.raises(ClientError) as excinfo:
        describe_eni(ec2, eni)
    assert error_of(excinfo)[0] == "InvalidNetworkInterfaceID.NotFound"


def test_delete_on_termination_is_kept(world: World, ec2: Any) -> None:
    """EC2 API reference, ModifyNetworkInterfaceAttribute (Attachment.DeleteOnTermination) and
    DescribeNetworkInterfaces (Attachment.DeleteOnTermination); EC2 User Guide: an interface attached
    with AttachNetworkInterface starts with DeleteOnTermination false."""
    eni = create_eni(ec2, world.subnet_id)
    attachment = attach(ec2, eni, world.instance_id, 1)
    assert describe_eni(ec2, eni)["Attachment"]["DeleteOnTermination"] is False

    ec2.modify_network_interface_attribute(
        NetworkInterfaceId=eni, Attachment={"AttachmentId": attachment, "DeleteOnTermination": True}
    )
    assert describe_eni(ec2, eni)["Attachment"]["DeleteOnTermination"] is True

    with pytest.raises(ClientError) as excinfo:
        ec2.modify_network_interface_attribute(
            NetworkInterfaceId=eni,
            Attachment={
                "AttachmentId": "eni-attach-0123456789abcdef0",
                "DeleteOnTermination": False,
            },
        )
    assert error_of(excinfo)[0] == "InvalidAttachmentID.NotFound"


def test_termination_deletes_or_detaches_by_delete_on_termination(world: World, ec2: Any) -> None:
    """EC2 User Guide, "Network interfaces" (delete on termination): when the instance terminates,
    interfaces with DeleteOnTermination are deleted; the others are detached and stay available."""
    kept = create_eni(ec2, world.subnet_id)
    attach(ec2, kept, world.instance_id, 1)
    dropped = create_eni(ec2, world.subnet_id)
    attachment = attach(ec2, dropped, world.instance_id, 2)
    ec2.modify_network_interface_attribute(
        NetworkInterfaceId=dropped,
        Attachment={"AttachmentId": attachment, "DeleteOnTermination": True},
    )

    ec2.terminate_instances(InstanceIds=[world.instance_id])

    remaining = {
        e["NetworkInterfaceId"]: e for e in ec2.describe_network_interfaces()["NetworkInterfaces"]
    }
    assert dropped not in remaining
    assert world.primary_eni_id not in remaining  # RunInstances set DeleteOnTermination on it
    assert remaining[kept]["Status"] == "available"
    assert "Attachment" not in remaining[kept]
    ec2.delete_network_interface(NetworkInterfaceId=kept)


def test_the_primary_eni_cannot_be_detached(world: World, ec2: Any) -> None:
    """EC2 User Guide, "Network interfaces": the primary network interface (device index 0) cannot
    be detached from its instance (OperationNotPermitted), even when others are attached."""
    attach(ec2, create_eni(ec2, world.subnet_id), world.instance_id, 1)
    attachment = describe_eni(ec2, world.primary_eni_id)["Attachment"]["AttachmentId"]

    with pytest.raises(ClientError) as excinfo:
        ec2.detach_network_interface(AttachmentId=attachment)
    assert error_of(excinfo)[0] == "OperationNotPermitted"
