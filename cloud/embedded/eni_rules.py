"""EC2's rules for ENI addresses, prefixes and attachments, applied to moto's live objects.

`cloud.embedded.moto_ext` calls these from its patches; they decide under `LOCK`, raise EC2's error
codes as moto exceptions, and mutate moto's ENIs only once every check has passed (all or nothing, as
EC2 does). This module never patches anything itself.
"""

from __future__ import annotations

import ipaddress
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from moto.ec2.exceptions import EC2ClientError
from moto.ec2.models.instances import Instance
from moto.moto_api._internal import mock_random

from cloud.embedded import space_watch
from cloud.embedded.eni_limits import limits_for, unattached_ipv4_limit
from cloud.embedded.moto_index import subnet_enis, table
from cloud.embedded.subnet_space import SpaceExhausted, SubnetSpace, prefix_addresses

LOCK = threading.RLock()
"""moto serves requests from several threads (its server is threaded; ipamd calls boto3 from worker
threads). Every patched operation decides and mutates under this one lock, so two concurrent draws
never pick the same address."""

PREFIXES_ATTR = "_ipamd_ipv4_prefixes"
"""Where a moto ENI keeps its delegated /28 prefixes (CIDR strings); moto has no such field."""


def ec2_error(code: str, message: str) -> Exception:
    """An error moto serialises as EC2 does: HTTP 400 with `code` and `message`."""
    error: Exception = EC2ClientError(code, message)
    return error


# -- reading moto's objects --------------------------------------------------------------------


def eni_prefixes(eni: Any) -> list[str]:
    """The ENI's delegated prefixes (the live list, for mutation under LOCK)."""
    prefixes: list[str] = space_watch.watched_list(eni, PREFIXES_ATTR)
    return prefixes


def eni_addresses(eni: Any) -> list[str]:
    return [str(entry["PrivateIpAddress"]) for entry in eni.private_ip_addresses]


def eni_secondaries(eni: Any) -> list[str]:
    primary = eni.private_ip_address
    return [a for a in eni_addresses(eni) if a != primary]


def used_slots(eni: Any) -> int:
    """Ipv4AddressesPerInterface slots in use: the primary, each secondary, each prefix."""
    return len(eni.private_ip_addresses) + len(eni_prefixes(eni))


def slot_limit(eni: Any) -> int:
    instance = eni.instance
    if instance is not None:
        limits = limits_for(instance.instance_type)
        if limits is not None:
            return limits.ipv4_per_eni
    return unattached_ipv4_limit()


@lru_cache(maxsize=1 << 20)
def _as_int(address: str) -> int | None:
    """The address as an integer (memoised: every assign reads every address of its subnet, and
    parsing one costs far more than looking it up)."""
    try:
        return int(ipaddress.IPv4Address(address))
    except ValueError:
        return None  # moto's VPC endpoints and IPv6-only resources store other strings


@lru_cache(maxsize=1 << 16)
def _prefix_range(prefix: str) -> range:
    return prefix_addresses(ipaddress.IPv4Network(prefix))


def _ints(addresses: Iterable[str]) -> set[int]:
    return {v for v in (_as_int(a) for a in addresses) if v is not None}


def subnet_space(subnet: Any) -> SubnetSpace:
    """The subnet's space as it is now: every ENI address and prefix, and moto's own claims
    (`Subnet._subnet_ips`: instance primaries not yet on an ENI, EFS mount targets, ...). The
    caller's to draw from: drawing marks addresses in it, not in moto."""
    network, occupied, _ = _kept_space(subnet)
    return SubnetSpace(network, set(occupied))


def subnet_counts(subnet: Any) -> tuple[int, int]:
    """(usable, free) addresses of the subnet as it is now."""
    network, _, free = _kept_space(subnet)
    return SubnetSpace(network).usable_count, free


def _kept_space(subnet: Any) -> space_watch.Kept:
    indexed = table(subnet.ec2_backend) is not None
    return space_watch.kept_space(subnet, lambda: _occupied(subnet), indexed=indexed)


