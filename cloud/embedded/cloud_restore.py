"""Reading a world out of moto (`capture`) and building it again with the same IDs (`rebuild`).

Owns the mapping between moto 5.2.5's EC2 objects and `CloudFacts`. It must not write files (that is
`cloud.embedded.cloud_file`) and must not change a world it captures.

Why IDs are pinned rather than re-keyed: moto draws every ID at random (`moto.ec2.utils.random_*`),
and an ID is referenced from many places once drawn (a VPC's ID keys its route tables, network ACLs
and security groups; an instance's primary ENI is created inside RunInstances). Renaming objects
afterwards would have to find every reference. Instead each rebuilding call runs with the ID
functions it draws from pinned to the recorded IDs (`_pinned`), once each, and everything else about
the objects — address rules, limits, attachments — goes through the same API calls a new world uses,
with our extension's checks on them. A recorded ID that moto does not draw is an error, not a guess:
a later moto that draws IDs elsewhere fails loudly here (moto is pinned to one version for this).
"""

from __future__ import annotations

import ipaddress
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

from moto.ec2.models import elastic_network_interfaces, instances, security_groups, subnets, vpcs

from cloud.embedded import eni_rules, ipv6_rules
from cloud.embedded.cloud_file import AttachmentFacts, CloudFacts, EniFacts, SubnetFacts
from cloud.embedded.eni_rules import LOCK
from cloud.embedded.world import IMAGE_ID, EmbeddedEc2, World, ec2_client
from cloud.embedded.world_layout import WorldSubnet, associate_ipv6, tag_specification

_ID_SOURCES: Final[dict[str, tuple[Any, str]]] = {
    "vpc": (vpcs, "random_vpc_id"),
    "subnet": (subnets, "random_subnet_id"),
    "security_group": (security_groups, "random_security_group_id"),
    "instance": (instances, "random_instance_id"),
    "attachment": (instances, "random_eni_attach_id"),
    "eni": (elastic_network_interfaces, "random_eni_id"),
    "mac": (elastic_network_interfaces, "random_mac_address"),
    "ipv6_block": (vpcs, "random_ipv6_cidr"),
}
"""Where moto 5.2.5 looks up the function that draws each kind of ID (the name each model module
imported from moto.ec2.utils)."""

_pin_lock = threading.Lock()


class RebuildError(Exception):
    """moto did not rebuild the record as recorded (an ID not drawn, an address refused)."""


def capture(world: World) -> CloudFacts:
    """The world as EC2 holds it now. Raises moto's EC2 errors if the world is gone (a reset)."""
    with LOCK:
        backend: Any = world.backend()
        instance = backend.get_instance(world.instance_id)
        vpc = backend.get_vpc(world.vpc_id)
        group = backend.get_security_group_from_id(world.security_group_id)
        found = [e for e in list(backend.enis.values()) if e.subnet.vpc_id == world.vpc_id]
        # The primary first: it is rebuilt by RunInstances, before any other ENI exists.
        found.sort(key=lambda e: e.id != world.primary_eni_id)
        node_subnet = backend.get_subnet(world.subnet_id)
        return CloudFacts(
            region=world.region,
            vpc_id=world.vpc_id,
            vpc_cidr=str(vpc.cidr_block),
            subnet_id=world.subnet_id,
            subnet_cidr=world.subnet_cidr,
            availability_zone=world.availability_zone,
            security_group_id=world.security_group_id,
            security_group_name=str(group.name) if group is not None else "ipamd-node",
            instance_id=world.instance_id,
            instance_type=str(instance.instance_type),
            primary_eni_id=world.primary_eni_id,
            enis=tuple(_eni_facts(e) for e in found),
            instance_tags=_tags(instance),
            secondary_cidrs=_secondary_cidrs(vpc),
            subnet_tags=_tags(node_subnet),
            subnets=_other_subnets(backend, world),
            vpc_ipv6_cidr=_vpc_ipv6_cidr(vpc),
            subnet_ipv6_cidr=_subnet_ipv6_cidr(node_subnet),
        )


