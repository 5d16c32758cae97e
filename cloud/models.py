"""What ipamd knows of EC2, as plain values: ENIs with their addresses and prefixes, instance limits,
subnets. No boto3 dictionaries cross this package's boundary."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from datastore.records import UnitKind

Ipv4UnitKind = Literal["ip", "prefix"]
"""The kinds of `UnitKind` the pool assigns and releases by count (AssignPrivateIpAddresses): a
secondary IPv4 address (/32) or a /28 prefix of 16 addresses. IPv6 mode's /80 is assigned once
(`Ec2Api.assign_ipv6_prefix`) and never released."""


@dataclass(frozen=True, slots=True)
class NetworkInterface:
    eni_id: str
    subnet_id: str
    status: str
    """EC2's status: `in-use` when attached, `available` when detached, `attaching`, ..."""
    mac: str = ""
    device_index: int | None = None
    attachment_id: str | None = None
    instance_id: str | None = None
    primary_ip: str = ""
    secondary_ips: tuple[str, ...] = ()
    """Secondary private IPv4 addresses, host form (no /32)."""
    prefixes: tuple[str, ...] = ()
    """Delegated IPv4 prefixes, CIDR form (`10.0.1.16/28`)."""
    ipv6_prefixes: tuple[str, ...] = ()
    """Delegated IPv6 prefixes, CIDR form (`2600:1f14:abc:d00:1234::/80`): IPv6 mode's pod addresses."""
    tags: Mapping[str, str] = field(default_factory=dict)
    delete_on_termination: bool = False
    interface_type: str = "interface"
    """EC2's `InterfaceType`: `interface` for an ordinary ENI; `efa`, `efa-only`, `trunk`, `branch`
    and others belong to other users of the instance's network (ipamd leaves them alone)."""

    @property
    def is_primary(self) -> bool:
        return self.device_index == 0

    def units(self, kind: UnitKind) -> tuple[str, ...]:
        """The ENI's units of one kind, as CIDRs."""
        if kind == "prefix":
            return self.prefixes
        if kind == "ipv6_prefix":
            return self.ipv6_prefixes
        return tuple(f"{ip}/32" for ip in self.secondary_ips)


@dataclass(frozen=True, slots=True)
class InstanceLimits:
    """Per instance type, from DescribeInstanceTypes."""

    instance_type: str
    max_enis: int
    """Network interfaces the instance can attach (all network cards)."""
    ipv4_per_eni: int
    """Private IPv4 addresses per ENI, the primary included."""
    hypervisor: str = "nitro"
    """`nitro` or `xen` (bare metal: `nitro`); EC2 assigns /28 prefixes on Nitro only."""
    vcpus: int | None = None
    """Default vCPUs (`VCpuInfo.DefaultVCpus`), which set EKS's max-pods cap; None = not known."""

    @property
    def units_per_eni(self) -> int:
        """Secondary addresses, or /28 prefixes, an ENI can hold beyond its primary address."""
        return self.ipv4_per_eni - 1


@dataclass(frozen=True, slots=True)
class Subnet:
    subnet_id: str
    cidr: str
    available_ips: int
    vpc_id: str = ""
    availability_zone: str = ""
    tags: Mapping[str, str] = field(default_factory=dict)
    ipv6_cidr: str = ""
    """The subnet's IPv6 /64, or "" when it has no IPv6 CIDR block."""