def _occupied(subnet: Any) -> set[int]:
    occupied: set[int] = set()
    for eni in subnet_enis(subnet):
        occupied |= _ints(eni_addresses(eni))
        for prefix in eni_prefixes(eni):
            occupied.update(_prefix_range(prefix))
    occupied |= _ints(subnet._subnet_ips)
    return occupied


def rng() -> Any:
    """moto's random source, so `POST /moto-api/seed` makes our draws repeatable too."""
    return mock_random


# -- checks ------------------------------------------------------------------------------------


def check_slots(eni: Any, adding: int) -> None:
    """EC2 API reference, AssignPrivateIpAddresses; EC2 User Guide, "IP addresses per network interface
    per instance type": secondary addresses and prefixes share Ipv4AddressesPerInterface slots."""
    if adding > 0 and used_slots(eni) + adding > slot_limit(eni):
        raise ec2_error(
            "PrivateIpAddressLimitExceeded", "Number of private addresses will exceed limit."
        )


def check_free_address(
    space: SubnetSpace, subnet: Any, address: str, *, launching: bool = False
) -> int:
    """An address a caller names must be a valid IPv4 address inside the subnet, not one of the five
    EC2 reserves, and not in use by any ENI or prefix in the subnet (EC2 User Guide, "Subnet CIDR
    blocks"; EC2 API reference, error codes: InvalidIPAddress.InUse). With `launching`, an address
    moto set aside for an instance being launched (in `Subnet._subnet_ips`, on no ENI yet) is the
    one that instance's primary ENI is about to take, not a conflict."""
    value = _as_int(address)
    if value is None:
        raise ec2_error("InvalidParameterValue", f"Invalid private IP address {address!r}")
    if not space.contains(value):
        raise ec2_error(
            "InvalidParameterValue",
            f"Address {address} does not fall within the subnet's address range {subnet.cidr_block}",
        )
    if space.is_reserved(value):
        raise ec2_error("InvalidParameterValue", f"Address {address} is reserved in {subnet.id}")
    if value in space.occupied and not (launching and _pending_launch(subnet, address)):
        raise ec2_error("InvalidIPAddress.InUse", f"Address {address} is in use.")
    return value


def _pending_launch(subnet: Any, address: str) -> bool:
    if not isinstance(subnet._subnet_ips.get(address), Instance):
        return False
    return all(address not in eni_addresses(eni) for eni in subnet_enis(subnet))


def check_prefix(space: SubnetSpace, prefix: str) -> ipaddress.IPv4Network:
    """EC2 User Guide, "Assign prefixes to network interfaces": a named prefix is an aligned /28 of the
    subnet that overlaps no address in use and no reserved address."""
    try:
        network = ipaddress.IPv4Network(prefix)
    except ValueError:
        raise ec2_error("InvalidParameterValue", f"Invalid IPv4 prefix {prefix!r}") from None
    problem = space.check_prefix(network)
    if problem is not None:
        raise ec2_error("InvalidParameterValue", f"Invalid IPv4 prefix: {problem}")
    return network


def draw_addresses(space: SubnetSpace, count: int) -> list[str]:
    """EC2 API reference, error codes: InsufficientFreeAddressesInSubnet (moto loops forever here)."""
    try:
        return [str(a) for a in space.draw_addresses(count, rng())]
    except SpaceExhausted:
        raise ec2_error(
            "InsufficientFreeAddressesInSubnet",
            "The specified subnet does not have enough free addresses to satisfy the request.",
        ) from None


def draw_prefixes(space: SubnetSpace, count: int) -> list[str]:
    """EC2 API reference, error codes: InsufficientCidrBlocks — no free aligned /28 is left."""
    try:
        return [str(p) for p in space.draw_prefixes(count, rng())]
    except SpaceExhausted:
        raise ec2_error(
            "InsufficientCidrBlocks",
            "The specified subnet does not have enough contiguous free space for the requested prefixes.",
        ) from None


