"""Every operation of `Boto3Ec2` round-trips against the embedded EC2 (moto with our extension) and
comes back as ipamd's own models; EC2's limits and refusals arrive as typed errors."""

from __future__ import annotations

import ipaddress

import pytest

from cloud.calls import CallLog
from cloud.ec2 import Boto3Ec2
from cloud.errors import (
    AddressLimitExceeded,
    AttachmentLimitExceeded,
    InUse,
    NotFound,
    Rejected,
    SubnetExhausted,
    SubnetFragmented,
)
from cloud.ports import MANAGED_BY, TAG_INSTANCE_ID, TAG_MANAGED_BY
from tests.unit.cloud.conftest import FakeTime, World, Worlds, adapter


async def _attached_eni(ec2: Boto3Ec2, world: World, index: int = 1) -> tuple[str, str]:
    eni = await ec2.create_eni(world.subnet_id, [world.security_group_id], "pods", {"k": "v"})
    attachment_id = await ec2.attach_eni(eni.eni_id, world.instance_id, index)
    return eni.eni_id, attachment_id


async def test_describe_enis_lists_the_primary_eni(ec2: Boto3Ec2, world: World) -> None:
    (primary,) = await ec2.describe_enis(world.instance_id)
    assert primary.eni_id == world.primary_eni_id
    assert primary.is_primary and primary.status == "in-use"
    assert primary.instance_id == world.instance_id and primary.attachment_id
    assert primary.subnet_id == world.subnet_id
    assert ipaddress.ip_address(primary.primary_ip) in ipaddress.ip_network(world.subnet_cidr)
    assert primary.secondary_ips == () and primary.prefixes == ()
    assert primary.mac


async def test_create_eni_carries_tags_description_and_groups(ec2: Boto3Ec2, world: World) -> None:
    tags = {TAG_INSTANCE_ID: world.instance_id, TAG_MANAGED_BY: MANAGED_BY}
    eni = await ec2.create_eni(world.subnet_id, [world.security_group_id], "ipamd pods", tags)
    assert eni.status == "available" and eni.device_index is None and eni.attachment_id is None
    assert dict(eni.tags) == tags
    raw = world.client.describe_network_interfaces(NetworkInterfaceIds=[eni.eni_id])
    (described,) = raw["NetworkInterfaces"]
    assert described["Description"] == "ipamd pods"
    assert [g["GroupId"] for g in described["Groups"]] == [world.security_group_id]


async def test_delete_on_termination_is_its_own_call_and_describe_orders_by_device_index(
    ec2: Boto3Ec2, world: World, calls: CallLog
) -> None:
    second, second_attachment = await _attached_eni(ec2, world, 2)
    first, attachment_id = await _attached_eni(ec2, world, 1)
    enis = await ec2.describe_enis(world.instance_id)
    assert [e.eni_id for e in enis] == [world.primary_eni_id, first, second]
    assert [e.device_index for e in enis] == [0, 1, 2]
    assert enis[1].attachment_id == attachment_id and enis[1].status == "in-use"
    assert dict(enis[1].tags) == {"k": "v"}
    assert not enis[1].delete_on_termination and not enis[2].delete_on_termination
    assert calls.count("ModifyNetworkInterfaceAttribute", "ok") == 0
    await ec2.set_delete_on_termination(first, attachment_id)
    await ec2.set_delete_on_termination(second, second_attachment)
    enis = await ec2.describe_enis(world.instance_id)
    assert enis[1].delete_on_termination and enis[2].delete_on_termination
    assert calls.count("ModifyNetworkInterfaceAttribute", "ok") == 2


async def test_an_eni_created_with_its_units_lists_them(ec2: Boto3Ec2, world: World) -> None:
    """CreateNetworkInterface with SecondaryPrivateIpAddressCount: the answer lists the ENI's new
    addresses, and a describe after the attach shows the same ones."""
    eni = await ec2.create_eni(world.subnet_id, [], "pods", {"k": "v"}, kind="ip", count=4)
    assert len(eni.secondary_ips) == 4 and eni.primary_ip not in eni.secondary_ips
    await ec2.attach_eni(eni.eni_id, world.instance_id, 1)
    (_, attached) = await ec2.describe_enis(world.instance_id)
    assert set(attached.secondary_ips) == set(eni.secondary_ips)


async def test_assign_ips_returns_only_the_new_addresses(ec2: Boto3Ec2, world: World) -> None:
    eni_id, _ = await _attached_eni(ec2, world)
    first = await ec2.assign_units(eni_id, "ip", 3)
    second = await ec2.assign_units(eni_id, "ip", 2)
    assert len(first) == 3 and len(second) == 2
    assert not set(first) & set(second)
    assert all(c.endswith("/32") for c in first + second)
    (eni,) = [e for e in await ec2.describe_enis(world.instance_id) if e.eni_id == eni_id]
    assert set(eni.units("ip")) == set(first) | set(second)
    assert f"{eni.primary_ip}/32" not in first + second