def _vpc_ipv6_cidr(vpc: Any) -> str:
    """The VPC's Amazon-provided IPv6 block, or ""."""
    blocks = [
        str(a["cidr_block"])
        for a in vpc.get_cidr_block_association_set(ipv6=True)
        if a.get("cidr_block_state", {}).get("state") == "associated"
    ]
    return blocks[0] if blocks else ""


def _subnet_ipv6_cidr(subnet: Any) -> str:
    block = ipv6_rules.subnet_block(subnet)
    return str(block) if block is not None else ""


def _secondary_cidrs(vpc: Any) -> tuple[str, ...]:
    """The VPC's associated IPv4 blocks but its primary, in association order (their association
    IDs are not kept: a rebuilt VPC's are new, and ipamd reads only the blocks)."""
    blocks = [
        str(a["cidr_block"])
        for a in vpc.cidr_block_association_set
        if a.get("cidr_block_state", {}).get("state") == "associated" and "cidr_block" in a
    ]
    return tuple(b for b in dict.fromkeys(blocks) if b != str(vpc.cidr_block))


def _other_subnets(backend: Any, world: World) -> tuple[SubnetFacts, ...]:
    """The VPC's subnets but the node's: the world's extra subnets in their order, then any made
    since (CreateSubnet) by CIDR."""
    known = [s.subnet_id for s in world.subnets]
    subnets = [
        s
        for zone in list(backend.subnets.values())
        for s in list(zone.values())
        if s.vpc_id == world.vpc_id and s.id != world.subnet_id
    ]
    subnets.sort(
        key=lambda s: (
            known.index(s.id) if s.id in known else len(known),
            ipaddress.IPv4Network(s.cidr_block),
        )
    )
    return tuple(
        SubnetFacts(
            str(s.id), str(s.cidr_block), str(s.availability_zone), _tags(s), _subnet_ipv6_cidr(s)
        )
        for s in subnets
    )


def _eni_facts(eni: Any) -> EniFacts:
    attachment = None
    if eni.attachment_id is not None and eni.instance is not None:
        attachment = AttachmentFacts(
            attachment_id=str(eni.attachment_id),
            instance_id=str(eni.instance.id),
            device_index=int(eni.device_index),
            delete_on_termination=bool(eni.delete_on_termination),
        )
    return EniFacts(
        eni_id=str(eni.id),
        mac=str(eni.mac_address),
        subnet_id=str(eni.subnet.id),
        primary_ip=str(eni.private_ip_address),
        secondary_ips=tuple(eni_rules.eni_secondaries(eni)),
        prefixes=tuple(eni_rules.eni_prefixes(eni)),
        ipv6_prefixes=tuple(ipv6_rules.eni_ipv6_prefixes(eni)),
        description=str(eni.description or ""),
        group_ids=tuple(str(g.id) for g in eni._group_set),
        tags=_tags(eni),
        attachment=attachment,
    )


def _tags(resource: Any) -> dict[str, str]:
    return {str(t["key"]): str(t["value"]) for t in resource.get_tags()}


