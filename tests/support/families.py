"""The two address families as an engine test node holds them, for tests that run on both (the
`family` fixture, `tests/conftest.py`): an IPv4 node's one ENI of secondary IPs and the default pick,
an IPv6 node's /80 on the primary ENI and IPv6's pick, as the composition sets each up
(`ipamd.node.family`)."""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from datastore.records import EniRecord
from ipamd.engine.allocator import Pick
from ipamd.engine.engine import Engine
from ipamd.engine.pick_v6 import pick_v6_addresses
from tests.support.node import NodeFixture, secondary_ips

PREFIX = "2600:1f14:abc:d00:1234::/80"


async def _ipv4_units(engine: Engine, now: float) -> None:
    await engine.add_eni(EniRecord("eni-0000", 0, "subnet-1", True, now))
    await engine.add_units("eni-0000", secondary_ips(0, 8), "ip")


async def _ipv6_units(engine: Engine, now: float) -> None:
    await engine.add_eni(EniRecord("eni-0000", 0, "subnet-1", True, now))
    await engine.add_units("eni-0000", [PREFIX], "ipv6_prefix")


@dataclass(frozen=True)
class Family:
    name: str
    pick: Pick | None
    """The family's pick, as `ipamd.node.family` gives the engine (None: the default)."""
    hold: Callable[[Engine, float], Awaitable[None]]
    """The node's units before its first pod, as the family's pool leaves them."""
    nth: Callable[[int], str]
    """The address the n-th pod on a fresh node gets (1 is the first)."""


FAMILIES = (
    Family("ipv4", None, _ipv4_units, lambda n: secondary_ips(0, 8)[n - 1].split("/")[0]),
    Family("ipv6", pick_v6_addresses, _ipv6_units, lambda n: str(ipaddress.IPv6Network(PREFIX)[n])),
)


async def open_node(node: NodeFixture, family: Family, **params: float | int | None) -> Engine:
    """`node`'s engine opened as `family`'s node, its units in place; `params` sets the engine's
    other parameters (`EngineParams`: cooldown_s, max_pods, ...)."""
    node.settings = replace(node.settings, pick=family.pick, **params)  # type: ignore[arg-type]
    engine = await node.open()
    await family.hold(engine, node.clock.now())
    return engine