async def test_assign_zero_is_a_no_op(ec2: Boto3Ec2, world: World, calls: CallLog) -> None:
    assert await ec2.assign_units(world.primary_eni_id, "ip", 0) == ()
    assert calls.count() == 0


async def test_unassign_ips_removes_exactly_those(ec2: Boto3Ec2, world: World) -> None:
    eni_id, _ = await _attached_eni(ec2, world)
    assigned = await ec2.assign_units(eni_id, "ip", 4)
    await ec2.unassign_units(eni_id, "ip", assigned[:2])
    (eni,) = [e for e in await ec2.describe_enis(world.instance_id) if e.eni_id == eni_id]
    assert set(eni.units("ip")) == set(assigned[2:])


async def test_unassign_refuses_a_wider_cidr_in_ip_mode(ec2: Boto3Ec2, world: World) -> None:
    with pytest.raises(ValueError, match="single IPv4 address"):
        await ec2.unassign_units(world.primary_eni_id, "ip", ["10.0.0.0/28"])


async def test_detach_then_delete(ec2: Boto3Ec2, world: World) -> None:
    eni_id, attachment_id = await _attached_eni(ec2, world)
    await ec2.detach_eni(attachment_id)
    assert [e.eni_id for e in await ec2.describe_enis(world.instance_id)] == [world.primary_eni_id]
    await ec2.delete_eni(eni_id)
    with pytest.raises(NotFound) as caught:
        await ec2.delete_eni(eni_id)
    assert caught.value.code == "InvalidNetworkInterfaceID.NotFound"
    with pytest.raises(NotFound):
        await ec2.detach_eni(attachment_id)


async def test_find_enis_by_tags_any_status(ec2: Boto3Ec2, world: World) -> None:
    mine = {TAG_INSTANCE_ID: world.instance_id, TAG_MANAGED_BY: MANAGED_BY}
    loose = await ec2.create_eni(world.subnet_id, [], "loose", mine)
    attached = await ec2.create_eni(world.subnet_id, [], "attached", mine)
    await ec2.attach_eni(attached.eni_id, world.instance_id, 1)
    await ec2.create_eni(world.subnet_id, [], "other", {TAG_INSTANCE_ID: "i-someoneelse"})
    await ec2.create_eni(world.subnet_id, [], "untagged", {})
    found = await ec2.find_enis(mine)
    assert {e.eni_id: e.status for e in found} == {
        loose.eni_id: "available",
        attached.eni_id: "in-use",
    }


async def test_find_enis_refuses_an_untagged_scan(ec2: Boto3Ec2, calls: CallLog) -> None:
    with pytest.raises(ValueError, match="at least one tag"):
        await ec2.find_enis({})
    assert calls.count() == 0


async def test_describe_instance(ec2: Boto3Ec2, world: World) -> None:
    instance = await ec2.describe_instance(world.instance_id)
    assert instance.instance_id == world.instance_id
    assert instance.instance_type == world.instance_type
    assert instance.subnet_id == world.subnet_id
    assert instance.security_groups == (world.security_group_id,)
    assert instance.availability_zone.startswith("us-west-2")


async def test_describe_instance_unknown(ec2: Boto3Ec2) -> None:
    with pytest.raises(NotFound):
        await ec2.describe_instance("i-0123456789abcdef0")


async def test_subnet(ec2: Boto3Ec2, world: World) -> None:
    subnet = await ec2.subnet(world.subnet_id)
    assert subnet.subnet_id == world.subnet_id and subnet.cidr == world.subnet_cidr
    assert subnet.vpc_id == world.vpc_id and subnet.availability_zone
    before = subnet.available_ips
    eni_id, _ = await _attached_eni(ec2, world)
    await ec2.assign_units(eni_id, "ip", 5)
    assert (await ec2.subnet(world.subnet_id)).available_ips == before - 6  # the ENI's primary too


async def test_subnet_unknown(ec2: Boto3Ec2) -> None:
    with pytest.raises(NotFound) as caught:
        await ec2.subnet("subnet-0123456789abcdef0")
    assert caught.value.code == "InvalidSubnetID.NotFound"


async def test_instance_limits_from_describe_instance_types_cached(
    ec2: Boto3Ec2, calls: CallLog
) -> None:
    limits = await ec2.instance_limits("t3.medium")
    assert (limits.max_enis, limits.ipv4_per_eni, limits.hypervisor) == (3, 6, "nitro")
    assert (await ec2.instance_limits("c5.18xlarge")).max_enis == 15
    assert await ec2.instance_limits("t3.medium") == limits
    assert calls.count("DescribeInstanceTypes") == 2