def rebuild(host: EmbeddedEc2, facts: CloudFacts) -> World:
    """Wipe the host's EC2 state and build `facts` on it: the same IDs, MACs, addresses, prefixes,
    tags, attachments and DeleteOnTermination. Raises `RebuildError` or botocore's ClientError."""
    host.wipe(facts.region)
    ec2 = ec2_client(facts.region, host.endpoint_url)
    # A loopback server's first request makes moto build its us-east-1 backend, whose default VPC
    # would draw the pinned VPC ID: let that happen before anything is pinned.
    ec2.describe_vpcs()
    with _pinned(vpc=facts.vpc_id):
        _expect(ec2.create_vpc(CidrBlock=facts.vpc_cidr)["Vpc"]["VpcId"], facts.vpc_id)
    for cidr in facts.secondary_cidrs:
        ec2.associate_vpc_cidr_block(VpcId=facts.vpc_id, CidrBlock=cidr)
    if facts.vpc_ipv6_cidr:
        with _pinned(ipv6_block=facts.vpc_ipv6_cidr):
            ec2.associate_vpc_cidr_block(VpcId=facts.vpc_id, AmazonProvidedIpv6CidrBlock=True)
    node_subnet = SubnetFacts(
        facts.subnet_id,
        facts.subnet_cidr,
        facts.availability_zone,
        facts.subnet_tags,
        facts.subnet_ipv6_cidr,
    )
    for subnet in (node_subnet, *facts.subnets):
        with _pinned(subnet=subnet.subnet_id):
            made = ec2.create_subnet(
                VpcId=facts.vpc_id,
                CidrBlock=subnet.cidr,
                AvailabilityZone=subnet.availability_zone,
                TagSpecifications=tag_specification("subnet", subnet.tags),
            )
            _expect(made["Subnet"]["SubnetId"], subnet.subnet_id)
        if subnet.ipv6_cidr:
            associate_ipv6(ec2, subnet.subnet_id, subnet.ipv6_cidr)
    with _pinned(security_group=facts.security_group_id):
        made = ec2.create_security_group(
            GroupName=facts.security_group_name, Description="embedded node", VpcId=facts.vpc_id
        )
        _expect(made["GroupId"], facts.security_group_id)
    primary, *others = facts.enis
    _launch(ec2, facts, primary)
    for eni in others:
        _recreate(ec2, facts, eni)
    if facts.instance_tags:
        ec2.create_tags(Resources=[facts.instance_id], Tags=_tag_list(facts.instance_tags))
    return World(
        region=facts.region,
        vpc_id=facts.vpc_id,
        subnet_id=facts.subnet_id,
        subnet_cidr=facts.subnet_cidr,
        availability_zone=facts.availability_zone,
        security_group_id=facts.security_group_id,
        instance_id=facts.instance_id,
        instance_type=facts.instance_type,
        primary_eni_id=facts.primary_eni_id,
        endpoint_url=host.endpoint_url,
        secondary_cidrs=facts.secondary_cidrs,
        subnets=tuple(
            WorldSubnet(s.subnet_id, s.cidr, s.availability_zone, dict(s.tags), s.ipv6_cidr)
            for s in facts.subnets
        ),
    )


def _launch(ec2: Any, facts: CloudFacts, primary: EniFacts) -> None:
    """RunInstances with the recorded instance, primary ENI, MAC, attachment and address."""
    attachment = primary.attachment
    if primary.eni_id != facts.primary_eni_id or attachment is None:
        raise RebuildError(f"{facts.primary_eni_id} is not the first, attached ENI of the record")
    pins = {
        "instance": facts.instance_id,
        "eni": primary.eni_id,
        "mac": primary.mac,
        "attachment": attachment.attachment_id,
    }
    with _pinned(**pins):
        made = ec2.run_instances(
            ImageId=IMAGE_ID,
            InstanceType=facts.instance_type,
            MinCount=1,
            MaxCount=1,
            NetworkInterfaces=[
                {
                    "DeviceIndex": 0,
                    "SubnetId": primary.subnet_id,
                    "Groups": list(primary.group_ids or (facts.security_group_id,)),
                    "DeleteOnTermination": attachment.delete_on_termination,
                    "PrivateIpAddress": primary.primary_ip,
                }
            ],
        )
        instance = made["Instances"][0]
        _expect(instance["InstanceId"], facts.instance_id)
        _expect(instance["NetworkInterfaces"][0]["NetworkInterfaceId"], primary.eni_id)
    _fill(ec2, primary)
    if primary.tags:
        # RunInstances takes no tags for the ENI it creates (CreateNetworkInterface does).
        ec2.create_tags(Resources=[primary.eni_id], Tags=_tag_list(primary.tags))
    _set_delete_on_termination(ec2, primary.eni_id, attachment)


