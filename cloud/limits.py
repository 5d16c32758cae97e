"""Instance-type limits: a per-process cache over DescribeInstanceTypes, and a small static table used
only when EC2 cannot answer.

EC2 is the source of truth: limits come from DescribeInstanceTypes (ENIs per instance, IPv4 addresses
per ENI, hypervisor, vCPUs) once per type, then from the cache for the life of the process (they never
change for a type). VPC CNI ships a generated table of ~1,400 types; we keep only a handful of common ones,
for a start-up during an EC2 brown-out or without `ec2:DescribeInstanceTypes` in the node's IAM policy.
A fallback answer is not cached, so the next call asks EC2 again. Max pods is not computed here (the
policy package owns it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType

from cloud.errors import CloudError
from cloud.models import InstanceLimits

logger = logging.getLogger(__name__)


def _table(*rows: tuple[str, int, int, int]) -> Mapping[str, InstanceLimits]:
    return MappingProxyType(
        {t: InstanceLimits(t, enis, ips, "nitro", vcpus) for t, enis, ips, vcpus in rows}
    )


FALLBACK_LIMITS: Mapping[str, InstanceLimits] = _table(
    # (type, network interfaces, IPv4 addresses per interface including the primary, default
    # vCPUs), as DescribeInstanceTypes reports them; all of these run on the Nitro system.
    ("t3.small", 3, 4, 2),
    ("t3.medium", 3, 6, 2),
    ("m5.large", 3, 10, 2),
    ("m5.xlarge", 4, 15, 4),
    ("c5.18xlarge", 15, 50, 72),
)


class InstanceLimitsCache:
    """Limits per instance type: fetched from EC2 once, then served from memory.

    Concurrent first requests for one type share one fetch. When the fetch fails with a `CloudError`
    and the type is in the fallback table, the table's entry is returned (not cached); otherwise the
    error propagates. The fetch is the caller's, per request: each view of an adapter reads EC2
    under its own urgency, into the one cache they share.
    """

    def __init__(self, fallback: Mapping[str, InstanceLimits] = FALLBACK_LIMITS) -> None:
        self._fallback = fallback
        self._known: dict[str, InstanceLimits] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def cached(self, instance_type: str) -> InstanceLimits | None:
        return self._known.get(instance_type)

    async def get(
        self, instance_type: str, fetch: Callable[[str], Awaitable[InstanceLimits]]
    ) -> InstanceLimits:
        """The type's limits: from memory, else from `fetch` (DescribeInstanceTypes)."""
        known = self._known.get(instance_type)
        if known is not None:
            return known
        lock = self._locks.setdefault(instance_type, asyncio.Lock())
        async with lock:
            known = self._known.get(instance_type)
            if known is not None:
                return known
            try:
                limits = await fetch(instance_type)
            except CloudError as err:
                fallback = self._fallback.get(instance_type)
                if fallback is None:
                    raise
                logger.warning("ec2.limits_fallback instance_type=%s error=%s", instance_type, err)
                return fallback
            self._known[instance_type] = limits
            return limits
