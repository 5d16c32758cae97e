"""IPv6 in the in-memory EC2 (`cloud.fake_vpc`): a subnet's /64 and the /80 prefixes EC2 delegates
from it (AssignIpv6Addresses with Ipv6PrefixCount), drawn deterministically as the fake draws IPv4:
the lowest free /80, so a test knows which it gets."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from cloud.errors import Rejected, SubnetFragmented
from cloud.ipv6_prefixes import index_of, lowest_free, prefix_at


@dataclass(slots=True)
class Ipv6Block:
    """A subnet's IPv6 /64 and which of its /80s are on an ENI."""

    cidr: ipaddress.IPv6Network
    used: set[int] = field(default_factory=set)
    """Indexes of the /80s in use, 0 being the /64's first."""

    def draw(self) -> str | None:
        """The lowest free /80 but the first and the last (which hold the addresses EC2 reserves in
        every subnet); None when every other one is taken."""
        index = lowest_free(self.used)
        if index is None:
            return None
        self.used.add(index)
        return prefix_at(self.cidr, index)

    def free(self, prefix: str) -> None:
        base = int(ipaddress.IPv6Network(prefix).network_address)
        self.used.discard(index_of(self.cidr, base))


def block(cidr: str) -> Ipv6Block | None:
    """The block of a subnet whose IPv6 CIDR is `cidr` ("" for a subnet without one)."""
    return Ipv6Block(ipaddress.IPv6Network(cidr)) if cidr else None


def draw_prefix(operation: str, subnet_id: str, found: Ipv6Block | None) -> str:
    """One /80 of the subnet. EC2 refuses an IPv6 assignment in a subnet without an IPv6 CIDR block
    with InvalidParameterValue (`Rejected`), and one it cannot fit with InsufficientCidrBlocks."""
    if found is None:
        raise Rejected(operation, "InvalidParameterValue", f"{subnet_id} has no IPv6 CIDR block")
    prefix = found.draw()
    if prefix is None:
        raise SubnetFragmented(operation, "InsufficientCidrBlocks", subnet_id)
    return prefix
