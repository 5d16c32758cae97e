"""A subnet made fragmented on purpose: free addresses left aplenty, but no aligned /28 wholly free, so
prefix delegation fails with InsufficientCidrBlocks while secondary addresses are still granted.

`fragment_subnet(ec2, subnet_id)` reads the subnet through the EC2 API, then parks one address in every
/28 block that is wholly free (a *blocker*), on unattached *parking ENIs* tagged `PARKING_TAG`. A /24
keeps 251 - 14 = 237 addresses less what was already in use; a /20, 4091 - 254. `Fragmentation.release`
unassigns blockers, each giving a whole /28 back; `remove` deletes the parking ENIs. Everything goes
through the API (any boto3 EC2 client: in-process or over the loopback server), so the cloud file keeps
a fragmented subnet across a restart like any other ENIs.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from cloud.embedded.subnet_space import PREFIX_LENGTH, PREFIX_SIZE

PARKING_TAG: Final = "ipamd.embedded/parking"
"""Tag key of parking ENIs (value: the subnet they fragment). ipamd owns no ENI with this tag."""
ADDRESSES_PER_ENI: Final = 32
"""Blockers per parking ENI, its primary included: well under any type's per-ENI limit."""
DEFAULT_OFFSET: Final = 8
"""Where in its /28 a blocker sits (0-15; every address of an inner block is usable)."""


@dataclass
class Fragmentation:
    """The blockers parked in one subnet, and which of them are still there."""

    subnet_id: str
    eni_ids: tuple[str, ...]
    blockers: dict[str, str]
    """/28 block (CIDR) → the address that keeps it from being delegated, in block order."""
    holders: dict[str, str]
    """Blocker address → the parking ENI holding it."""
    primaries: frozenset[str]
    """Blockers that are a parking ENI's primary address: freed only with their ENI (`remove`)."""
    released: set[str] = field(default_factory=set)
    """Blocks whose blocker is gone."""

    @property
    def blocked(self) -> list[str]:
        """Blocks still held by a blocker."""
        return [b for b in self.blockers if b not in self.released]

    def release(self, ec2: Any, blocks: int = 1) -> list[str]:
        """Unassign the blockers of `blocks` more blocks (the lowest blocks whose blocker is a
        secondary address); each block is a free /28 again unless something else took an address in
        it meanwhile. Returns those blocks. ValueError if fewer are left to release."""
        chosen = [b for b in self.blocked if self.blockers[b] not in self.primaries][:blocks]
        if len(chosen) < blocks:
            raise ValueError(f"{len(chosen)} blocks can be released, {blocks} asked")
        by_eni: dict[str, list[str]] = {}
        for block in chosen:
            address = self.blockers[block]
            by_eni.setdefault(self.holders[address], []).append(address)
        for eni_id, addresses in by_eni.items():
            ec2.unassign_private_ip_addresses(
                NetworkInterfaceId=eni_id, PrivateIpAddresses=addresses
            )
        self.released.update(chosen)
        return chosen

    def remove(self, ec2: Any) -> None:
        """Delete the parking ENIs: every blocker is gone."""
        for eni_id in self.eni_ids:
            ec2.delete_network_interface(NetworkInterfaceId=eni_id)
        self.released.update(self.blockers)


def fragment_subnet(
    ec2: Any, subnet_id: str, *, leave_free_blocks: int = 0, offset: int = DEFAULT_OFFSET
) -> Fragmentation:
    """Park one address in each /28 of the subnet that is wholly free now, but for the last
    `leave_free_blocks` of them; afterwards no other /28 can be delegated there (InsufficientCidrBlocks)
    until a blocker is released. The parking ENIs are tagged `PARKING_TAG` and attached to nothing."""
    if not 0 <= offset < PREFIX_SIZE:
        raise ValueError(f"offset {offset} is not within a /{PREFIX_LENGTH}")
    free = free_blocks(ec2, subnet_id)
    targets = free[: max(0, len(free) - leave_free_blocks)]
    blockers = {str(b): str(b.network_address + offset) for b in targets}
    addresses = list(blockers.values())
    holders: dict[str, str] = {}
    primaries: set[str] = set()
    eni_ids: list[str] = []
    for start in range(0, len(addresses), ADDRESSES_PER_ENI):
        batch = addresses[start : start + ADDRESSES_PER_ENI]
        eni_id: str = ec2.create_network_interface(
            SubnetId=subnet_id,
            Description="parking addresses that fragment the subnet",
            PrivateIpAddresses=[
                {"PrivateIpAddress": a, "Primary": i == 0} for i, a in enumerate(batch)
            ],
            TagSpecifications=[
                {
                    "ResourceType": "network-interface",
                    "Tags": [{"Key": PARKING_TAG, "Value": subnet_id}],
                }
            ],
        )["NetworkInterface"]["NetworkInterfaceId"]
        eni_ids.append(eni_id)
        primaries.add(batch[0])
        holders.update(dict.fromkeys(batch, eni_id))
    return Fragmentation(subnet_id, tuple(eni_ids), blockers, holders, frozenset(primaries))


def free_blocks(ec2: Any, subnet_id: str) -> list[ipaddress.IPv4Network]:
    """The aligned /28 blocks of the subnet that EC2 could delegate now, lowest first: none of their
    addresses is reserved, in use by an ENI, or inside a delegated prefix."""
    subnet = ipaddress.IPv4Network(
        ec2.describe_subnets(SubnetIds=[subnet_id])["Subnets"][0]["CidrBlock"]
    )
    if subnet.prefixlen > PREFIX_LENGTH:
        return []
    busy: set[int] = set()  # blocks (address >> 4) with an address in use or a delegated prefix
    for eni in _subnet_enis(ec2, subnet_id):
        for entry in eni.get("PrivateIpAddresses", ()):
            busy.add(int(ipaddress.IPv4Address(entry["PrivateIpAddress"])) >> 4)
        for prefix in eni.get("Ipv4Prefixes", ()):
            busy.add(int(ipaddress.IPv4Network(prefix["Ipv4Prefix"]).network_address) >> 4)
    # The first and the last block hold reserved addresses.
    blocks = list(subnet.subnets(new_prefix=PREFIX_LENGTH))[1:-1]
    return [b for b in blocks if int(b.network_address) >> 4 not in busy]


def _subnet_enis(ec2: Any, subnet_id: str) -> Iterator[dict[str, Any]]:
    pages = ec2.get_paginator("describe_network_interfaces").paginate(
        Filters=[{"Name": "subnet-id", "Values": [subnet_id]}]
    )
    for page in pages:
        yield from page["NetworkInterfaces"]
