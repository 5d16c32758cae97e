"""Our handlers for moto's EC2 requests where the parameters or the answer must change: they read
what EC2 accepts and moto ignores (Ipv4Prefixes, Ipv4PrefixCount, AllowReassignment,
Attachment.DeleteOnTermination) and answer as EC2 does. Each function receives moto's original handler
and returns the replacement; `cloud.embedded.moto_ext.install` puts them in place.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from moto.core.responses import ActionResult, EmptyResult
from moto.ec2.exceptions import InvalidNetworkAttachmentIdError
from moto.ec2.utils import add_tag_specification

from cloud.embedded import eni_rules, ipv6_rules
from cloud.embedded.eni_rules import LOCK, ec2_error

STRICT: Final = "_ipamd_strict"
"""Keyword our CreateNetworkInterface handler passes to the backend: the caller is the EC2 API, so a
named address that cannot be used is an error rather than replaced."""


def _check_exclusive(handler: Any, *pairs: tuple[str, str]) -> None:
    for first, second in pairs:
        if handler._get_param(first) and handler._get_param(second):
            raise ec2_error(
                "InvalidParameterCombination", f"Specify {first} or {second}, not both."
            )


def respond_create(_original: Callable[..., Any]) -> Callable[..., Any]:
    """EC2 API reference, CreateNetworkInterface: Ipv4Prefixes and Ipv4PrefixCount (moto ignored
    them), exclusive of each other."""

    def create_network_interface(handler: Any) -> Any:
        _check_exclusive(handler, ("Ipv4Prefixes", "Ipv4PrefixCount"))
        prefixes = [p["Ipv4Prefix"] for p in handler._get_param("Ipv4Prefixes", [])]
        tags = add_tag_specification(handler._get_param("TagSpecifications", []))
        handler.error_on_dryrun()
        eni = handler.ec2_backend.create_network_interface(
            handler.ec2_backend.get_subnet(handler._get_param("SubnetId")),
            handler._get_param("PrivateIpAddress"),
            handler._get_param("PrivateIpAddresses", []),
            handler._get_param("Groups", []),
            handler._get_param("Description"),
            tags,
            secondary_ips_count=handler._get_int_param("SecondaryPrivateIpAddressCount", 0),
            ipv6_addresses=[a["Ipv6Address"] for a in handler._get_param("Ipv6Addresses", [])],
            ipv6_address_count=handler._get_int_param("Ipv6AddressCount", 0),
            ipv4_prefixes=prefixes,
            ipv4_prefix_count=handler._get_int_param("Ipv4PrefixCount", 0),
            **{STRICT: True},
        )
        return ActionResult({"NetworkInterface": eni})

    return create_network_interface


def respond_assign(_original: Callable[..., Any]) -> Callable[..., Any]:
    """EC2 API reference, AssignPrivateIpAddresses: Ipv4Prefixes, Ipv4PrefixCount, AllowReassignment;
    the answer's AssignedPrivateIpAddresses and AssignedIpv4Prefixes list only what this call added
    (moto listed every address of the ENI)."""

    def assign_private_ip_addresses(handler: Any) -> Any:
        _check_exclusive(
            handler,
            ("PrivateIpAddresses", "SecondaryPrivateIpAddressCount"),
            ("Ipv4Prefixes", "Ipv4PrefixCount"),
        )
        wanted = ("PrivateIpAddresses", "SecondaryPrivateIpAddressCount", "Ipv4Prefixes")
        if not any(handler._get_param(name) for name in (*wanted, "Ipv4PrefixCount")):
            raise ec2_error("MissingParameter", "Specify addresses or prefixes, or how many.")
        eni = handler.ec2_backend.get_network_interface(handler._get_param("NetworkInterfaceId"))
        done = eni_rules.assign(
            eni,
            addresses=handler._get_param("PrivateIpAddresses", []),
            count=handler._get_int_param("SecondaryPrivateIpAddressCount", 0),
            prefixes=handler._get_param("Ipv4Prefixes", []),
            prefix_count=handler._get_int_param("Ipv4PrefixCount", 0),
            allow_reassignment=bool(handler._get_bool_param("AllowReassignment", False)),
        )
        return ActionResult(
            {
                "NetworkInterfaceId": eni.id,
                "AssignedPrivateIpAddresses": [{"PrivateIpAddress": a} for a in done.addresses],
                "AssignedIpv4Prefixes": [{"Ipv4Prefix": p} for p in done.prefixes],
            }
        )

    return assign_private_ip_addresses


def respond_assign_ipv6(original: Callable[..., Any]) -> Callable[..., Any]:
    """EC2 API reference, AssignIpv6Addresses: Ipv6Prefixes and Ipv6PrefixCount ("the number of IPv6
    delegated prefixes to assign"), exclusive of each other and of addresses; the answer's
    AssignedIpv6Prefixes lists what this call added. Requests for addresses only stay moto's."""

    def assign_ipv6_addresses(handler: Any) -> Any:
        if not (handler._get_param("Ipv6Prefixes") or handler._get_param("Ipv6PrefixCount")):
            return original(handler)
        _check_exclusive(
            handler,
            ("Ipv6Prefixes", "Ipv6PrefixCount"),
            ("Ipv6Prefixes", "Ipv6Addresses"),
            ("Ipv6Prefixes", "Ipv6AddressCount"),
            ("Ipv6PrefixCount", "Ipv6Addresses"),
            ("Ipv6PrefixCount", "Ipv6AddressCount"),
        )
        eni = handler.ec2_backend.get_network_interface(handler._get_param("NetworkInterfaceId"))
        added = ipv6_rules.assign(
            eni,
            prefixes=handler._get_param("Ipv6Prefixes", []),
            count=handler._get_int_param("Ipv6PrefixCount", 0),
        )
        return ActionResult(
            {
                "NetworkInterfaceId": eni.id,
                "AssignedIpv6Addresses": [],
                "AssignedIpv6Prefixes": list(added),
            }
        )

    return assign_ipv6_addresses


def respond_unassign(_original: Callable[..., Any]) -> Callable[..., Any]:
    """EC2 API reference, UnassignPrivateIpAddresses: Ipv4Prefixes (moto ignored them)."""

    def unassign_private_ip_addresses(handler: Any) -> Any:
        handler.ec2_backend.unassign_private_ip_addresses(
            handler._get_param("NetworkInterfaceId"),
            handler._get_param("PrivateIpAddresses", []),
            ipv4_prefixes=handler._get_param("Ipv4Prefixes", []),
        )
        return EmptyResult()

    return unassign_private_ip_addresses


def respond_delete(original: Callable[..., Any]) -> Callable[..., Any]:
    """EC2 API reference, DeleteNetworkInterface and error codes: InvalidNetworkInterface.InUse for
    an attached ENI."""

    def delete_network_interface(handler: Any) -> Any:
        with LOCK:
            eni_id = handler._get_param("NetworkInterfaceId")
            eni = handler.ec2_backend.get_network_interface(eni_id)
            # Checked here, not in the backend: moto's own terminate deletes attached ENIs there.
            if eni.attachment_id is not None:
                raise ec2_error(
                    "InvalidNetworkInterface.InUse",
                    f"Network interface '{eni_id}' is currently in use.",
                )
            return original(handler)

    return delete_network_interface


def respond_modify_attribute(original: Callable[..., Any]) -> Callable[..., Any]:
    """EC2 API reference, ModifyNetworkInterfaceAttribute (Attachment.DeleteOnTermination; an unknown
    AttachmentId is InvalidAttachmentID.NotFound). moto ignored the Attachment parameter."""

    def modify_network_interface_attribute(handler: Any) -> Any:
        attachment: dict[str, Any] | None = handler._get_param("Attachment")
        if attachment:
            with LOCK:
                eni = handler.ec2_backend.get_network_interface(
                    handler._get_param("NetworkInterfaceId")
                )
                attachment_id = attachment.get("AttachmentId")
                if attachment_id is None or attachment_id != eni.attachment_id:
                    raise InvalidNetworkAttachmentIdError(str(attachment_id))
                flag = attachment.get("DeleteOnTermination")
                if flag is not None:
                    eni.delete_on_termination = str(flag).lower() == "true"
        return original(handler)

    return modify_network_interface_attribute
