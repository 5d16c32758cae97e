"""The free space of one IPv4 subnet as EC2 hands it out: reserved addresses, addresses already taken,
and aligned /28 blocks for prefix delegation.

Pure arithmetic over integers; it knows nothing of moto. `cloud.embedded.moto_ext` builds one per call
from moto's live state and turns `SpaceExhausted` into EC2's error codes.
"""

from __future__ import annotations

import ipaddress
import random
from collections.abc import Iterable
from dataclasses import dataclass, field

PREFIX_LENGTH = 28
PREFIX_SIZE = 16
"""A delegated IPv4 prefix is a /28: 16 addresses."""

RESERVED_AT_START = 4
"""EC2 reserves the network address, the VPC router, the DNS server and one for future use."""
RESERVED_AT_END = 1
"""... and the last address of every subnet (broadcast, though a VPC has no broadcast)."""


class SpaceExhausted(Exception):
    """The subnet cannot supply what was asked for."""


def prefix_addresses(prefix: ipaddress.IPv4Network) -> range:
    """The addresses of a network, as integers."""
    base = int(prefix.network_address)
    return range(base, base + prefix.num_addresses)


@dataclass(slots=True)
class SubnetSpace:
    """One subnet's addresses: which are taken, which may still be handed out.

    `occupied` holds every address in use as an integer: primary and secondary addresses of every ENI
    in the subnet, every address of every delegated prefix, and addresses moto set aside for other
    resources. Drawing marks what it returns as occupied, so several draws in one request never
    overlap.
    """

    network: ipaddress.IPv4Network
    occupied: set[int] = field(default_factory=set)

    @property
    def first_usable(self) -> int:
        return int(self.network.network_address) + RESERVED_AT_START

    @property
    def last_usable(self) -> int:
        return int(self.network.broadcast_address) - RESERVED_AT_END

    @property
    def usable_count(self) -> int:
        return max(0, self.last_usable - self.first_usable + 1)

    def contains(self, address: int) -> bool:
        return int(self.network.network_address) <= address <= int(self.network.broadcast_address)

    def is_reserved(self, address: int) -> bool:
        """One of the five addresses EC2 keeps for itself (the address must be in the subnet)."""
        return address < self.first_usable or address > self.last_usable

    def is_free(self, address: int) -> bool:
        return (
            self.contains(address)
            and not self.is_reserved(address)
            and address not in self.occupied
        )

    def free_count(self) -> int:
        first, last = self.first_usable, self.last_usable
        taken = sum(1 for a in self.occupied if first <= a <= last)
        return self.usable_count - taken

    def claim(self, addresses: Iterable[int]) -> None:
        self.occupied.update(addresses)

    def draw_addresses(self, count: int, rng: random.Random) -> list[ipaddress.IPv4Address]:
        """`count` free addresses, spread at random over the subnet as EC2's are; all or none."""
        if count <= 0:
            return []
        free = self.free_count()
        if count > free:
            raise SpaceExhausted(f"{free} free addresses in {self.network}, {count} requested")
        picked: list[int] = []
        first, last = self.first_usable, self.last_usable
        if free >= 4 * count:
            # Plenty of room: random probes find free addresses quickly without listing the subnet.
            while len(picked) < count:
                candidate = rng.randint(first, last)
                if candidate not in self.occupied:
                    self.occupied.add(candidate)
                    picked.append(candidate)
        else:
            candidates = [a for a in range(first, last + 1) if a not in self.occupied]
            picked = rng.sample(candidates, count)
            self.occupied.update(picked)
        return [ipaddress.IPv4Address(a) for a in picked]

    def candidate_blocks(self) -> range:
        """Indices (address >> 4) of the /28 blocks inside the subnet that hold no reserved address."""
        if self.network.prefixlen > PREFIX_LENGTH:
            return range(0)
        first = int(self.network.network_address) >> 4
        last = int(self.network.broadcast_address) >> 4
        # The first block holds the four reserved addresses at the start, the last the final one.
        return range(first + 1, last)

    def block_is_free(self, block: int) -> bool:
        base = block << 4
        return all(a not in self.occupied for a in range(base, base + PREFIX_SIZE))

    def check_prefix(self, prefix: ipaddress.IPv4Network) -> str | None:
        """Why `prefix` cannot be delegated from this subnet, or None if it can."""
        if prefix.prefixlen != PREFIX_LENGTH:
            return f"{prefix} is not a /{PREFIX_LENGTH} prefix"
        if not prefix.subnet_of(self.network):
            return f"{prefix} is not within the subnet's CIDR block {self.network}"
        block = int(prefix.network_address) >> 4
        if block not in self.candidate_blocks():
            return f"{prefix} contains addresses the subnet reserves"
        if not self.block_is_free(block):
            return f"{prefix} overlaps addresses that are in use"
        return None

    def draw_prefixes(self, count: int, rng: random.Random) -> list[ipaddress.IPv4Network]:
        """`count` aligned /28 blocks that hold no used and no reserved address; all or none."""
        if count <= 0:
            return []
        busy = {a >> 4 for a in self.occupied}
        free = [b for b in self.candidate_blocks() if b not in busy]
        if count > len(free):
            raise SpaceExhausted(
                f"{len(free)} free /28 blocks in {self.network}, {count} requested"
            )
        chosen = rng.sample(free, count)
        for block in chosen:
            self.occupied.update(range(block << 4, (block << 4) + PREFIX_SIZE))
        return [ipaddress.IPv4Network((b << 4, PREFIX_LENGTH)) for b in chosen]
