"""Extends moto's EC2 (exactly version 5.2.5) with the EC2 behaviour ipamd depends on and moto lacks.

`install()` patches moto's classes in place, once per process; the in-process `mock_aws` and a moto
server thread in the same process both see the patches. The rules live in `cloud.embedded.eni_rules`,
the request handlers in `cloud.embedded.moto_handlers`; this module hooks them in. It must not change
behaviour EC2 and moto already agree on, nor add behaviour EC2 does not have. Each test in
`tests/contract/` proves one patch against EC2's documented behaviour.

Hook (moto 5.2.5)                                   EC2 behaviour reproduced
--------------------------------------------------  ---------------------------------------------------
NetworkInterface.ipv4_prefixes (new property)        DescribeNetworkInterfaces/DescribeInstances show
                                                     the ENI's delegated /28 prefixes (Ipv4Prefixes).
ElasticNetworkInterfaces.assign_private_ip_addresses AssignPrivateIpAddresses: Ipv4Prefixes,
  + NetworkInterfaceBackend.assign_private_ip_...    Ipv4PrefixCount, AllowReassignment; per-ENI slot
                                                     limit; subnet-wide uniqueness; reserved and
                                                     out-of-subnet addresses refused; exhaustion errors;
                                                     the answer lists only what was assigned.
NetworkInterface.ipv6_prefixes (new property)        DescribeNetworkInterfaces shows the ENI's /80s.
ElasticNetworkInterfaces.assign_ipv6_addresses      AssignIpv6Addresses: Ipv6Prefixes, Ipv6PrefixCount;
                                                     /80s of the subnet's /64, unique in the subnet;
                                                     refused without an IPv6 CIDR block
                                                     (`cloud.embedded.ipv6_rules`).
ElasticNetworkInterfaces.unassign_private_ip_...     UnassignPrivateIpAddresses: Ipv4Prefixes; an
  + NetworkInterfaceBackend.unassign_private_ip_...  address or prefix the ENI lacks, or its primary,
                                                     is refused and nothing changes.
ElasticNetworkInterfaces.create_network_interface    CreateNetworkInterface: Ipv4Prefixes,
  + NetworkInterfaceBackend.create_network_interface Ipv4PrefixCount; the primary and secondaries obey
                                                     the same address rules (also for RunInstances).
Subnet.get_available_subnet_ip, Subnet.request_ip    Instance primaries (RunInstances) obey the same
                                                     rules instead of moto's own counter.
Subnet.ipv6_cidr_block_association_set              DescribeSubnets: Ipv6CidrBlockState.State is
                                                     the state's name (moto nested a dict in it).
Subnet.available_ip_address_count                   AvailableIpAddressCount counts every address in
                                                     use, 16 per delegated prefix.
NetworkInterfaceBackend.attach_network_interface     AttachmentLimitExceeded, device index in use,
                                                     InvalidNetworkInterface.InUse, per-ENI limit,
                                                     an ENI of another zone refused
                                                     (InvalidParameterCombination);
                                                     DeleteOnTermination starts false.
NetworkInterfaceBackend.detach_network_interface     The primary ENI (device index 0) cannot be
                                                     detached.
ElasticNetworkInterfaces.delete_network_interface    Deleting an attached ENI → InvalidNetworkInterface
  + NetworkInterfaceBackend.delete_network_interface .InUse; a deleted ENI's addresses become free.
ElasticNetworkInterfaces.modify_network_interface_   Attachment.DeleteOnTermination is recorded and
  attribute                                          shown by Describe.
Instance.terminate                                   ENIs without DeleteOnTermination are detached and
                                                     stay available when their instance terminates.

Lookups moto makes by scanning every ENI or instance of the account are indexed
(`cloud.embedded.moto_index`): the same answers, at a cost that does not grow with the account.

Not modelled: network cards other than 0, prefix delegation being Nitro-only, subnet CIDR reservations
steering prefix placement, eventual consistency.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Sequence
from typing import Any, Final

from moto.ec2.models.elastic_network_interfaces import NetworkInterface, NetworkInterfaceBackend
from moto.ec2.models.instances import Instance
from moto.ec2.models.subnets import Subnet
from moto.ec2.responses.elastic_network_interfaces import ElasticNetworkInterfaces

from cloud.embedded import eni_rules, ipv6_rules, moto_handlers, moto_index, space_watch
from cloud.embedded.eni_rules import LOCK, ec2_error
from cloud.embedded.moto_handlers import STRICT

MOTO_VERSION: Final = "5.2.5"

_installed: set[str] = set()
"""Holds MOTO_VERSION once the patches are in place."""


def install() -> None:
    """Patch moto's EC2 in this process. Idempotent; raises RuntimeError on any other moto version,
    whose internals the patches were not written against."""
    with LOCK:
        if _installed:
            return
        found = importlib.metadata.version("moto")
        if found != MOTO_VERSION:
            raise RuntimeError(f"cloud.embedded.moto_ext needs moto {MOTO_VERSION}, found {found}")
        moto_index.install()
        space_watch.install()
        for owner, name, make in _PATCHES:
            setattr(owner, name, make(owner.__dict__[name]))
        setattr(NetworkInterface, "ipv4_prefixes", property(_ipv4_prefixes))  # noqa: B010
        setattr(NetworkInterface, "ipv6_prefixes", property(_ipv6_prefixes))  # noqa: B010
        _installed.add(found)


def installed() -> bool:
    return bool(_installed)


# -- models ------------------------------------------------------------------------------------


def _ipv4_prefixes(eni: Any) -> list[dict[str, str]]:
    """Read by moto's serializer for the NetworkInterface shape's Ipv4Prefixes member."""
    return [{"Ipv4Prefix": prefix} for prefix in eni_rules.eni_prefixes(eni)]


def _ipv6_prefixes(eni: Any) -> list[dict[str, str]]:
    """Read by moto's serializer for the NetworkInterface shape's Ipv6Prefixes member."""
    return [{"Ipv6Prefix": prefix} for prefix in ipv6_rules.eni_ipv6_prefixes(eni)]


def _ipv6_cidr_block_association_set(_original: Any) -> Any:
    """EC2 API reference, SubnetIpv6CidrBlockAssociation: Ipv6CidrBlockState's State is a string
    (`associated`); moto put its own state dictionary there, which serialised as text."""

    def fget(subnet: Any) -> list[dict[str, Any]]:
        return [
            {
                "ipv6CidrBlock": a["ipv6CidrBlock"],
                "associationId": a["associationId"],
                "ipv6CidrBlockState": {"state": a["ipv6CidrBlockState"]["State"]},
            }
            for a in subnet.ipv6_cidr_block_associations.values()
            if a["ipv6CidrBlockState"]["State"] == "associated"
        ]

    return property(fget)


def _available_ip_address_count(original: Any) -> Any:
    """EC2 API reference, DescribeSubnets: AvailableIpAddressCount, less 16 per delegated prefix."""

    def fget(subnet: Any) -> int:
        if not subnet.cidr_block:
            return int(original.fget(subnet))
        with LOCK:
            usable, free = eni_rules.subnet_counts(subnet)
        # moto's base is the usable count less prefix-type CIDR reservations.
        base = int(subnet._available_ip_addresses)
        return base - (usable - free)

    return property(fget)


def _get_available_subnet_ip(original: Callable[..., str]) -> Callable[..., str]:
    """EC2 API reference, RunInstances: the primary is a free, unreserved address of the subnet;
    InsufficientFreeAddressesInSubnet when none is left (moto raised StopIteration)."""

    def get_available_subnet_ip(subnet: Any, instance: Any) -> str:
        if not subnet.cidr_block:
            return original(subnet, instance)
        with LOCK:
            address = eni_rules.draw_addresses(eni_rules.subnet_space(subnet), 1)[0]
            subnet._subnet_ips[address] = instance
            return address

    return get_available_subnet_ip


def _request_ip(original: Callable[..., None]) -> Callable[..., None]:
    """EC2 API reference, RunInstances (PrivateIpAddress) and error codes: InvalidIPAddress.InUse or
    InvalidParameterValue instead of moto's bare Exception (an HTTP 500)."""

    def request_ip(subnet: Any, ip: str, instance: Any) -> None:
        if subnet.cidr_block:
            with LOCK:
                eni_rules.check_free_address(eni_rules.subnet_space(subnet), subnet, ip)
                original(subnet, ip, instance)
        else:
            original(subnet, ip, instance)

    return request_ip


