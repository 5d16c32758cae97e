"""ADD and DEL latency of the engine with durable commits (WAL, synchronous=FULL), one call at a time.

A large node in secondary-IP mode (9 ENIs x 30 addresses) takes 250 ADDs of distinct containers, then
their 250 DELs; a prefix-mode node (3 ENIs x 10 /28 prefixes) takes the same 250 ADDs, and so does an
IPv6 node (its primary ENI holding one /80 prefix, as IPv6 mode sets it up). The IPv6 ADD's p50
is also printed over the IPv4 ADD's of the same run (`engine_add_ipv6_over_ipv4`, ≤ 1.5): what
handing out a /128 of a /80 costs beyond taking a listed address, whatever the machine.
"""

from __future__ import annotations

from pathlib import Path

from bench.node import open_node, pod_key
from bench.timing import p50, p99, timed_ms
from datastore.records import AllocationKey, EniRecord, UnitKind
from datastore.store import STATE_FILE_NAME
from ipamd.clock import FakeClock
from ipamd.engine.allocator import EngineParams
from ipamd.engine.engine import Engine
from ipamd.node.family import FAMILIES

PODS = 250
IPV6_PREFIX = "2600:1f14:abc:d00:1234::/80"


async def run(workdir: Path) -> dict[str, float]:
    ip_add, ip_del = await add_then_del(workdir / "ip", enis=9, per_eni=30, kind="ip")
    prefix_add, _ = await add_then_del(workdir / "prefix", enis=3, per_eni=10, kind="prefix")
    ipv6_add = await ipv6_adds(workdir / "ipv6")
    return {
        "engine_add_p50_ms": p50(ip_add),
        "engine_add_p99_ms": p99(ip_add),
        "engine_del_p50_ms": p50(ip_del),
        "engine_del_p99_ms": p99(ip_del),
        "engine_add_p50_ms_prefix_mode": p50(prefix_add),
        "engine_add_p50_ms_ipv6": p50(ipv6_add),
        # The floor of the IPv6 figure: IPv4's ADD, measured in the same run on the same disk.
        "engine_add_ipv6_over_ipv4": p50(ipv6_add) / p50(ip_add),
    }


async def add_then_del(
    workdir: Path, enis: int, per_eni: int, kind: UnitKind
) -> tuple[list[float], list[float]]:
    """Time `PODS` ADDs one by one, then their DELs; returns (ADD samples, DEL samples) in ms."""
    # `Store.open` creates the directory. A clock that never moves: nothing expires mid-run, so
    # every sample does the same work.
    engine = await open_node(
        workdir / STATE_FILE_NAME, FakeClock(), EngineParams(), enis, per_eni, kind
    )
    try:
        keys = [pod_key(f"latency-{kind}", n) for n in range(PODS)]
        adds = [await _timed_add(engine, key) for key in keys]
        dels = [await _timed_del(engine, key) for key in keys]
    finally:
        await engine.close()
    return adds, dels


async def ipv6_adds(workdir: Path) -> list[float]:
    """Time `PODS` ADDs one by one on a node whose one unit is an IPv6 /80 on its primary ENI."""
    clock = FakeClock()
    settings = EngineParams(pick=FAMILIES["ipv6"].pick)  # as the composition gives an IPv6 node
    engine = await Engine.open(workdir / STATE_FILE_NAME, clock, settings)
    try:
        await engine.add_eni(EniRecord("eni-0000", 0, "subnet-1", True, clock.now()))
        await engine.add_units("eni-0000", [IPV6_PREFIX], "ipv6_prefix")
        return [await _timed_add(engine, pod_key("latency-ipv6", n)) for n in range(PODS)]
    finally:
        await engine.close()


async def _timed_add(engine: Engine, key: AllocationKey) -> float:
    elapsed, _ = await timed_ms(engine.assign(key))
    return elapsed


async def _timed_del(engine: Engine, key: AllocationKey) -> float:
    elapsed, released = await timed_ms(engine.release(key))
    if len(released) != 1:
        raise RuntimeError(f"DEL of {key.container_id} released {len(released)} allocations")
    return elapsed