def _recreate(ec2: Any, facts: CloudFacts, eni: EniFacts) -> None:
    """CreateNetworkInterface (and AttachNetworkInterface) with the recorded IDs and addresses."""
    extra: dict[str, Any] = {}
    if eni.description:
        extra["Description"] = eni.description
    if eni.group_ids:
        extra["Groups"] = list(eni.group_ids)
    if eni.tags:
        extra["TagSpecifications"] = [
            {"ResourceType": "network-interface", "Tags": _tag_list(eni.tags)}
        ]
    with _pinned(eni=eni.eni_id, mac=eni.mac):
        made = ec2.create_network_interface(
            SubnetId=eni.subnet_id, PrivateIpAddress=eni.primary_ip, **extra
        )
        _expect(made["NetworkInterface"]["NetworkInterfaceId"], eni.eni_id)
    _fill(ec2, eni)
    attachment = eni.attachment
    if attachment is None or attachment.instance_id != facts.instance_id:
        return  # detached (or on an instance this world does not have): left available
    with _pinned(attachment=attachment.attachment_id):
        ec2.attach_network_interface(
            NetworkInterfaceId=eni.eni_id,
            InstanceId=facts.instance_id,
            DeviceIndex=attachment.device_index,
        )
    _set_delete_on_termination(ec2, eni.eni_id, attachment)


def _fill(ec2: Any, eni: EniFacts) -> None:
    """The ENI's secondary addresses, IPv4 and IPv6 prefixes, named, in their recorded order."""
    wanted: dict[str, Any] = {}
    if eni.secondary_ips:
        wanted["PrivateIpAddresses"] = list(eni.secondary_ips)
    if eni.prefixes:
        wanted["Ipv4Prefixes"] = list(eni.prefixes)
    if wanted:
        ec2.assign_private_ip_addresses(NetworkInterfaceId=eni.eni_id, **wanted)
    if eni.ipv6_prefixes:
        ec2.assign_ipv6_addresses(
            NetworkInterfaceId=eni.eni_id, Ipv6Prefixes=list(eni.ipv6_prefixes)
        )


def _set_delete_on_termination(ec2: Any, eni_id: str, attachment: AttachmentFacts) -> None:
    ec2.modify_network_interface_attribute(
        NetworkInterfaceId=eni_id,
        Attachment={
            "AttachmentId": attachment.attachment_id,
            "DeleteOnTermination": attachment.delete_on_termination,
        },
    )


def _expect(made: str, recorded: str) -> None:
    if made != recorded:
        raise RebuildError(f"moto made {made} where the record has {recorded}")


def _tag_list(tags: Any) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in sorted(tags.items())]


@contextmanager
def _pinned(**recorded: str) -> Iterator[None]:
    """For the moto calls inside, the first ID drawn of each named kind is the recorded one; later
    draws are moto's own (a VPC's default security group gets a fresh ID). Raises `RebuildError` if
    a recorded ID was not drawn."""
    pending = dict(recorded)
    with _pin_lock:
        originals: list[tuple[Any, str, Any]] = []
        for kind in recorded:
            module, name = _ID_SOURCES[kind]
            original = getattr(module, name)
            originals.append((module, name, original))
            setattr(module, name, _once(kind, pending, original))
        try:
            yield
        finally:
            for module, name, original in originals:
                setattr(module, name, original)
    if pending:
        raise RebuildError(f"moto did not draw the recorded {', '.join(sorted(pending))} ID")


def _once(kind: str, pending: dict[str, str], original: Any) -> Any:
    def draw(*args: Any, **kwargs: Any) -> Any:
        if kind in pending:
            return pending.pop(kind)
        return original(*args, **kwargs)

    return draw
