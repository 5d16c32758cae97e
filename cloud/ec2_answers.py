"""EC2's answers, read into ipamd's models: the only code that knows the shape of boto3's dictionaries.
No I/O; used by `cloud.ec2`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cloud.errors import ServiceUnavailable
from cloud.models import InstanceLimits, Ipv4UnitKind, NetworkInterface, Subnet
from cloud.ports import Instance

# -- parsing EC2's answers ------------------------------------------------------------------------


def parse_eni(d: Mapping[str, Any]) -> NetworkInterface:
    attachment: Mapping[str, Any] = d.get("Attachment") or {}
    primary = str(d.get("PrivateIpAddress") or "")
    secondary = tuple(
        str(a["PrivateIpAddress"])
        for a in d.get("PrivateIpAddresses") or []
        if not a.get("Primary") and a.get("PrivateIpAddress") != primary
    )
    device_index = attachment.get("DeviceIndex")
    attachment_id = attachment.get("AttachmentId")
    instance_id = attachment.get("InstanceId")
    return NetworkInterface(
        eni_id=str(d["NetworkInterfaceId"]),
        subnet_id=str(d.get("SubnetId") or ""),
        status=str(d.get("Status") or ""),
        mac=str(d.get("MacAddress") or ""),
        device_index=int(device_index) if device_index is not None else None,
        attachment_id=str(attachment_id) if attachment_id else None,
        instance_id=str(instance_id) if instance_id else None,
        primary_ip=primary,
        secondary_ips=secondary,
        prefixes=tuple(str(p["Ipv4Prefix"]) for p in d.get("Ipv4Prefixes") or []),
        ipv6_prefixes=tuple(str(p["Ipv6Prefix"]) for p in d.get("Ipv6Prefixes") or []),
        tags={str(t["Key"]): str(t.get("Value") or "") for t in d.get("TagSet") or []},
        delete_on_termination=bool(attachment.get("DeleteOnTermination", False)),
        interface_type=str(d.get("InterfaceType") or "interface"),
    )


def assigned_units(answer: Mapping[str, Any], kind: Ipv4UnitKind) -> tuple[str, ...]:
    """The units an AssignPrivateIpAddresses answer lists, as CIDRs."""
    if kind == "prefix":
        return tuple(str(p["Ipv4Prefix"]) for p in answer.get("AssignedIpv4Prefixes") or [])
    return tuple(
        f"{a['PrivateIpAddress']}/32" for a in answer.get("AssignedPrivateIpAddresses") or []
    )


def assigned_ipv6_prefix(answer: Mapping[str, Any]) -> str:
    """The one prefix an AssignIpv6Addresses answer lists (AssignedIpv6Prefixes). An answer that
    lists none is a `ServiceUnavailable`: EC2 acted or not, and the caller reads the ENI again."""
    listed = [str(p) for p in answer.get("AssignedIpv6Prefixes") or []]
    if len(listed) != 1:
        raise ServiceUnavailable("AssignIpv6Addresses", "UnexpectedAnswer", f"prefixes {listed}")
    return listed[0]


def host_address(cidr: str) -> str:
    """`10.0.1.5/32` (or `10.0.1.5`) as `10.0.1.5`; anything wider is not one address."""
    address, _, length = cidr.partition("/")
    if length not in ("", "32"):
        raise ValueError(f"not a single IPv4 address: {cidr}")
    return address


def parse_instance(d: Mapping[str, Any]) -> Instance:
    """The instance with the security groups of its primary ENI, which new ENIs copy (the instance's
    own `SecurityGroups` can be empty when the groups were given on the interface)."""
    groups = [str(g["GroupId"]) for g in d.get("SecurityGroups") or []]
    for eni in d.get("NetworkInterfaces") or []:
        if (eni.get("Attachment") or {}).get("DeviceIndex") == 0 and eni.get("Groups"):
            groups = [str(g["GroupId"]) for g in eni["Groups"]]
    placement: Mapping[str, Any] = d.get("Placement") or {}
    return Instance(
        instance_id=str(d["InstanceId"]),
        instance_type=str(d["InstanceType"]),
        subnet_id=str(d.get("SubnetId") or ""),
        security_groups=tuple(groups),
        availability_zone=str(placement.get("AvailabilityZone") or ""),
        private_ip=str(d.get("PrivateIpAddress") or ""),
        vpc_id=str(d.get("VpcId") or ""),
    )


def parse_limits(d: Mapping[str, Any]) -> InstanceLimits:
    """Bare-metal types report no hypervisor; they run on the Nitro system (prefixes supported).
    The vCPUs are the type's default count, which EKS's max-pods cap uses."""
    network: Mapping[str, Any] = d["NetworkInfo"]
    hypervisor = d.get("Hypervisor") or ("nitro" if d.get("BareMetal") else "")
    # ipamd attaches on the default network card only, so on multi-card types the instance-wide
    # MaximumNetworkInterfaces would over-promise: planning on it would loop on AttachmentLimitExceeded.
    max_enis = int(network["MaximumNetworkInterfaces"])
    default_card = network.get("DefaultNetworkCardIndex", 0)
    for card in network.get("NetworkCards") or []:
        if card.get("NetworkCardIndex") == default_card and "MaximumNetworkInterfaces" in card:
            max_enis = int(card["MaximumNetworkInterfaces"])
    return InstanceLimits(
        instance_type=str(d["InstanceType"]),
        max_enis=max_enis,
        ipv4_per_eni=int(network["Ipv4AddressesPerInterface"]),
        hypervisor=str(hypervisor),
        vcpus=_default_vcpus(d),
    )


def _default_vcpus(d: Mapping[str, Any]) -> int | None:
    vcpus = (d.get("VCpuInfo") or {}).get("DefaultVCpus")
    return None if vcpus is None else int(vcpus)


def parse_subnet(d: Mapping[str, Any]) -> Subnet:
    return Subnet(
        subnet_id=str(d["SubnetId"]),
        cidr=str(d["CidrBlock"]),
        available_ips=int(d.get("AvailableIpAddressCount") or 0),
        vpc_id=str(d.get("VpcId") or ""),
        availability_zone=str(d.get("AvailabilityZone") or ""),
        tags={str(t["Key"]): str(t.get("Value") or "") for t in d.get("Tags") or []},
        ipv6_cidr=_subnet_ipv6_cidr(d),
    )


def _subnet_ipv6_cidr(d: Mapping[str, Any]) -> str:
    """The subnet's associated IPv6 block (EC2 associates at most one /64 with a subnet)."""
    for association in d.get("Ipv6CidrBlockAssociationSet") or []:
        state = str((association.get("Ipv6CidrBlockState") or {}).get("State") or "")
        if state in ("associated", "associating") and association.get("Ipv6CidrBlock"):
            return str(association["Ipv6CidrBlock"])
    return ""