def _terminate(original: Callable[..., Any]) -> Callable[..., Any]:
    """EC2 User Guide, "Network interfaces" (delete on termination): at termination, ENIs without
    DeleteOnTermination are detached and left available; moto left them attached."""

    def terminate(instance: Any) -> Any:
        with LOCK:
            previous = original(instance)
            for nic in list(instance.nics.values()):
                if nic.instance is instance and nic.id in instance.ec2_backend.enis:
                    instance.detach_eni(nic)
                    nic.delete_on_termination = False
            return previous

    return terminate


# -- backend -----------------------------------------------------------------------------------


def _split_addresses(
    private_ip_address: str | list[str] | None, entries: Sequence[Any] | None
) -> tuple[str | None, list[str]]:
    """moto's callers name the primary in `private_ip_address` (a string, or a list whose first item
    counts) or as the entry marked Primary; every other entry is a secondary."""
    if isinstance(private_ip_address, list):
        private_ip_address = private_ip_address[0] if private_ip_address else None
    primary = private_ip_address or None
    others: list[str] = []
    for entry in entries or ():
        address = entry if isinstance(entry, str) else entry.get("PrivateIpAddress")
        marked = not isinstance(entry, str) and bool(entry.get("Primary"))
        if primary is None and (marked or isinstance(entry, str)):
            primary = address
        elif address and address != primary:
            others.append(address)
    return primary, others