# -- operations --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Assigned:
    """What one AssignPrivateIpAddresses call added, and only that (EC2 answers with these)."""

    addresses: tuple[str, ...]
    prefixes: tuple[str, ...]


def assign(
    eni: Any,
    *,
    addresses: Sequence[str] = (),
    count: int = 0,
    prefixes: Sequence[str] = (),
    prefix_count: int = 0,
    allow_reassignment: bool = False,
) -> Assigned:
    """AssignPrivateIpAddresses: named or counted secondary addresses and /28 prefixes, all or none.
    Naming an address the ENI already holds is accepted and changes nothing (as moto did)."""
    with LOCK:
        subnet = eni.subnet
        space = subnet_space(subnet)
        held = set(eni_addresses(eni))
        named = [a for a in dict.fromkeys(addresses) if a not in held]
        check_slots(eni, len(named) + count + len(prefixes) + prefix_count)
        moved = _claim_named(space, eni, named, allow_reassignment)
        new_addresses = named + draw_addresses(space, count)
        named_prefixes = [str(check_prefix(space, p)) for p in dict.fromkeys(prefixes)]
        for prefix in named_prefixes:
            space.claim(prefix_addresses(ipaddress.IPv4Network(prefix)))
        new_prefixes = named_prefixes + draw_prefixes(space, prefix_count)
        # Every check passed: now change moto's state.
        for other, address in moved:
            other.private_ip_addresses[:] = [
                e for e in other.private_ip_addresses if e["PrivateIpAddress"] != address
            ]
        eni.private_ip_addresses.extend(
            {"Primary": False, "PrivateIpAddress": a} for a in new_addresses
        )
        eni_prefixes(eni).extend(new_prefixes)
        return Assigned(tuple(new_addresses), tuple(new_prefixes))


@dataclass(frozen=True, slots=True)
class NewEni:
    """The addresses and prefixes an ENI about to be created will hold."""

    primary: str
    secondaries: tuple[str, ...]
    prefixes: tuple[str, ...]


def plan_new_eni(
    subnet: Any,
    *,
    primary: str | None,
    secondaries: Sequence[str] = (),
    count: int = 0,
    prefixes: Sequence[str] = (),
    prefix_count: int = 0,
    strict: bool = True,
) -> NewEni:
    """CreateNetworkInterface (EC2 API reference): a named primary must be free, an unnamed one is
    drawn; secondaries and prefixes follow AssignPrivateIpAddresses' rules. Call under LOCK and create
    the ENI before releasing it.

    `strict=False` is for ENIs moto creates for its other services (VPC endpoints name a random
    address that may lie outside the subnet): an unusable named primary is replaced by a drawn one
    instead of failing the call."""
    space = subnet_space(subnet)
    slots = 1 + len(secondaries) + count + len(prefixes) + prefix_count
    if slots > unattached_ipv4_limit():
        raise ec2_error(
            "PrivateIpAddressLimitExceeded", "Number of private addresses will exceed limit."
        )
    if primary is not None and not strict and not _usable(space, subnet, primary):
        primary = None
    # Named addresses and prefixes first, so nothing drawn can collide with them.
    if primary is not None:
        space.claim([check_free_address(space, subnet, primary, launching=True)])
    for address in secondaries:
        space.claim([check_free_address(space, subnet, address)])
    named_prefixes = [str(check_prefix(space, p)) for p in dict.fromkeys(prefixes)]
    for prefix in named_prefixes:
        space.claim(prefix_addresses(ipaddress.IPv4Network(prefix)))
    if primary is None:
        primary = draw_addresses(space, 1)[0]
    drawn = draw_addresses(space, count)
    drawn_prefixes = draw_prefixes(space, prefix_count)
    return NewEni(primary, (*secondaries, *drawn), (*named_prefixes, *drawn_prefixes))


def _usable(space: SubnetSpace, subnet: Any, address: str) -> bool:
    value = _as_int(address)
    if value is None or not space.contains(value) or space.is_reserved(value):
        return False
    return value not in space.occupied or _pending_launch(subnet, address)


