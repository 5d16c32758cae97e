"""EC2's rules for IPv6 prefixes on ENIs (AssignIpv6Addresses with Ipv6Prefixes or Ipv6PrefixCount),
applied to moto's live objects; moto 5.2.5 has no IPv6 prefixes at all.

An ENI's /80s are drawn from its subnet's IPv6 /64 (EC2 User Guide, "Assign prefixes to network
interfaces": IPv6 prefixes are /80s of the subnet's CIDR block, on Nitro instances), unique in the
subnet and clear of every IPv6 address an ENI of the subnet holds. A subnet without an IPv6 CIDR
block refuses them with InvalidParameterValue, EC2's code for a value the subnet cannot take. Like
`cloud.embedded.eni_rules`, everything decides and mutates under `LOCK`, all or nothing, and this
module patches nothing itself (`cloud.embedded.moto_ext` hooks it in).

Not modelled: the per-ENI limit on IPv6 prefixes (ipamd asks for one, once per node).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Any, Final

from cloud.embedded.eni_rules import LOCK, ec2_error, rng
from cloud.embedded.moto_index import subnet_enis
from cloud.ipv6_prefixes import DRAWABLE, PREFIX_LENGTH, index_of, lowest_free, prefix_at

IPV6_PREFIXES_ATTR: Final = "_ipamd_ipv6_prefixes"
"""Where a moto ENI keeps its delegated /80 prefixes (CIDR strings); moto has no such field."""


def eni_ipv6_prefixes(eni: Any) -> list[str]:
    """The ENI's delegated IPv6 prefixes (the live list, for mutation under LOCK)."""
    found: list[str] | None = eni.__dict__.get(IPV6_PREFIXES_ATTR)
    if found is None:
        found = eni.__dict__[IPV6_PREFIXES_ATTR] = []
    return found


def subnet_block(subnet: Any) -> ipaddress.IPv6Network | None:
    """The subnet's associated IPv6 /64, or None (EC2 associates at most one with a subnet)."""
    for association in list(subnet.ipv6_cidr_block_associations.values()):
        state = str((association.get("ipv6CidrBlockState") or {}).get("State") or "")
        if state in ("associated", "associating") and association.get("ipv6CidrBlock"):
            return ipaddress.IPv6Network(str(association["ipv6CidrBlock"]))
    return None


def assign(eni: Any, *, prefixes: Sequence[str] = (), count: int = 0) -> tuple[str, ...]:
    """AssignIpv6Addresses' prefixes: the named /80s (each free and inside the subnet's /64) and
    `count` drawn ones, all or none. Returns what this call added."""
    with LOCK:
        block = subnet_block(eni.subnet)
        if block is None:
            raise ec2_error(
                "InvalidParameterValue",
                f"The subnet {eni.subnet.id} has no IPv6 CIDR block: it cannot give IPv6 prefixes.",
            )
        used = _used(eni.subnet, block)
        named = [_check_named(block, used, p) for p in dict.fromkeys(prefixes)]
        for index in named:
            used.add(index)
        drawn = [_draw(block, used) for _ in range(count)]
        new = tuple(prefix_at(block, i) for i in (*named, *drawn))
        eni_ipv6_prefixes(eni).extend(new)
        return new


def _used(subnet: Any, block: ipaddress.IPv6Network) -> set[int]:
    """The /80s of the block an ENI of the subnet holds, or holds an IPv6 address in."""
    used: set[int] = set()
    for other in subnet_enis(subnet):
        for prefix in eni_ipv6_prefixes(other):
            used.add(index_of(block, int(ipaddress.IPv6Network(prefix).network_address)))
        for address in other.ipv6_addresses or ():
            value = int(ipaddress.IPv6Address(str(address)))
            if ipaddress.IPv6Address(value) in block:
                used.add(index_of(block, value))
    return used


def _check_named(block: ipaddress.IPv6Network, used: set[int], prefix: str) -> int:
    try:
        network = ipaddress.IPv6Network(prefix)
    except ValueError:
        raise ec2_error("InvalidParameterValue", f"Invalid IPv6 prefix {prefix!r}") from None
    if network.prefixlen != PREFIX_LENGTH or not network.subnet_of(block):
        raise ec2_error(
            "InvalidParameterValue", f"IPv6 prefix {prefix} is not a /80 of the subnet's {block}"
        )
    index = index_of(block, int(network.network_address))
    if index in used:
        raise ec2_error("InvalidParameterValue", f"IPv6 prefix {prefix} is in use.")
    return index


def _draw(block: ipaddress.IPv6Network, used: set[int]) -> int:
    """A free /80 at random (moto's random source, so a seeded world draws the same), never the
    first or last of the /64, which hold the addresses EC2 reserves in every subnet."""
    for _ in range(64):
        index = int(rng().randint(DRAWABLE.start, DRAWABLE.stop - 1))
        if index not in used:
            used.add(index)
            return index
    lowest = lowest_free(used)
    if lowest is None:
        raise ec2_error(
            "InsufficientCidrBlocks",
            "The specified subnet does not have enough contiguous free space for the requested prefixes.",
        )
    used.add(lowest)
    return lowest
