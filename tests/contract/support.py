"""Small readers over boto3 answers shared by the contract tests."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from botocore.exceptions import ClientError


def describe_eni(ec2: Any, eni_id: str) -> dict[str, Any]:
    enis: list[dict[str, Any]] = ec2.describe_network_interfaces(NetworkInterfaceIds=[eni_id])[
        "NetworkInterfaces"
    ]
    return enis[0]


def secondaries(ec2: Any, eni_id: str) -> list[str]:
    eni = describe_eni(ec2, eni_id)
    return [a["PrivateIpAddress"] for a in eni["PrivateIpAddresses"] if not a["Primary"]]


def all_addresses(ec2: Any, eni_id: str) -> list[str]:
    eni = describe_eni(ec2, eni_id)
    return [a["PrivateIpAddress"] for a in eni["PrivateIpAddresses"]]


def prefixes(ec2: Any, eni_id: str) -> list[str]:
    eni = describe_eni(ec2, eni_id)
    return [p["Ipv4Prefix"] for p in eni.get("Ipv4Prefixes", [])]


def available_count(ec2: Any, subnet_id: str) -> int:
    subnets: list[dict[str, Any]] = ec2.describe_subnets(SubnetIds=[subnet_id])["Subnets"]
    return int(subnets[0]["AvailableIpAddressCount"])


def create_eni(ec2: Any, subnet_id: str, **kwargs: Any) -> str:
    eni_id: str = ec2.create_network_interface(SubnetId=subnet_id, **kwargs)["NetworkInterface"][
        "NetworkInterfaceId"
    ]
    return eni_id


def attach(ec2: Any, eni_id: str, instance_id: str, device_index: int) -> str:
    attachment_id: str = ec2.attach_network_interface(
        NetworkInterfaceId=eni_id, InstanceId=instance_id, DeviceIndex=device_index
    )["AttachmentId"]
    return attachment_id


def error_of(excinfo: pytest.ExceptionInfo[ClientError]) -> tuple[str, str]:
    error: dict[str, str] = excinfo.value.response["Error"]
    return error["Code"], error["Message"]


def reserved_addresses(cidr: str) -> set[str]:
    """The five addresses EC2 reserves in every subnet: the first four and the last."""
    network = ipaddress.IPv4Network(cidr)
    base = network.network_address
    return {str(base + i) for i in range(4)} | {str(network.broadcast_address)}
