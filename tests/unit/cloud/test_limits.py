"""The instance-limits cache: one fetch per type, shared by concurrent callers; the static table only
when EC2 cannot answer."""

from __future__ import annotations

import asyncio

import pytest

from cloud.errors import NotFound, Throttled
from cloud.limits import FALLBACK_LIMITS, InstanceLimitsCache
from cloud.models import InstanceLimits


class FakeDescribeInstanceTypes:
    def __init__(self, fail: BaseException | None = None) -> None:
        self.asked: list[str] = []
        self.fail = fail
        self.release = asyncio.Event()
        self.release.set()

    async def __call__(self, instance_type: str) -> InstanceLimits:
        self.asked.append(instance_type)
        await self.release.wait()
        if self.fail is not None:
            raise self.fail
        return InstanceLimits(instance_type, 8, 30, "nitro")


async def test_fetched_once_per_type() -> None:
    fetch = FakeDescribeInstanceTypes()
    cache = InstanceLimitsCache()
    assert cache.cached("m6i.large") is None
    first = await cache.get("m6i.large", fetch)
    assert await cache.get("m6i.large", fetch) == first == cache.cached("m6i.large")
    await cache.get("c6g.large", fetch)
    assert fetch.asked == ["m6i.large", "c6g.large"]


async def test_concurrent_first_requests_share_one_fetch() -> None:
    fetch = FakeDescribeInstanceTypes()
    fetch.release.clear()
    cache = InstanceLimitsCache()
    async with asyncio.TaskGroup() as group:
        tasks = [
            group.create_task(cache.get("m6i.large", fetch), name=f"get-{i}") for i in range(5)
        ]
        await asyncio.sleep(0)
        fetch.release.set()
    assert fetch.asked == ["m6i.large"]
    assert len({t.result() for t in tasks}) == 1


async def test_fallback_table_when_ec2_fails_and_not_cached() -> None:
    fetch = FakeDescribeInstanceTypes(
        fail=Throttled("DescribeInstanceTypes", "RequestLimitExceeded")
    )
    cache = InstanceLimitsCache()
    assert await cache.get("m5.large", fetch) == FALLBACK_LIMITS["m5.large"]
    assert cache.cached("m5.large") is None
    fetch.fail = None
    assert (await cache.get("m5.large", fetch)).max_enis == 8, "EC2's answer wins once it comes"


async def test_unknown_type_without_ec2_is_an_error() -> None:
    fetch = FakeDescribeInstanceTypes(fail=NotFound("DescribeInstanceTypes", "InvalidInstanceType"))
    with pytest.raises(NotFound):
        await InstanceLimitsCache().get("x9.huge", fetch)


@pytest.mark.parametrize(
    ("instance_type", "enis", "ipv4"),
    [
        ("m5.large", 3, 10),
        ("t3.small", 3, 4),
        ("c5.18xlarge", 15, 50),
        ("t3.medium", 3, 6),
        ("m5.xlarge", 4, 15),
    ],
)
def test_fallback_table(instance_type: str, enis: int, ipv4: int) -> None:
    limits = FALLBACK_LIMITS[instance_type]
    assert (limits.max_enis, limits.ipv4_per_eni, limits.hypervisor) == (enis, ipv4, "nitro")
    assert limits.units_per_eni == ipv4 - 1


@pytest.mark.parametrize("instance_type", sorted(FALLBACK_LIMITS))
def test_fallback_table_is_what_ec2_reports(instance_type: str) -> None:
    """Each fallback entry, vCPUs included, is DescribeInstanceTypes' answer (moto's copy of it)."""
    from moto.ec2.models.instance_types import INSTANCE_TYPES

    from cloud.ec2_answers import parse_limits

    assert FALLBACK_LIMITS[instance_type] == parse_limits(INSTANCE_TYPES[instance_type])
