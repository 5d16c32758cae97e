"""The free addresses of the subnets a node may draw from, read from EC2 on a slow schedule and kept,
for subnet-scarcity mode (`ipamd.sizing.scarcity`): the pool manager reads the kept number every
round (`free`) and never calls EC2 for it.

Which subnets, and how one reading is taken, is the `read` callable's: `read_subnets(catalog,
subnet_ids)`, DescribeSubnets' AvailableIpAddressCount summed over the subnets new ENIs go to. With
subnet discovery on, nothing here runs: the subnet catalogue's own view has the counts
(`ipamd.pool.subnet_catalogue.SubnetCatalogue.free_addresses`). A failed read keeps the last number (a
reading a few minutes old beats none) and is counted by the job schedule like any other job's.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from cloud.ports import Ec2Catalog
from ipamd.clock import Clock

logger = logging.getLogger(__name__)


def read_subnets(
    catalog: Ec2Catalog, subnet_ids: Callable[[], tuple[str, ...]]
) -> Callable[[], Awaitable[int]]:
    """One reading: the free addresses (AvailableIpAddressCount) of the subnets `subnet_ids` names
    at that moment, summed."""

    async def read() -> int:
        return sum([(await catalog.subnet(s)).available_ips for s in subnet_ids()])

    return read


class SubnetFree:
    def __init__(self, read: Callable[[], Awaitable[int]], clock: Clock) -> None:
        self._read = read
        self._clock = clock
        self._free: int | None = None
        self.read_at: float | None = None
        """When the kept number was read; None: never."""

    def free(self) -> int | None:
        """The free addresses as last read; None until a read succeeded."""
        return self._free

    async def run_once(self) -> int:
        """Read the subnets once and keep the number. Raises `CloudError` (the last one is kept)."""
        free = await self._read()
        if free != self._free:
            logger.debug("subnet_free.read free=%d before=%s", free, self._free)
        self._free = free
        self.read_at = self._clock.now()
        return free
