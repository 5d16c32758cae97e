"""The ports through which ipamd reaches EC2: small Protocols over ipamd's own models.

Adapters: `cloud.ec2.Boto3Ec2` (real EC2, or moto in tests and `--embedded`). Every method raises only
`cloud.errors.CloudError` subclasses.

Each EC2 port is used under a `CallUrgency`: `with_urgency` gives a view of the same adapter whose calls
have another urgency, and each consumer is handed the view it should use (the composition root and
the pool manager decide, `cloud.ratelimit` applies it).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from cloud.models import InstanceLimits, Ipv4UnitKind, NetworkInterface, Subnet

# Tags on the ENIs ipamd creates: the keys VPC CNI uses, so operators' tooling and IAM conditions
# written for VPC CNI keep working, and ENI GC can find ours by tag instead of scanning the VPC.
TAG_INSTANCE_ID = "node.k8s.amazonaws.com/instance_id"
TAG_CREATED_AT = "node.k8s.amazonaws.com/createdAt"
TAG_CLUSTER_NAME = "cluster.k8s.amazonaws.com/name"
TAG_MANAGED_BY = "ipamd.k8s.aws/managed-by"
MANAGED_BY = "ipamd"


class CallUrgency(enum.Enum):
    """Whether something waits on an EC2 call, which decides what a throttle answer does to it."""

    FOREGROUND = "foreground"
    """A pod waits on it (or start-up, or an operator): a throttled call is retried, with backoff, as
    every other retryable error."""
    BACKGROUND = "background"
    """Nothing waits on it (a warm pool's top-up, addresses given back, DeleteOnTermination, the
    reconcilers): a throttled call is not retried; its caller holds its work back instead, so the
    account's tokens go to the calls something waits on. Other retryable errors are retried."""


@dataclass(frozen=True, slots=True)
class Instance:
    instance_id: str
    instance_type: str
    subnet_id: str
    security_groups: tuple[str, ...]
    availability_zone: str = ""
    private_ip: str = ""
    """The primary private IPv4 address of the instance (of its primary ENI)."""
    vpc_id: str = ""


class Ec2Api(Protocol):
    """ENIs and their addresses."""

    def with_urgency(self, urgency: CallUrgency) -> Ec2Api:
        """This adapter, its calls made under `urgency`: a view sharing all else (the client, the
        token buckets, the locks); the adapter itself calls under `CallUrgency.FOREGROUND`."""
        ...

    async def describe_enis(self, instance_id: str) -> tuple[NetworkInterface, ...]:
        """Every ENI attached to the instance, with its addresses and prefixes, by device index."""
        ...

    async def create_eni(
        self,
        subnet_id: str,
        security_groups: Sequence[str],
        description: str,
        tags: Mapping[str, str],
        *,
        kind: Ipv4UnitKind = "ip",
        count: int = 0,
    ) -> NetworkInterface:
        """A new ENI holding `count` units of `kind` besides its primary address, assigned in the
        same call (one mutation fewer than an assign after the attach); the answer lists them."""
        ...

    async def attach_eni(self, eni_id: str, instance_id: str, device_index: int) -> str:
        """Attach; returns the attachment ID. DeleteOnTermination starts false, as EC2 attaches:
        `set_delete_on_termination` sets it."""
        ...

    async def set_delete_on_termination(self, eni_id: str, attachment_id: str) -> None:
        """Make the attachment go with the instance (setting it twice is setting it once)."""
        ...

    async def detach_eni(self, attachment_id: str) -> None: ...

    async def delete_eni(self, eni_id: str) -> None: ...

    async def assign_units(self, eni_id: str, kind: Ipv4UnitKind, count: int) -> tuple[str, ...]:
        """Ask EC2 for `count` more units; returns the CIDRs newly assigned (and only those)."""
        ...

    async def unassign_units(
        self, eni_id: str, kind: Ipv4UnitKind, cidrs: Sequence[str]
    ) -> None: ...

    async def assign_ipv6_prefix(self, eni_id: str) -> str:
        """Give the ENI one more IPv6 /80 prefix from its subnet's /64 (AssignIpv6Addresses with
        Ipv6PrefixCount 1, as IPv6 mode does once at node set-up); returns the prefix EC2 assigned.
        A subnet without an IPv6 CIDR block is refused (`Rejected`). There is no release: IPv6 mode
        never gives its prefix back."""
        ...

    async def find_enis(
        self, tags: Mapping[str, str], *, available_only: bool = False
    ) -> tuple[NetworkInterface, ...]:
        """ENIs carrying all of `tags` (a tag-scoped query, never a VPC scan); attached or not, or
        only detached ones (status `available`, filtered by EC2) with `available_only`."""
        ...


class Ec2Catalog(Protocol):
    """Facts about the instance and its network that change rarely."""

    def with_urgency(self, urgency: CallUrgency) -> Ec2Catalog:
        """This adapter, its calls made under `urgency` (`Ec2Api.with_urgency`)."""
        ...

    async def describe_instance(self, instance_id: str) -> Instance: ...

    async def instance_limits(self, instance_type: str) -> InstanceLimits: ...

    async def subnet(self, subnet_id: str) -> Subnet: ...

    async def subnets_in(self, vpc_id: str, availability_zone: str) -> tuple[Subnet, ...]:
        """Every subnet of the VPC in the zone, with its tags and free addresses (one
        DescribeSubnets filtered by EC2 on both, a call per page), by subnet ID."""
        ...


@dataclass(frozen=True, slots=True)
class ImdsIdentity:
    instance_id: str
    instance_type: str
    region: str
    availability_zone: str
    macs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ImdsInterface:
    """One ENI as the instance metadata service describes it (a hint: it lags EC2)."""

    mac: str
    eni_id: str
    device_number: int
    subnet_id: str
    local_ipv4s: tuple[str, ...]
    """Every private IPv4 address of the ENI, the primary first, host form."""
    ipv4_prefixes: tuple[str, ...]
    """Delegated /28 prefixes, CIDR form; empty when none (IMDS answers 404)."""
    ipv6_prefixes: tuple[str, ...] = ()
    """Delegated IPv6 /80 prefixes, CIDR form (`ipv6-prefix`); empty when none (IMDS answers 404).
    The embedded IMDS serves them; `cloud.imds`'s client reads them in IPv6 mode."""


class Imds(Protocol):
    """IMDSv2, read-only. Raises `CloudError` subclasses (`ServiceUnavailable`, `CallTimeout`,
    `NotFound`)."""

    async def identity(self) -> ImdsIdentity: ...

    async def interfaces(self) -> tuple[ImdsInterface, ...]: ...


class ImdsNetwork(Protocol):
    """Facts of the VPC that IMDS serves and EC2 would need another permission for."""

    async def vpc_cidrs(self, mac: str) -> tuple[str, ...]:
        """The IPv4 CIDR blocks of the VPC of the ENI with `mac`."""
        ...