def _claim_named(
    space: SubnetSpace, eni: Any, named: Sequence[str], allow_reassignment: bool
) -> list[tuple[Any, str]]:
    """Check named secondaries; with AllowReassignment a secondary of another ENI in the subnet moves
    here (EC2 API reference, AssignPrivateIpAddresses, AllowReassignment). Returns the moves."""
    moves: list[tuple[Any, str]] = []
    holders = {a: other for other in subnet_enis(eni.subnet) for a in eni_secondaries(other)}
    for address in named:
        holder = holders.get(address)
        if allow_reassignment and holder is not None and holder is not eni:
            moves.append((holder, address))
            continue
        space.claim([check_free_address(space, eni.subnet, address)])
    return moves


def unassign(eni: Any, addresses: Sequence[str], prefixes: Sequence[str]) -> None:
    """UnassignPrivateIpAddresses: every named address and prefix must be the ENI's (else nothing
    changes), and the primary address cannot be unassigned (EC2 API reference,
    UnassignPrivateIpAddresses)."""
    with LOCK:
        if eni.private_ip_address in addresses:
            raise ec2_error(
                "InvalidParameterValue",
                f"Value ({eni.private_ip_address}) for parameter privateIpAddress is invalid. "
                "The primary IP address of an interface cannot be unassigned.",
            )
        secondaries = set(eni_secondaries(eni))
        held_prefixes = set(eni_prefixes(eni))
        if any(a not in secondaries for a in addresses) or any(
            p not in held_prefixes for p in prefixes
        ):
            raise ec2_error(
                "InvalidParameterValue",
                f"Some of the specified addresses are not assigned to interface {eni.id}",
            )
        gone_addresses, gone_prefixes = set(addresses), set(prefixes)
        eni.private_ip_addresses[:] = [
            e for e in eni.private_ip_addresses if e["PrivateIpAddress"] not in gone_addresses
        ]
        eni_prefixes(eni)[:] = [p for p in eni_prefixes(eni) if p not in gone_prefixes]


def check_attach(eni: Any, instance: Any, device_index: int) -> None:
    """AttachNetworkInterface as EC2 refuses it (EC2 API reference, AttachNetworkInterface and error
    codes; EC2 User Guide, "Maximum IP addresses per network interface"):
    an ENI attached elsewhere → InvalidNetworkInterface.InUse; an ENI whose subnet is in another
    availability zone than the instance → InvalidParameterCombination (EC2 User Guide, "Network
    interfaces": both must be in the same zone); a device index the instance already uses →
    InvalidParameterValue; one ENI beyond the type's MaximumNetworkInterfaces →
    AttachmentLimitExceeded; an ENI holding more slots than the type allows per ENI →
    PrivateIpAddressLimitExceeded (our choice of code: EC2 checks the unattached ENI's addresses
    against the instance type only at this point)."""
    if eni.attachment_id is not None:
        raise ec2_error("InvalidNetworkInterface.InUse", f"Interface: [{eni.id}] in use.")
    if eni.subnet.availability_zone != instance.placement.zone:
        raise ec2_error(
            "InvalidParameterCombination",
            "You may not attach a network interface to an instance if they are not in the same "
            "availability zone",
        )
    attached = [nic for nic in instance.nics.values() if nic.instance is instance]
    if any(nic.device_index == device_index for nic in attached):
        raise ec2_error(
            "InvalidParameterValue",
            f"Instance '{instance.id}' already has an interface attached at device index "
            f"'{device_index}'.",
        )
    limits = limits_for(instance.instance_type)
    if limits is None:
        return
    if len(attached) + 1 > limits.max_enis:
        raise ec2_error(
            "AttachmentLimitExceeded",
            f"Interface count {len(attached) + 1} exceeds the limit for {instance.instance_type}",
        )
    if used_slots(eni) > limits.ipv4_per_eni:
        raise ec2_error(
            "PrivateIpAddressLimitExceeded", "Number of private addresses will exceed limit."
        )
