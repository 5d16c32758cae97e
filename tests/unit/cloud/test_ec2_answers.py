"""Answers real EC2 gives and moto does not (only-the-new assign answers, prefixes, pages, bare
metal), played with botocore's Stubber, and the static limits table when EC2 cannot answer."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.stub import Stubber

from cloud.calls import OK, CallLog
from cloud.errors import CloudError, Rejected, ServiceUnavailable, Throttled
from tests.unit.cloud.conftest import FakeTime, adapter
from tests.unit.cloud.hooks import Scripts, refusal


def _eni(eni_id: str = "eni-1", secondary: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "NetworkInterfaceId": eni_id,
        "SubnetId": "subnet-1",
        "Status": "in-use",
        "PrivateIpAddress": "10.0.1.10",
        "PrivateIpAddresses": [
            {"PrivateIpAddress": "10.0.1.10", "Primary": True},
            *({"PrivateIpAddress": ip, "Primary": False} for ip in secondary),
        ],
    }


async def test_assign_reads_ec2s_answer_of_only_the_new_units(
    offline_client: Any, fake_time: FakeTime
) -> None:
    ec2 = adapter(offline_client, CallLog(), fake_time)
    with Stubber(offline_client) as stub:  # any call but the assign fails: no read goes with it
        stub.add_response(
            "assign_private_ip_addresses",
            {
                "NetworkInterfaceId": "eni-1",
                "AssignedPrivateIpAddresses": [
                    {"PrivateIpAddress": "10.0.1.30"},
                    {"PrivateIpAddress": "10.0.1.31"},
                ],
            },
            {"NetworkInterfaceId": "eni-1", "SecondaryPrivateIpAddressCount": 2},
        )
        assert await ec2.assign_units("eni-1", "ip", 2) == ("10.0.1.30/32", "10.0.1.31/32")
        stub.assert_no_pending_responses()


async def test_assign_prefixes_as_ec2_lists_them(offline_client: Any, fake_time: FakeTime) -> None:
    ec2 = adapter(offline_client, CallLog(), fake_time)
    answer = {"AssignedIpv4Prefixes": [{"Ipv4Prefix": "10.0.1.32/28"}]}
    with Stubber(offline_client) as stub:
        stub.add_response(
            "assign_private_ip_addresses",
            answer,
            {"NetworkInterfaceId": "eni-1", "Ipv4PrefixCount": 1},
        )
        assert await ec2.assign_units("eni-1", "prefix", 1) == ("10.0.1.32/28",)
        stub.assert_no_pending_responses()


async def test_assign_answer_without_a_list_records_nothing_and_reads_nothing(
    offline_client: Any, fake_time: FakeTime
) -> None:
    """What EC2 assigned all the same, the drift adopts from its listing (a unit EC2 lists and
    ipamd lacks enters the inventory as free)."""
    ec2 = adapter(offline_client, CallLog(), fake_time)
    with Stubber(offline_client) as stub:
        stub.add_response("assign_private_ip_addresses", {"NetworkInterfaceId": "eni-1"})
        assert await ec2.assign_units("eni-1", "prefix", 1) == ()
        stub.assert_no_pending_responses()


async def test_unassign_prefixes_by_cidr(offline_client: Any, fake_time: FakeTime) -> None:
    ec2 = adapter(offline_client, CallLog(), fake_time)
    with Stubber(offline_client) as stub:
        stub.add_response(
            "unassign_private_ip_addresses",
            {},
            {"NetworkInterfaceId": "eni-1", "Ipv4Prefixes": ["10.0.1.16/28"]},
        )
        await ec2.unassign_units("eni-1", "prefix", ["10.0.1.16/28"])
        stub.add_response(
            "unassign_private_ip_addresses",
            {},
            {"NetworkInterfaceId": "eni-1", "PrivateIpAddresses": ["10.0.1.20", "10.0.1.21"]},
        )
        await ec2.unassign_units("eni-1", "ip", ["10.0.1.20/32", "10.0.1.21"])
        stub.assert_no_pending_responses()


async def test_describe_enis_follows_every_page(offline_client: Any, fake_time: FakeTime) -> None:
    calls = CallLog()
    ec2 = adapter(offline_client, calls, fake_time)
    filters = [{"Name": "attachment.instance-id", "Values": ["i-1"]}]
    first = {**_eni("eni-b"), "Attachment": {"DeviceIndex": 1, "AttachmentId": "a-b"}}
    second = {
        **_eni("eni-a", secondary=("10.0.1.11",)),
        "Attachment": {"DeviceIndex": 0, "AttachmentId": "a-a", "DeleteOnTermination": True},
        "Ipv4Prefixes": [{"Ipv4Prefix": "10.0.1.64/28"}],
        "TagSet": [{"Key": "k", "Value": "v"}],
    }
    with Stubber(offline_client) as stub:
        stub.add_response(
            "describe_network_interfaces",
            {"NetworkInterfaces": [first], "NextToken": "t2"},
            {"Filters": filters},
        )
        stub.add_response(
            "describe_network_interfaces",
            {"NetworkInterfaces": [second]},
            {"Filters": filters, "NextToken": "t2"},
        )
        enis = await ec2.describe_enis("i-1")
    assert [e.eni_id for e in enis] == ["eni-a", "eni-b"]
    a = enis[0]
    assert a.is_primary and a.delete_on_termination and dict(a.tags) == {"k": "v"}
    assert a.primary_ip == "10.0.1.10" and a.secondary_ips == ("10.0.1.11",)
    assert a.units("prefix") == ("10.0.1.64/28",) and a.units("ip") == ("10.0.1.11/32",)
    assert calls.count("DescribeNetworkInterfaces", OK) == 2


async def test_subnets_in_asks_ec2_to_filter_and_follows_every_page(
    offline_client: Any, fake_time: FakeTime
) -> None:
    """DescribeSubnets with the vpc-id and availability-zone filters (EC2 filters, not ipamd), one
    call per page, each counted by the call log as a DescribeSubnets."""
    calls = CallLog()
    ec2 = adapter(offline_client, calls, fake_time)
    filters = [
        {"Name": "vpc-id", "Values": ["vpc-1"]},
        {"Name": "availability-zone", "Values": ["us-west-2a"]},
    ]

    def subnet(subnet_id: str, cidr: str, free: int, **extra: Any) -> dict[str, Any]:
        return {
            "SubnetId": subnet_id,
            "CidrBlock": cidr,
            "AvailableIpAddressCount": free,
            "VpcId": "vpc-1",
            "AvailabilityZone": "us-west-2a",
            **extra,
        }

    tagged = subnet(
        "subnet-b", "10.0.16.0/24", 200, Tags=[{"Key": "kubernetes.io/role/cni", "Value": "1"}]
    )
    with Stubber(offline_client) as stub:
        stub.add_response(
            "describe_subnets", {"Subnets": [tagged], "NextToken": "t2"}, {"Filters": filters}
        )
        stub.add_response(
            "describe_subnets",
            {"Subnets": [subnet("subnet-a", "10.0.0.0/20", 4000)]},
            {"Filters": filters, "NextToken": "t2"},
        )
        listed = await ec2.subnets_in("vpc-1", "us-west-2a")
        stub.assert_no_pending_responses()
    assert [(s.subnet_id, s.cidr, s.available_ips) for s in listed] == [
        ("subnet-a", "10.0.0.0/20", 4000),
        ("subnet-b", "10.0.16.0/24", 200),
    ]
    assert dict(listed[1].tags) == {"kubernetes.io/role/cni": "1"} and dict(listed[0].tags) == {}
    assert calls.count("DescribeSubnets", OK) == 2


async def test_an_enis_interface_type_is_read(offline_client: Any, fake_time: FakeTime) -> None:
    ec2 = adapter(offline_client, CallLog(), fake_time)
    trunk = {**_eni("eni-t"), "InterfaceType": "trunk", "Attachment": {"DeviceIndex": 2}}
    plain = {**_eni("eni-p"), "Attachment": {"DeviceIndex": 0}}
    with Stubber(offline_client) as stub:
        stub.add_response("describe_network_interfaces", {"NetworkInterfaces": [trunk, plain]})
        enis = await ec2.describe_enis("i-1")
    assert [(e.eni_id, e.interface_type) for e in enis] == [
        ("eni-p", "interface"),
        ("eni-t", "trunk"),
    ]


async def test_instance_limits_of_a_bare_metal_type(
    offline_client: Any, fake_time: FakeTime
) -> None:
    ec2 = adapter(offline_client, CallLog(), fake_time)
    info = {
        "InstanceType": "m5.metal",
        "BareMetal": True,
        "NetworkInfo": {"MaximumNetworkInterfaces": 15, "Ipv4AddressesPerInterface": 50},
    }
    with Stubber(offline_client) as stub:
        stub.add_response("describe_instance_types", {"InstanceTypes": [info]})
        limits = await ec2.instance_limits("m5.metal")
    assert (limits.max_enis, limits.ipv4_per_eni, limits.hypervisor) == (15, 50, "nitro")


@pytest.mark.parametrize(
    ("code", "status", "error"),
    [
        ("UnauthorizedOperation", 403, Rejected),
        ("RequestLimitExceeded", 503, Throttled),
        ("InternalError", 500, ServiceUnavailable),
    ],
)
async def test_instance_limits_fall_back_to_the_table_when_ec2_cannot_answer(
    offline_client: Any,
    fake_time: FakeTime,
    scripts: Scripts,
    code: str,
    status: int,
    error: type[CloudError],
) -> None:
    calls = CallLog()
    ec2 = adapter(offline_client, calls, fake_time, max_attempts=2)
    scripts(offline_client, "DescribeInstanceTypes", [refusal(status, code)] * 6)
    limits = await ec2.instance_limits("m5.large")
    assert (limits.max_enis, limits.ipv4_per_eni) == (3, 10)
    with pytest.raises(error):
        await ec2.instance_limits("r7i.large")  # not in the table: EC2's error stands
    await ec2.instance_limits("m5.large")
    assert calls.count("DescribeInstanceTypes", OK) == 0
    assert calls.count("DescribeInstanceTypes") >= 3, "a fallback answer is not cached"


def test_limits_count_the_default_network_card_only() -> None:
    from cloud.ec2_answers import parse_limits

    answer = {
        "InstanceType": "p4d.24xlarge",
        "Hypervisor": "nitro",
        "NetworkInfo": {
            "MaximumNetworkInterfaces": 60,
            "Ipv4AddressesPerInterface": 50,
            "DefaultNetworkCardIndex": 0,
            "NetworkCards": [
                {"NetworkCardIndex": i, "MaximumNetworkInterfaces": 15} for i in range(4)
            ],
        },
    }
    assert parse_limits(answer).max_enis == 15


def test_limits_carry_the_default_vcpus() -> None:
    """EKS's max-pods cap counts `VCpuInfo.DefaultVCpus`; an answer without it says nothing."""
    from cloud.ec2_answers import parse_limits

    network = {"MaximumNetworkInterfaces": 3, "Ipv4AddressesPerInterface": 10}
    answer = {"InstanceType": "m5.large", "Hypervisor": "nitro", "NetworkInfo": network}
    with_vcpus = {**answer, "VCpuInfo": {"DefaultVCpus": 2, "DefaultCores": 1}}
    assert parse_limits(with_vcpus).vcpus == 2
    assert parse_limits(answer).vcpus is None


