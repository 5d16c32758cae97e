"""An IPv6 node for the unit tests of what operators see: its /80 and its max pods."""

from __future__ import annotations

import ipaddress

from datastore.records import EniRecord
from ipamd.engine.engine import Engine

PREFIX = "2600:1f14:abc:d00:1234::/80"
"""The primary ENI's /80."""
MAX_PODS = 110
"""An m5.large's max pods in IPv6 mode."""
PRIMARY_ENI = "eni-0000"


def v6(offset: int) -> str:
    """The address at `offset` in the /80 (::1 is the first a pod gets)."""
    return str(ipaddress.IPv6Network(PREFIX)[offset])


async def hold_prefix(engine: Engine, now: float) -> None:
    """The primary ENI with its /80, as IPv6 mode's pool leaves a node before it is ready."""
    await engine.add_eni(EniRecord(PRIMARY_ENI, 0, "subnet-1", True, now))
    await engine.add_units(PRIMARY_ENI, [PREFIX], "ipv6_prefix")