def _create_network_interface(original: Callable[..., Any]) -> Callable[..., Any]:
    """EC2 API reference, CreateNetworkInterface: addresses obey the subnet-wide rules, prefixes may
    be delegated at creation, and the ENI holds no more than any instance type allows."""

    def create_network_interface(
        backend: Any,
        subnet: Any,
        private_ip_address: str | list[str] | None,
        private_ip_addresses: list[Any] | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        subnet = backend.get_subnet(subnet) if isinstance(subnet, str) else subnet
        strict = bool(kwargs.pop(STRICT, False))
        prefixes: list[str] = kwargs.pop("ipv4_prefixes", None) or []
        prefix_count = int(kwargs.pop("ipv4_prefix_count", 0) or 0)
        if subnet is None or not subnet.cidr_block:
            return original(
                backend, subnet, private_ip_address, private_ip_addresses, *args, **kwargs
            )
        count = int(kwargs.pop("secondary_ips_count", 0) or 0)
        primary, secondaries = _split_addresses(private_ip_address, private_ip_addresses)
        with LOCK:
            plan = eni_rules.plan_new_eni(
                subnet,
                primary=primary,
                secondaries=secondaries,
                count=count,
                prefixes=prefixes,
                prefix_count=prefix_count,
                strict=strict,
            )
            entries = [{"Primary": True, "PrivateIpAddress": plan.primary}] + [
                {"Primary": False, "PrivateIpAddress": a} for a in plan.secondaries
            ]
            eni = original(backend, subnet, plan.primary, entries, *args, **kwargs)
            eni_rules.eni_prefixes(eni).extend(plan.prefixes)
            return eni

    return create_network_interface


def _assign_private_ip_addresses(_original: Callable[..., Any]) -> Callable[..., Any]:
    """EC2 API reference, AssignPrivateIpAddresses, for moto's internal callers (our response handler
    calls `eni_rules.assign` directly to learn what was assigned)."""

    def assign_private_ip_addresses(
        backend: Any,
        eni_id: str,
        private_ip_addresses: list[str] | None = None,
        secondary_ips_count: int | None = None,
    ) -> Any:
        eni = backend.get_network_interface(eni_id)
        eni_rules.assign(eni, addresses=private_ip_addresses or (), count=secondary_ips_count or 0)
        return eni

    return assign_private_ip_addresses


def _unassign_private_ip_addresses(_original: Callable[..., Any]) -> Callable[..., Any]:
    """EC2 API reference, UnassignPrivateIpAddresses: also Ipv4Prefixes; all or nothing."""

    def unassign_private_ip_addresses(
        backend: Any,
        eni_id: str,
        private_ip_address: list[str] | None = None,
        ipv4_prefixes: list[str] | None = None,
    ) -> Any:
        eni = backend.get_network_interface(eni_id)
        eni_rules.unassign(eni, private_ip_address or [], ipv4_prefixes or [])
        return eni

    return unassign_private_ip_addresses


def _attach_network_interface(original: Callable[..., Any]) -> Callable[..., Any]:
    """EC2 API reference, AttachNetworkInterface and error codes (AttachmentLimitExceeded,
    InvalidNetworkInterface.InUse, InvalidParameterValue for a device index in use)."""

    def attach_network_interface(
        backend: Any, eni_id: str, instance_id: str, device_index: int
    ) -> Any:
        with LOCK:
            eni = backend.get_network_interface(eni_id)
            instance = backend.get_instance(instance_id)
            eni_rules.check_attach(eni, instance, int(device_index))
            # EC2 User Guide: DeleteOnTermination is false for an interface attached this way.
            eni.delete_on_termination = False
            return original(backend, eni_id, instance_id, device_index)

    return attach_network_interface


def _detach_network_interface(original: Callable[..., Any]) -> Callable[..., Any]:
    """EC2 User Guide, "Network interfaces": the primary network interface cannot be detached. moto
    only refused to detach an instance's last ENI."""

    def detach_network_interface(backend: Any, attachment_id: str) -> None:
        with LOCK:
            eni = moto_index.attached_eni(backend, attachment_id)
            if eni is not None and eni.device_index == 0:
                raise ec2_error(
                    "OperationNotPermitted",
                    "The network interface at device index 0 and networkCard index 0 cannot be "
                    "detached.",
                )
            original(backend, attachment_id)
            if eni is not None:
                eni.delete_on_termination = False

    return detach_network_interface


def _delete_network_interface(original: Callable[..., None]) -> Callable[..., None]:
    """EC2 API reference, DeleteNetworkInterface: the ENI's addresses return to the subnet."""

    def delete_network_interface(backend: Any, eni_id: str) -> None:
        with LOCK:
            eni = backend.enis.get(eni_id)
            original(backend, eni_id)
            if eni is not None:
                # moto keeps instance primaries in Subnet._subnet_ips; free them with the ENI.
                for address in eni_rules.eni_addresses(eni):
                    eni.subnet.del_subnet_ip(address)

    return delete_network_interface


_PATCHES: Final[tuple[tuple[type[Any], str, Callable[[Any], Any]], ...]] = (
    (Subnet, "available_ip_address_count", _available_ip_address_count),
    (Subnet, "ipv6_cidr_block_association_set", _ipv6_cidr_block_association_set),
    (Subnet, "get_available_subnet_ip", _get_available_subnet_ip),
    (Subnet, "request_ip", _request_ip),
    (Instance, "terminate", _terminate),
    (NetworkInterfaceBackend, "create_network_interface", _create_network_interface),
    (NetworkInterfaceBackend, "assign_private_ip_addresses", _assign_private_ip_addresses),
    (NetworkInterfaceBackend, "unassign_private_ip_addresses", _unassign_private_ip_addresses),
    (NetworkInterfaceBackend, "attach_network_interface", _attach_network_interface),
    (NetworkInterfaceBackend, "detach_network_interface", _detach_network_interface),
    (NetworkInterfaceBackend, "delete_network_interface", _delete_network_interface),
    (ElasticNetworkInterfaces, "create_network_interface", moto_handlers.respond_create),
    (ElasticNetworkInterfaces, "assign_private_ip_addresses", moto_handlers.respond_assign),
    (ElasticNetworkInterfaces, "unassign_private_ip_addresses", moto_handlers.respond_unassign),
    (ElasticNetworkInterfaces, "assign_ipv6_addresses", moto_handlers.respond_assign_ipv6),
    (ElasticNetworkInterfaces, "delete_network_interface", moto_handlers.respond_delete),
    (
        ElasticNetworkInterfaces,
        "modify_network_interface_attribute",
        moto_handlers.respond_modify_attribute,
    ),
)
"""(class, attribute, factory): the factory receives moto's original and returns the replacement."""
