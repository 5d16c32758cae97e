"""A world's subnets outlive a restart: the cloud file records the VPC's secondary CIDR blocks and
every subnet with its zone and tags, and a rebuilt world has them with the same IDs, the ENIs in
them, and a fragmented subnet still fragmented."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cloud.embedded import cloud_file
from cloud.embedded.cloud_file import CloudFacts, CloudFileError
from cloud.embedded.cloud_keeper import start_kept_world
from cloud.embedded.cloud_restore import capture, rebuild
from cloud.embedded.fragment import fragment_subnet, free_blocks
from cloud.embedded.world import EmbeddedEc2, World
from cloud.embedded.world_layout import CNI_ROLE_TAG, Layout, SubnetSpec
from tests.contract.support import attach, available_count, create_eni

REGION = "us-west-2"
LAYOUT = Layout(
    secondary_cidrs=("100.64.0.0/16",),
    subnets=(
        SubnetSpec("100.64.0.0/24", tags={CNI_ROLE_TAG: "1"}),
        SubnetSpec("100.64.32.0/19", zone="c", tags={CNI_ROLE_TAG: "1", "Name": "pods-c"}),
    ),
    node_subnet_tags={CNI_ROLE_TAG: "0"},
)


def _busy(world: World) -> None:
    """An attached ENI with addresses and a prefix in the secondary block, the /24 fragmented, and
    a subnet made later through CreateSubnet."""
    ec2 = world.client()
    pods = world.subnet("100.64.0.0/24").subnet_id
    eni = create_eni(ec2, pods, SecondaryPrivateIpAddressCount=3, Ipv4PrefixCount=1)
    attach(ec2, eni, world.instance_id, 1)
    fragment_subnet(ec2, pods)
    ec2.create_subnet(
        VpcId=world.vpc_id,
        CidrBlock="10.0.32.0/24",
        AvailabilityZone="us-west-2b",
        TagSpecifications=[{"ResourceType": "subnet", "Tags": [{"Key": "made", "Value": "later"}]}],
    )


def _subnets(world: World) -> Any:
    """What DescribeSubnets and DescribeVpcs show of the world's VPC, without IDs EC2 draws anew
    (CIDR association IDs) or moto's own per-subnet defaults of the region."""
    ec2 = world.client()
    subnets = ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [world.vpc_id]}])
    vpc = ec2.describe_vpcs(VpcIds=[world.vpc_id])["Vpcs"][0]
    return (
        sorted(
            (
                s["SubnetId"],
                s["CidrBlock"],
                s["AvailabilityZone"],
                s["AvailableIpAddressCount"],
                sorted((t["Key"], t["Value"]) for t in s.get("Tags", [])),
            )
            for s in subnets["Subnets"]
        ),
        [(a["CidrBlock"], a["CidrBlockState"]["State"]) for a in vpc["CidrBlockAssociationSet"]],
    )


def _enis(world: World) -> Any:
    enis = world.client().describe_network_interfaces()["NetworkInterfaces"]
    return sorted(
        (
            e["NetworkInterfaceId"],
            e["SubnetId"],
            sorted(a["PrivateIpAddress"] for a in e["PrivateIpAddresses"]),
            sorted(p["Ipv4Prefix"] for p in e.get("Ipv4Prefixes", [])),
            e.get("Attachment", {}).get("DeviceIndex"),
        )
        for e in enis
    )


def test_subnets_survive_the_file_and_a_wiped_moto(embedded_ec2: EmbeddedEc2) -> None:
    world = embedded_ec2.world("c5.18xlarge", REGION, "10.0.0.0/20", layout=LAYOUT)
    _busy(world)
    before = (_subnets(world), _enis(world))
    pods = world.subnet("100.64.0.0/24").subnet_id
    facts = capture(world)
    assert facts.secondary_cidrs == ("100.64.0.0/16",)
    assert facts.subnet_tags == {CNI_ROLE_TAG: "0"}
    assert [s.cidr for s in facts.subnets] == ["100.64.0.0/24", "100.64.32.0/19", "10.0.32.0/24"]

    read = CloudFacts.from_json(facts.to_json(), Path("embedded-cloud.json"))
    assert read == facts
    embedded_ec2.wipe(REGION)
    rebuilt = rebuild(embedded_ec2, read)

    assert rebuilt.subnets[:2] == world.subnets
    assert rebuilt.secondary_cidrs == world.secondary_cidrs
    assert (_subnets(rebuilt), _enis(rebuilt)) == before
    assert capture(rebuilt) == facts
    ec2 = rebuilt.client()
    assert free_blocks(ec2, pods) == []
    assert available_count(ec2, pods) > 16


def test_a_kept_world_restarts_with_its_subnets(tmp_path: Path) -> None:
    """`ipamd run --embedded` restarted: the file's subnets win over a different layout (with a
    note), and no layout at all rebuilds them too."""
    path = tmp_path / "embedded-cloud.json"
    first = start_kept_world(path, "m5.large", REGION, subnet_cidr="10.0.0.0/20", layout=LAYOUT)
    try:
        assert not first.restored
        _busy(first.world)
        before = (_subnets(first.world), _enis(first.world))
    finally:
        first.close()

    other = Layout(subnets=(SubnetSpec("10.0.1.0/24"),))
    for layout, noted in ((LAYOUT, False), (other, True), (None, False)):
        again = start_kept_world(path, "m5.large", REGION, layout=layout)
        try:
            assert again.restored
            assert (_subnets(again.world), _enis(again.world)) == before
            assert any("layout ignored" in n for n in again.notes) is noted
        finally:
            again.close()


def test_a_format_1_file_is_a_world_without_extra_subnets(
    make_world: Callable[..., World], tmp_path: Path
) -> None:
    """Files written before subnets were recorded read as the one-subnet world they describe."""
    facts = capture(make_world())
    body = json.loads(facts.to_json())
    assert body["format"] == cloud_file.FORMAT == 2
    for key in ("secondary_cidrs", "subnet_tags", "subnets"):
        del body[key]
    body["format"] = 1
    path = tmp_path / "embedded-cloud.json"
    path.write_text(json.dumps(body))

    assert cloud_file.load(path) == facts


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda b: b.update(format=True), "format True"),
        (lambda b: b["subnets"].append(dict(b["subnets"][0])), "a subnet is listed twice"),
        (lambda b: b.update(subnets=[]), "which the record lacks"),
    ],
    ids=["boolean-format", "subnet-twice", "eni-in-unknown-subnet"],
)
def test_a_record_that_makes_no_sense_is_refused(
    make_world: Callable[..., World], change: Callable[[dict[str, Any]], None], reason: str
) -> None:
    world = make_world("m5.large", subnet_cidr="10.0.0.0/20", layout=LAYOUT)
    create_eni(world.client(), world.subnet("100.64.0.0/24").subnet_id)
    body = json.loads(capture(world).to_json())
    change(body)

    with pytest.raises(CloudFileError, match=reason):
        CloudFacts.from_json(json.dumps(body), Path("embedded-cloud.json"))
