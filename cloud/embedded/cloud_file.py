"""The embedded cloud's file: what EC2 holds for one world, as JSON, written atomically.

It owns the record (`CloudFacts`: VPC and its CIDR blocks, the node's subnet and the VPC's other
subnets with their tags and IPv6 blocks, security group, instance, and every ENI of the VPC with its
MAC, addresses, IPv4 and IPv6 prefixes, tags and attachment), its JSON form, and its reading and
writing; the write replaces the file whole (`datastore.atomic`, mode 0600), so a kill at any instant
leaves the old file or the new one, never a torn one. It must not import moto: reading moto's
objects and rebuilding them is `cloud.embedded.cloud_restore`'s job.

A file that cannot be read or makes no sense raises `CloudFileError`; nobody is supposed to edit it,
and guessing a new cloud would make the daemon's state file foreign (every allocation quarantined).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from datastore import atomic

FORMAT: Final = 2
"""The file's format version; a file of another version is refused, not guessed at. Format 2 added
the VPC's secondary CIDR blocks and its subnets besides the node's (with tags)."""
IPV6_FORMAT: Final = 3
"""The format of a world with IPv6 (the VPC's /56, the subnets' /64s, the ENIs' /80 prefixes): an
ipamd that reads only format 2 refuses it rather than lose them. A world without IPv6 is written
in format 2, as before."""
READABLE: Final = (1, 2, 3)
"""Formats this ipamd reads: a format 1 file is a VPC with the node's subnet only, untagged."""

FILE_MODE: Final = 0o600


class CloudFileError(Exception):
    """The cloud file cannot be read, written, or understood."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"embedded cloud file {path}: {reason}")
        self.path = path
        self.reason = reason


@dataclass(frozen=True, slots=True)
class AttachmentFacts:
    attachment_id: str
    instance_id: str
    device_index: int
    delete_on_termination: bool


@dataclass(frozen=True, slots=True)
class EniFacts:
    """One network interface as DescribeNetworkInterfaces shows it, with what ipamd reads of it."""

    eni_id: str
    mac: str
    subnet_id: str
    primary_ip: str
    secondary_ips: tuple[str, ...] = ()
    """In the order EC2 lists them."""
    prefixes: tuple[str, ...] = ()
    ipv6_prefixes: tuple[str, ...] = ()
    """Delegated IPv6 /80s, in the order EC2 lists them."""
    description: str = ""
    group_ids: tuple[str, ...] = ()
    tags: Mapping[str, str] = field(default_factory=dict)
    attachment: AttachmentFacts | None = None


@dataclass(frozen=True, slots=True)
class SubnetFacts:
    """A subnet of the VPC other than the node's."""

    subnet_id: str
    cidr: str
    availability_zone: str
    tags: Mapping[str, str] = field(default_factory=dict)
    ipv6_cidr: str = ""


@dataclass(frozen=True, slots=True)
class CloudFacts:
    """One world: a VPC with the node's subnet and a security group, a running instance, the VPC's
    ENIs (the instance's primary ENI first, then in the order EC2 created them); the VPC's secondary
    CIDR blocks and other subnets, in the order they are to be rebuilt."""

    region: str
    vpc_id: str
    vpc_cidr: str
    subnet_id: str
    subnet_cidr: str
    availability_zone: str
    security_group_id: str
    security_group_name: str
    instance_id: str
    instance_type: str
    primary_eni_id: str
    enis: tuple[EniFacts, ...]
    instance_tags: Mapping[str, str] = field(default_factory=dict)
    secondary_cidrs: tuple[str, ...] = ()
    subnet_tags: Mapping[str, str] = field(default_factory=dict)
    """The node subnet's tags."""
    subnets: tuple[SubnetFacts, ...] = ()
    vpc_ipv6_cidr: str = ""
    """The VPC's Amazon-provided IPv6 /56, or "" (then no subnet has an IPv6 block)."""
    subnet_ipv6_cidr: str = ""
    """The node subnet's IPv6 /64, or ""."""

    def to_json(self) -> str:
        body = {"format": IPV6_FORMAT if self.vpc_ipv6_cidr else FORMAT, **_plain(self)}
        return json.dumps(body, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, path: Path) -> CloudFacts:
        """Parse a file's text; raises `CloudFileError` naming what is wrong."""
        try:
            body = json.loads(text)
            if not isinstance(body, dict):
                raise TypeError("not a JSON object")
            found = body.get("format")
            if type(found) is not int or found not in READABLE:  # JSON true is no format 1
                raise CloudFileError(path, f"format {found!r}, this ipamd reads formats {READABLE}")
            scalars = {name: str(body[name]) for name in _SCALARS}
            facts = cls(
                enis=tuple(_eni(e) for e in body["enis"]),
                instance_tags=_tags(body.get("instance_tags", {})),
                secondary_cidrs=tuple(str(c) for c in body.get("secondary_cidrs", ())),
                subnet_tags=_tags(body.get("subnet_tags", {})),
                subnets=tuple(_subnet(s) for s in body.get("subnets", ())),
                vpc_ipv6_cidr=str(body.get("vpc_ipv6_cidr", "")),
                subnet_ipv6_cidr=str(body.get("subnet_ipv6_cidr", "")),
                **scalars,
            )
        except CloudFileError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            raise CloudFileError(path, f"unreadable ({type(err).__name__}: {err})") from err
        problem = facts.problem()
        if problem is not None:
            raise CloudFileError(path, problem)
        return facts

    def problem(self) -> str | None:
        """What makes this record not a world, or None."""
        primary = next((e for e in self.enis if e.eni_id == self.primary_eni_id), None)
        if primary is None or primary.attachment is None:
            return f"the instance's primary ENI {self.primary_eni_id} is missing or detached"
        if primary.attachment.device_index != 0:
            return f"the primary ENI {self.primary_eni_id} is not at device index 0"
        ids = [e.eni_id for e in self.enis]
        if len(set(ids)) != len(ids):
            return "an ENI is listed twice"
        subnet_ids = [self.subnet_id, *(s.subnet_id for s in self.subnets)]
        if len(set(subnet_ids)) != len(subnet_ids):
            return "a subnet is listed twice"
        stray = next((e for e in self.enis if e.subnet_id not in subnet_ids), None)
        if stray is not None:
            return f"ENI {stray.eni_id} is in subnet {stray.subnet_id}, which the record lacks"
        indexes = [e.attachment.device_index for e in self.enis if e.attachment is not None]
        if len(set(indexes)) != len(indexes):
            return "two ENIs share a device index"
        return None


_SCALARS: Final = (
    "region",
    "vpc_id",
    "vpc_cidr",
    "subnet_id",
    "subnet_cidr",
    "availability_zone",
    "security_group_id",
    "security_group_name",
    "instance_id",
    "instance_type",
    "primary_eni_id",
)


def _plain(facts: CloudFacts) -> dict[str, Any]:
    body: dict[str, Any] = {name: getattr(facts, name) for name in _SCALARS}
    body["instance_tags"] = dict(facts.instance_tags)
    body["secondary_cidrs"] = list(facts.secondary_cidrs)
    body["subnet_tags"] = dict(facts.subnet_tags)
    body["subnets"] = [
        {
            "subnet_id": s.subnet_id,
            "cidr": s.cidr,
            "availability_zone": s.availability_zone,
            "tags": dict(s.tags),
            **({"ipv6_cidr": s.ipv6_cidr} if facts.vpc_ipv6_cidr else {}),
        }
        for s in facts.subnets
    ]
    if facts.vpc_ipv6_cidr:
        body["vpc_ipv6_cidr"] = facts.vpc_ipv6_cidr
        body["subnet_ipv6_cidr"] = facts.subnet_ipv6_cidr
    body["enis"] = [
        {
            "eni_id": e.eni_id,
            "mac": e.mac,
            "subnet_id": e.subnet_id,
            "primary_ip": e.primary_ip,
            "secondary_ips": list(e.secondary_ips),
            "prefixes": list(e.prefixes),
            **({"ipv6_prefixes": list(e.ipv6_prefixes)} if facts.vpc_ipv6_cidr else {}),
            "description": e.description,
            "group_ids": list(e.group_ids),
            "tags": dict(e.tags),
            "attachment": None
            if e.attachment is None
            else {
                "attachment_id": e.attachment.attachment_id,
                "instance_id": e.attachment.instance_id,
                "device_index": e.attachment.device_index,
                "delete_on_termination": e.attachment.delete_on_termination,
            },
        }
        for e in facts.enis
    ]
    return body


def _tags(body: Mapping[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in body.items()}


def _subnet(body: Mapping[str, Any]) -> SubnetFacts:
    return SubnetFacts(
        subnet_id=str(body["subnet_id"]),
        cidr=str(body["cidr"]),
        availability_zone=str(body["availability_zone"]),
        tags=_tags(body.get("tags", {})),
        ipv6_cidr=str(body.get("ipv6_cidr", "")),
    )


def _eni(body: Mapping[str, Any]) -> EniFacts:
    raw = body.get("attachment")
    attachment = (
        None
        if raw is None
        else AttachmentFacts(
            attachment_id=str(raw["attachment_id"]),
            instance_id=str(raw["instance_id"]),
            device_index=int(raw["device_index"]),
            delete_on_termination=bool(raw["delete_on_termination"]),
        )
    )
    return EniFacts(
        eni_id=str(body["eni_id"]),
        mac=str(body["mac"]),
        subnet_id=str(body["subnet_id"]),
        primary_ip=str(body["primary_ip"]),
        secondary_ips=tuple(str(a) for a in body.get("secondary_ips", ())),
        prefixes=tuple(str(p) for p in body.get("prefixes", ())),
        ipv6_prefixes=tuple(str(p) for p in body.get("ipv6_prefixes", ())),
        description=str(body.get("description", "")),
        group_ids=tuple(str(g) for g in body.get("group_ids", ())),
        tags=_tags(body.get("tags", {})),
        attachment=attachment,
    )


def load(path: Path) -> CloudFacts | None:
    """The record at `path`, or None if there is no file (a new node). Raises `CloudFileError`."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as err:
        raise CloudFileError(path, f"cannot read: {err}") from err
    return CloudFacts.from_json(text, path)


def save(path: Path, text: str) -> None:
    """Replace the file at `path` with `text`, atomically and durably. Raises `CloudFileError`."""
    try:
        atomic.replace(path, text.encode("utf-8"), FILE_MODE)
    except OSError as err:
        raise CloudFileError(path, f"cannot write: {err}") from err
