"""What an embedded world's VPC holds beyond the node's own subnet: secondary VPC CIDR blocks, extra
subnets (in the node's zone or others, with tags and chosen CIDRs), and tags on the node's subnet.

`Layout` is the request, checked when it is made; `build_layout` makes it through the EC2 API on a VPC
that already holds the node's subnet, and answers with the `WorldSubnet`s it made. A layout is how a
test or `ipamd run --embedded` gets the subnets that subnet discovery (subnets tagged
`kubernetes.io/role/cni`) and custom networking (a subnet per zone) choose from:

    Layout(
        secondary_cidrs=("100.64.0.0/16",),
        subnets=(
            SubnetSpec("100.64.0.0/19", tags={CNI_ROLE_TAG: "1"}),             # the node's zone
            SubnetSpec("100.64.32.0/19", zone="b", tags={CNI_ROLE_TAG: "1"}),  # us-west-2b
        ),
        node_subnet_tags={CNI_ROLE_TAG: "0"},
    )

With `ipv6=True` the VPC also gets an Amazon-provided IPv6 /56 and every subnet of the world (the
node's first, then the extras in order) a /64 of it, as `AssociateVpcCidrBlock`
(AmazonProvidedIpv6CidrBlock) and `AssociateSubnetCidrBlock` give them: the VPC of an IPv6 node.

The default (empty) layout adds nothing: the world is exactly the one-subnet world. A layout's JSON
form (`Layout.from_json`) is the same, with `subnets` as objects `{"cidr", "zone", "tags"}`.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

CNI_ROLE_TAG: Final = "kubernetes.io/role/cni"
"""The subnet tag VPC CNI's subnet discovery reads: `1` opts a subnet in, `0` opts it out."""
CLUSTER_TAG_PREFIX: Final = "cni.networking.k8s.aws/cluster/"
"""A subnet tagged `<prefix><cluster name>` is for that cluster only (VPC CNI's subnet discovery)."""

MIN_PREFIX: Final = 16
MAX_PREFIX: Final = 28
"""EC2 VPC CIDR blocks and IPv4 subnets are /16 to /28 (Amazon VPC User Guide, "VPC CIDR blocks")."""


class LayoutError(ValueError):
    """A layout EC2 would refuse, or that makes no sense, caught before anything is built."""


@dataclass(frozen=True, slots=True)
class SubnetSpec:
    """One extra subnet of the world's VPC."""

    cidr: str
    zone: str = ""
    """"" for the node's zone; a zone letter ("b": the region's zone b); or a full zone name."""
    tags: Mapping[str, str] = field(default_factory=dict)

    def zone_in(self, region: str, node_zone: str) -> str:
        if not self.zone:
            return node_zone
        if len(self.zone) == 1 and self.zone.isalpha():
            return f"{region}{self.zone.lower()}"
        if not self.zone.startswith(region):
            raise LayoutError(f"zone {self.zone} of subnet {self.cidr} is not in region {region}")
        return self.zone


@dataclass(frozen=True, slots=True)
class WorldSubnet:
    """An extra subnet as it was made (or rebuilt)."""

    subnet_id: str
    cidr: str
    availability_zone: str
    tags: Mapping[str, str] = field(default_factory=dict)
    ipv6_cidr: str = ""
    """The subnet's IPv6 /64, or "" when the world has no IPv6."""


@dataclass(frozen=True, slots=True)
class Layout:
    secondary_cidrs: tuple[str, ...] = ()
    """IPv4 CIDR blocks associated with the VPC after its primary one (e.g. 100.64.0.0/16)."""
    subnets: tuple[SubnetSpec, ...] = ()
    """Made in this order, after the node's subnet; each in the VPC's primary or a secondary block."""
    node_subnet_tags: Mapping[str, str] = field(default_factory=dict)
    ipv6: bool = False
    """An IPv6 /56 on the VPC and a /64 of it on every subnet."""

    def __post_init__(self) -> None:
        # Tuples even when given lists, so a layout compares and prints as what it means.
        blocks = [_network(c, "secondary VPC CIDR block") for c in self.secondary_cidrs]
        object.__setattr__(self, "secondary_cidrs", tuple(str(b) for b in blocks))
        object.__setattr__(self, "subnets", tuple(self.subnets))
        _no_overlap(blocks, "secondary VPC CIDR blocks")
        nets = [_network(s.cidr, "subnet") for s in self.subnets]
        _no_overlap(nets, "subnets")

    def check_against(self, node_subnet: ipaddress.IPv4Network, vpc: ipaddress.IPv4Network) -> None:
        """Raises `LayoutError` for a subnet EC2 would refuse in this VPC (InvalidSubnet.Range,
        InvalidSubnet.Conflict), or a secondary block that overlaps the primary one."""
        blocks = [vpc, *(ipaddress.IPv4Network(c) for c in self.secondary_cidrs)]
        _no_overlap(blocks, "VPC CIDR blocks")
        for spec in self.subnets:
            net = ipaddress.IPv4Network(spec.cidr)
            if not any(net.subnet_of(b) for b in blocks):
                raise LayoutError(f"subnet {net} lies in none of the VPC's CIDR blocks {blocks}")
            if net.overlaps(node_subnet):
                raise LayoutError(f"subnet {net} overlaps the node's subnet {node_subnet}")

    @classmethod
    def from_json(cls, text: str) -> Layout:
        """`{"secondary_cidrs": [...], "subnets": [{"cidr", "zone", "tags"}], "node_subnet_tags":
        {...}, "ipv6": false}`, every key optional. Raises `LayoutError`."""
        try:
            body = json.loads(text)
            if not isinstance(body, dict):
                raise TypeError("not a JSON object")
            unknown = set(body) - {"secondary_cidrs", "subnets", "node_subnet_tags", "ipv6"}
            if unknown:
                raise LayoutError(f"unknown keys {sorted(unknown)}")
            return cls(
                secondary_cidrs=tuple(str(c) for c in body.get("secondary_cidrs", ())),
                subnets=tuple(_spec(s) for s in body.get("subnets", ())),
                node_subnet_tags=_tags(body.get("node_subnet_tags", {})),
                ipv6=_flag(body.get("ipv6", False)),
            )
        except LayoutError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            raise LayoutError(f"unreadable layout ({type(err).__name__}: {err})") from err