async def test_instance_limits_carry_the_vcpus_ec2_reports(ec2: Boto3Ec2) -> None:
    assert (await ec2.instance_limits("m5.large")).vcpus == 2
    assert (await ec2.instance_limits("c5.18xlarge")).vcpus == 72


async def test_instance_limits_unknown_type(ec2: Boto3Ec2) -> None:
    with pytest.raises(Rejected) as caught:
        await ec2.instance_limits("zz9.plural")
    assert caught.value.code == "InvalidInstanceType"


async def test_assign_and_unassign_prefixes(ec2: Boto3Ec2, world: World) -> None:
    eni_id, _ = await _attached_eni(ec2, world)
    first = await ec2.assign_units(eni_id, "prefix", 2)
    second = await ec2.assign_units(eni_id, "prefix", 1)
    assert len(first) == 2 and len(second) == 1 and not set(first) & set(second)
    subnet = ipaddress.ip_network(world.subnet_cidr)
    for cidr in first + second:
        network = ipaddress.ip_network(cidr)
        assert network.prefixlen == 28 and network.subnet_of(subnet)  # type: ignore[arg-type]
    await ec2.unassign_units(eni_id, "prefix", first[:1])
    (eni,) = [e for e in await ec2.describe_enis(world.instance_id) if e.eni_id == eni_id]
    assert set(eni.prefixes) == {first[1], second[0]} and eni.secondary_ips == ()


async def test_address_limit_per_eni(worlds: Worlds, calls: CallLog, fake_time: FakeTime) -> None:
    world = worlds("t3.medium")  # 6 addresses per ENI: the primary and 5 more
    ec2 = adapter(world.client, calls, fake_time)
    assert len(await ec2.assign_units(world.primary_eni_id, "ip", 5)) == 5
    with pytest.raises(AddressLimitExceeded) as caught:
        await ec2.assign_units(world.primary_eni_id, "ip", 1)
    assert caught.value.code == "PrivateIpAddressLimitExceeded"
    assert calls.count("AssignPrivateIpAddresses", "PrivateIpAddressLimitExceeded") == 1
    assert calls.retries == 0


async def test_attachment_limit_per_instance(
    worlds: Worlds, calls: CallLog, fake_time: FakeTime
) -> None:
    world = worlds("t3.medium")  # 3 ENIs
    ec2 = adapter(world.client, calls, fake_time)
    for index in (1, 2):
        await _attached_eni(ec2, world, index)
    extra = await ec2.create_eni(world.subnet_id, [], "one too many", {"k": "v"})
    with pytest.raises(AttachmentLimitExceeded):
        await ec2.attach_eni(extra.eni_id, world.instance_id, 3)
    assert len(await ec2.describe_enis(world.instance_id)) == 3


async def test_subnet_exhausted_for_addresses(
    worlds: Worlds, calls: CallLog, fake_time: FakeTime
) -> None:
    world = worlds("m5.large", subnet_cidr="10.0.1.0/28")  # 11 usable: the primary and 10 more
    ec2 = adapter(world.client, calls, fake_time)
    assert len(await ec2.assign_units(world.primary_eni_id, "ip", 9)) == 9
    eni = await ec2.create_eni(world.subnet_id, [], "last address", {"k": "v"})
    await ec2.attach_eni(eni.eni_id, world.instance_id, 1)
    with pytest.raises(SubnetExhausted) as caught:
        await ec2.assign_units(eni.eni_id, "ip", 1)
    assert caught.value.code == "InsufficientFreeAddressesInSubnet"
    assert (await ec2.subnet(world.subnet_id)).available_ips == 0


async def test_subnet_exhausted_for_prefixes(
    worlds: Worlds, calls: CallLog, fake_time: FakeTime
) -> None:
    world = worlds("m5.large", subnet_cidr="10.0.1.0/28")  # no /28 is wholly free
    ec2 = adapter(world.client, calls, fake_time)
    with pytest.raises(SubnetFragmented) as caught:
        await ec2.assign_units(world.primary_eni_id, "prefix", 1)
    assert caught.value.code == "InsufficientCidrBlocks"


async def test_deleting_an_attached_eni_is_refused(ec2: Boto3Ec2, world: World) -> None:
    eni_id, _ = await _attached_eni(ec2, world)
    with pytest.raises(InUse) as caught:
        await ec2.delete_eni(eni_id)
    assert caught.value.code == "InvalidNetworkInterface.InUse"
