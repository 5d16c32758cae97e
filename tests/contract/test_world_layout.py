"""A layout EC2 would refuse is refused before anything is built; its JSON form reads as written."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from cloud.embedded.world import World
from cloud.embedded.world_layout import CNI_ROLE_TAG, Layout, LayoutError, SubnetSpec
from tests.contract.conftest import NO_RETRIES


@pytest.mark.parametrize(
    ("layout", "reason"),
    [
        (Layout(subnets=(SubnetSpec("172.16.0.0/24"),)), "lies in none of the VPC's CIDR blocks"),
        (Layout(subnets=(SubnetSpec("10.0.8.0/24"),)), "overlaps the node's subnet"),
        (Layout(secondary_cidrs=("10.0.128.0/17",)), "VPC CIDR blocks 10.0.0.0/16 and"),
    ],
    ids=["outside-the-vpc", "overlaps-the-node-subnet", "block-overlaps-the-primary"],
)
def test_a_layout_ec2_would_refuse_leaves_the_world_alone(
    make_world: Callable[..., World], layout: Layout, reason: str
) -> None:
    """InvalidSubnet.Range and InvalidSubnet.Conflict, caught before the previous world is wiped."""
    before = make_world()
    with pytest.raises(LayoutError, match=reason):
        make_world(subnet_cidr="10.0.0.0/20", layout=layout)
    vpcs = before.client(NO_RETRIES).describe_vpcs(VpcIds=[before.vpc_id])["Vpcs"]
    assert [v["VpcId"] for v in vpcs] == [before.vpc_id]


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (
            lambda: Layout(subnets=(SubnetSpec("10.0.16.0/20"), SubnetSpec("10.0.20.0/24"))),
            "overlap",
        ),
        (lambda: Layout(subnets=(SubnetSpec("10.0.16.0/29"),)), "/16 to /28"),
        (lambda: Layout(secondary_cidrs=("100.0.0.0/15",)), "/16 to /28"),
        (lambda: Layout(subnets=(SubnetSpec("10.0.16.1/24"),)), "host bits set"),
        (lambda: Layout(subnets=(SubnetSpec("not-a-cidr"),)), "not-a-cidr"),
    ],
    ids=["subnets-overlap", "subnet-too-small", "block-too-large", "host-bits", "garbage"],
)
def test_a_layout_that_makes_no_sense_is_refused(make: Callable[[], Layout], reason: str) -> None:
    with pytest.raises(LayoutError, match=reason):
        make()


def test_zones_by_letter_or_name() -> None:
    assert SubnetSpec("10.0.16.0/24").zone_in("eu-west-1", "eu-west-1a") == "eu-west-1a"
    assert SubnetSpec("10.0.16.0/24", zone="B").zone_in("eu-west-1", "eu-west-1a") == "eu-west-1b"
    assert SubnetSpec("10.0.16.0/24", zone="eu-west-1c").zone_in("eu-west-1", "") == "eu-west-1c"
    with pytest.raises(LayoutError, match="not in region eu-west-1"):
        SubnetSpec("10.0.16.0/24", zone="us-west-2b").zone_in("eu-west-1", "eu-west-1a")


def test_the_json_form() -> None:
    text = """{
        "secondary_cidrs": ["100.64.0.0/16"],
        "subnets": [
            {"cidr": "100.64.0.0/19", "tags": {"kubernetes.io/role/cni": "1"}},
            {"cidr": "100.64.32.0/19", "zone": "b", "tags": {"kubernetes.io/role/cni": 1}}
        ],
        "node_subnet_tags": {"kubernetes.io/role/cni": "0"}
    }"""
    assert Layout.from_json(text) == Layout(
        secondary_cidrs=("100.64.0.0/16",),
        subnets=(
            SubnetSpec("100.64.0.0/19", tags={CNI_ROLE_TAG: "1"}),
            SubnetSpec("100.64.32.0/19", zone="b", tags={CNI_ROLE_TAG: "1"}),
        ),
        node_subnet_tags={CNI_ROLE_TAG: "0"},
    )
    assert Layout.from_json("{}") == Layout()
    assert Layout.from_json('{"ipv6": true}') == Layout(ipv6=True)
    for bad, reason in [
        ('{"subnet": []}', "unknown keys"),
        ('{"ipv6": "yes"}', "ipv6 must be true or false"),
        ('{"subnets": [{"cidr": "100.64.0.0/19", "az": "b"}]}', "unknown subnet keys"),
        ('{"subnets": [{"zone": "b"}]}', "unreadable"),
        ("[]", "unreadable"),
        ("{", "unreadable"),
    ]:
        with pytest.raises(LayoutError, match=reason):
            Layout.from_json(bad)