def _spec(body: Mapping[str, Any]) -> SubnetSpec:
    unknown = set(body) - {"cidr", "zone", "tags"}
    if unknown:
        raise LayoutError(f"unknown subnet keys {sorted(unknown)}")
    return SubnetSpec(str(body["cidr"]), str(body.get("zone", "")), _tags(body.get("tags", {})))


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise LayoutError(f"ipv6 must be true or false, not {value!r}")
    return value


def _tags(body: Mapping[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in body.items()}


def _network(cidr: str, what: str) -> ipaddress.IPv4Network:
    try:
        net = ipaddress.IPv4Network(cidr)
    except ValueError as err:
        raise LayoutError(f"{what} {cidr!r}: {err}") from None
    if not MIN_PREFIX <= net.prefixlen <= MAX_PREFIX:
        raise LayoutError(f"{what} {cidr}: EC2 takes /{MIN_PREFIX} to /{MAX_PREFIX}")
    return net


def _no_overlap(nets: Sequence[ipaddress.IPv4Network], what: str) -> None:
    for i, a in enumerate(nets):
        for b in nets[i + 1 :]:
            if a.overlaps(b):
                raise LayoutError(f"{what} {a} and {b} overlap")


def tag_specification(resource_type: str, tags: Mapping[str, str]) -> list[dict[str, Any]]:
    """CreateSubnet's (and others') TagSpecifications for `tags`; none for no tags."""
    if not tags:
        return []
    listed = [{"Key": k, "Value": v} for k, v in sorted(tags.items())]
    return [{"ResourceType": resource_type, "Tags": listed}]


def build_layout(
    ec2: Any, layout: Layout, *, vpc_id: str, node_subnet_id: str, region: str, node_zone: str
) -> tuple[WorldSubnet, ...]:
    """Associate the secondary blocks, tag the node's subnet, create the extra subnets (through the
    EC2 API, so moto's own checks apply too)."""
    for cidr in layout.secondary_cidrs:
        ec2.associate_vpc_cidr_block(VpcId=vpc_id, CidrBlock=cidr)
    if layout.node_subnet_tags:
        listed = tag_specification("subnet", layout.node_subnet_tags)[0]["Tags"]
        ec2.create_tags(Resources=[node_subnet_id], Tags=listed)
    made: list[WorldSubnet] = []
    blocks = _ipv6_blocks(ec2, vpc_id) if layout.ipv6 else None
    if blocks is not None:
        associate_ipv6(ec2, node_subnet_id, next(blocks))
    for spec in layout.subnets:
        zone = spec.zone_in(region, node_zone)
        subnet_id: str = ec2.create_subnet(
            VpcId=vpc_id,
            CidrBlock=spec.cidr,
            AvailabilityZone=zone,
            TagSpecifications=tag_specification("subnet", spec.tags),
        )["Subnet"]["SubnetId"]
        cidr = str(ipaddress.IPv4Network(spec.cidr))
        ipv6_cidr = associate_ipv6(ec2, subnet_id, next(blocks)) if blocks is not None else ""
        made.append(WorldSubnet(subnet_id, cidr, zone, dict(spec.tags), ipv6_cidr))
    return tuple(made)


def _ipv6_blocks(ec2: Any, vpc_id: str) -> Iterator[ipaddress.IPv6Network]:
    """An Amazon-provided /56 on the VPC, and its /64s in order."""
    ec2.associate_vpc_cidr_block(VpcId=vpc_id, AmazonProvidedIpv6CidrBlock=True)
    return ipaddress.IPv6Network(vpc_ipv6_cidr(ec2, vpc_id)).subnets(new_prefix=64)


def vpc_ipv6_cidr(ec2: Any, vpc_id: str) -> str:
    """The VPC's associated IPv6 block, or ""."""
    vpc = ec2.describe_vpcs(VpcIds=[vpc_id])["Vpcs"][0]
    for association in vpc.get("Ipv6CidrBlockAssociationSet") or []:
        if (association.get("Ipv6CidrBlockState") or {}).get("State") == "associated":
            return str(association["Ipv6CidrBlock"])
    return ""


def associate_ipv6(ec2: Any, subnet_id: str, block: ipaddress.IPv6Network | str) -> str:
    """Give the subnet the IPv6 /64 `block`; returns it."""
    ec2.associate_subnet_cidr_block(SubnetId=subnet_id, Ipv6CidrBlock=str(block))
    return str(block)
