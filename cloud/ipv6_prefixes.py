"""The /80 prefixes of a subnet's IPv6 /64, as EC2 delegates them (AssignIpv6Addresses with
Ipv6PrefixCount): which /80 an index names, which index a /80 has, and which ones may be handed out
(never the /64's first or last, which hold the addresses EC2 reserves in every subnet). The
in-memory EC2 (`cloud.fake_ipv6`) and the embedded cloud (`cloud.embedded.ipv6_rules`) both draw
from here; they differ only in which free /80 they pick."""

from __future__ import annotations

import ipaddress
from typing import Final

PREFIX_LENGTH: Final = 80
V6_PREFIXES: Final = 1 << (PREFIX_LENGTH - 64)
"""The /80s of a /64."""
DRAWABLE: Final = range(1, V6_PREFIXES - 1)
"""The indexes of the /80s EC2 may delegate: all but the first and the last."""
_SHIFT: Final = 128 - PREFIX_LENGTH


def prefix_at(block: ipaddress.IPv6Network, index: int) -> str:
    """The /80 at `index` of `block` (0 being its first), in CIDR form."""
    return str(ipaddress.IPv6Network((int(block.network_address) + (index << _SHIFT), 80)))


def index_of(block: ipaddress.IPv6Network, address: int) -> int:
    """The index in `block` of the /80 that holds `address` (an address or a prefix's base)."""
    return (address - int(block.network_address)) >> _SHIFT


def lowest_free(used: set[int]) -> int | None:
    """The lowest index EC2 may delegate that `used` lacks; None when every one is taken."""
    return next((i for i in DRAWABLE if i not in used), None)
