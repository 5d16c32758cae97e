"""The embedded world has the shape ipamd expects and stays out of the developer's environment."""

from __future__ import annotations

import os
from typing import Any

import pytest

from cloud.embedded import moto_ext
from cloud.embedded.faults import FaultInjector
from cloud.embedded.world import World, start_world
from tests.contract.conftest import NO_RETRIES
from tests.contract.support import describe_eni, prefixes


def test_world_shape(world: World, ec2: Any) -> None:
    """One running instance of the requested type in the subnet, its primary ENI at device index 0
    with DeleteOnTermination (as RunInstances sets it), in the world's security group."""
    instance = ec2.describe_instances(InstanceIds=[world.instance_id])["Reservations"][0][
        "Instances"
    ][0]
    primary = describe_eni(ec2, world.primary_eni_id)

    assert instance["InstanceType"] == world.instance_type == "m5.large"
    assert instance["State"]["Name"] == "running"
    assert instance["SubnetId"] == world.subnet_id
    assert primary["Attachment"]["DeviceIndex"] == 0
    assert primary["Attachment"]["DeleteOnTermination"] is True
    assert primary["SubnetId"] == world.subnet_id
    assert [g["GroupId"] for g in primary["Groups"]] == [world.security_group_id]
    assert world.endpoint_url is None
    assert world.backend().enis[world.primary_eni_id].id == world.primary_eni_id


def test_each_world_starts_empty(make_world: Any) -> None:
    first = make_world()
    first.client(NO_RETRIES).create_network_interface(SubnetId=first.subnet_id)
    second = make_world()

    enis = second.client(NO_RETRIES).describe_network_interfaces()["NetworkInterfaces"]
    assert [e["NetworkInterfaceId"] for e in enis] == [second.primary_eni_id]


def test_server_world_with_faults() -> None:
    """The loopback-server transport carries the extension and the fault hooks alike."""
    with start_world("t3.small", transport="server") as world:
        assert world.endpoint_url is not None
        assert world.endpoint_url.startswith("http://127.0.0.1:")
        ec2 = world.client(NO_RETRIES)
        faults = FaultInjector()
        faults.attach(ec2)
        faults.partial_failure("AssignPrivateIpAddresses", as_timeout=False, times=1)

        with pytest.raises(Exception, match="InternalError"):
            ec2.assign_private_ip_addresses(
                NetworkInterfaceId=world.primary_eni_id, Ipv4PrefixCount=1
            )
        assert len(prefixes(ec2, world.primary_eni_id)) == 1


def test_clients_ignore_the_developers_aws_settings(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A developer's profile, keys and endpoint override neither reach nor redirect our clients, and
    the world writes no AWS variable into the environment."""
    monkeypatch.setenv("AWS_PROFILE", "production-do-not-touch")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    before = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}

    ec2 = world.client(NO_RETRIES)
    ec2.describe_vpcs(VpcIds=[world.vpc_id])

    assert ec2.meta.endpoint_url == "https://ec2.us-west-2.amazonaws.com"
    assert {k: v for k, v in os.environ.items() if k.startswith("AWS_")} == before


def test_install_is_idempotent() -> None:
    moto_ext.install()
    moto_ext.install()
    assert moto_ext.installed()
