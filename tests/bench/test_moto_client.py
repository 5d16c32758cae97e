"""`MotoEc2Client` answers DescribeSubnets as moto's own `describe_subnets` does: the same subnets in
the same order, for one subnet ID and for the filters subnet discovery sends, across VPCs and
zones."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError

from bench.cluster.front import AccountFront, Ec2Budget
from bench.cluster.moto_client import MotoEc2Client
from cloud.embedded.world import EmbeddedEc2, World


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    with EmbeddedEc2() as host:
        yield host.world("m5.large", seed=11)


def _ids(answer: dict[str, Any]) -> list[str]:
    return [s["SubnetId"] for s in answer["Subnets"]]


def _moto(backend: Any, ids: list[str] | None, filters: dict[str, list[str]]) -> list[str]:
    return [s.id for s in backend.describe_subnets(ids, filters)]


def test_describe_subnets_finds_what_moto_finds(world: World) -> None:
    ec2 = world.client()
    backend = world.backend()
    zones = [z["ZoneName"] for z in ec2.describe_availability_zones()["AvailabilityZones"]][:2]
    vpcs = [ec2.create_vpc(CidrBlock=f"10.{n}.0.0/16")["Vpc"]["VpcId"] for n in (41, 42)]
    for n, vpc in enumerate(vpcs):
        for k in range(4):
            ec2.create_subnet(
                VpcId=vpc, CidrBlock=f"10.{41 + n}.{16 * k}.0/20", AvailabilityZone=zones[k % 2]
            )
    client = MotoEc2Client(AccountFront(Ec2Budget(throttling=False), lambda: 0.0), backend, {})
    queries: list[dict[str, list[str]]] = [
        {"vpc-id": [vpcs[0]], "availability-zone": [zones[0]]},
        {"vpc-id": [vpcs[1]], "availability-zone": [zones[1]]},
        {"vpc-id": [vpcs[1]]},
        {"availability-zone": [zones[0]]},
        {"vpc-id": vpcs, "availability-zone": zones},
        {"vpc-id": ["vpc-unknown"]},
    ]
    for wanted in queries:
        filters = [{"Name": k, "Values": v} for k, v in wanted.items()]
        found = _ids(client.describe_subnets(Filters=filters))
        assert found == _moto(backend, None, wanted)
        assert found or wanted["vpc-id"] == ["vpc-unknown"]
    every = _moto(backend, None, {})
    for subnet_id in every:
        assert _ids(client.describe_subnets(SubnetIds=[subnet_id])) == [subnet_id]
    assert _ids(client.describe_subnets()) == every
    answer = client.describe_subnets(SubnetIds=[every[-1]])["Subnets"][0]
    subnet = backend.get_subnet(every[-1])
    assert answer["AvailableIpAddressCount"] == subnet.available_ip_address_count
    assert answer["VpcId"] == subnet.vpc_id


def test_an_unknown_subnet_id_is_refused_as_moto_refuses_it(world: World) -> None:
    client = MotoEc2Client(
        AccountFront(Ec2Budget(throttling=False), lambda: 0.0), world.backend(), {}
    )
    with pytest.raises(ClientError) as refused:
        client.describe_subnets(SubnetIds=["subnet-00000000"])
    assert refused.value.response["Error"]["Code"] == "InvalidSubnetID.NotFound"
