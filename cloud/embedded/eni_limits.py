"""What EC2 allows an ENI per instance type, from moto's instance-type data (DescribeInstanceTypes)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from moto.ec2.models.instance_types import INSTANCE_TYPES


@dataclass(frozen=True, slots=True)
class EniLimits:
    """What EC2 allows per instance type (DescribeInstanceTypes, NetworkInfo)."""

    max_enis: int
    """Network interfaces on network card 0, where AttachNetworkInterface puts them when no
    NetworkCardIndex is given (moto models only card 0). Equals MaximumNetworkInterfaces on
    single-card types."""
    ipv4_per_eni: int
    """Ipv4AddressesPerInterface: primary + secondary addresses + /28 prefixes (one slot each)."""


def limits_for(instance_type: str) -> EniLimits | None:
    """The limits of an instance type from moto's instance-type data; None for a type it lacks."""
    info: dict[str, Any] | None = INSTANCE_TYPES.get(instance_type)
    if info is None:
        return None
    network: dict[str, Any] = info["NetworkInfo"]
    cards: list[dict[str, Any]] = network.get("NetworkCards") or []
    card0 = next((c for c in cards if c.get("NetworkCardIndex") == 0), None)
    max_enis = card0["MaximumNetworkInterfaces"] if card0 else network["MaximumNetworkInterfaces"]
    return EniLimits(max_enis=int(max_enis), ipv4_per_eni=int(network["Ipv4AddressesPerInterface"]))


@cache
def unattached_ipv4_limit() -> int:
    """The slot limit of an ENI attached to nothing: the largest Ipv4AddressesPerInterface of any
    instance type. EC2 checks an ENI against its instance's type when it is attached (see
    `check_attach`); until then no type applies, and no type allows more than this."""
    return max(int(t["NetworkInfo"]["Ipv4AddressesPerInterface"]) for t in INSTANCE_TYPES.values())