async def test_an_ipv6_prefix_is_read_from_the_assign_answer(
    offline_client: Any, fake_time: FakeTime
) -> None:
    """AssignIpv6Addresses by count answers with the prefix it assigned (AssignedIpv6Prefixes); an
    answer that lists none leaves the outcome unknown, so it is a retryable `ServiceUnavailable`
    and the caller reads the ENI again."""
    ec2 = adapter(offline_client, CallLog(), fake_time)
    asked = {"NetworkInterfaceId": "eni-1", "Ipv6PrefixCount": 1}
    with Stubber(offline_client) as stub:
        stub.add_response(
            "assign_ipv6_addresses",
            {"NetworkInterfaceId": "eni-1", "AssignedIpv6Prefixes": ["2600:1f14:1:200:9a3b::/80"]},
            asked,
        )
        stub.add_response("assign_ipv6_addresses", {"NetworkInterfaceId": "eni-1"}, asked)
        assert await ec2.assign_ipv6_prefix("eni-1") == "2600:1f14:1:200:9a3b::/80"
        with pytest.raises(ServiceUnavailable):
            await ec2.assign_ipv6_prefix("eni-1")
        stub.assert_no_pending_responses()


async def test_ipv6_prefixes_and_a_subnets_ipv6_block_are_read(
    offline_client: Any, fake_time: FakeTime
) -> None:
    ec2 = adapter(offline_client, CallLog(), fake_time)
    eni = {**_eni(), "Ipv6Prefixes": [{"Ipv6Prefix": "2600:1f14:1:200:9a3b::/80"}]}
    block = "2600:1f14:1:200::/64"
    subnet = {"SubnetId": "subnet-1", "CidrBlock": "10.0.0.0/16", "AvailableIpAddressCount": 9}
    gone = {
        "Ipv6CidrBlock": "2600:1f14:1:300::/64",
        "Ipv6CidrBlockState": {"State": "disassociated"},
    }
    held = {"Ipv6CidrBlock": block, "Ipv6CidrBlockState": {"State": "associated"}}
    with Stubber(offline_client) as stub:
        stub.add_response("describe_network_interfaces", {"NetworkInterfaces": [eni]})
        stub.add_response(
            "describe_subnets",
            {"Subnets": [{**subnet, "Ipv6CidrBlockAssociationSet": [gone, held]}]},
        )
        stub.add_response("describe_subnets", {"Subnets": [subnet]})
        (described,) = await ec2.describe_enis("i-1")
        assert (
            described.ipv6_prefixes == ("2600:1f14:1:200:9a3b::/80",) and described.prefixes == ()
        )
        assert (await ec2.subnet("subnet-1")).ipv6_cidr == block
        assert (await ec2.subnet("subnet-1")).ipv6_cidr == ""
        stub.assert_no_pending_responses()
