"""The metrics and the introspection endpoint on an IPv6 node: one /80 on the primary ENI and a few
pods' /128s. The /80 is listed under the primary ENI's IPv6Cidrs with the addresses in use, the
totals are VPC CNI's (2^48 per /80), the free count is what max pods still allows, and nothing
enumerates the /80."""

from __future__ import annotations

import base64
import ipaddress
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ipamd.clock import FakeClock
from ipamd.engine.allocator import EngineParams
from ipamd.engine.engine import Engine
from ipamd.engine.pick_v6 import pick_v6_addresses
from ipamd.model import AddressState, EniView, PodRef, PoolSnapshot, UnitView
from ipamd.telemetry.introspection import View, eni_infos, pod_infos
from ipamd.telemetry.metrics import Recorders
from ipamd.telemetry.totals import V6_PREFIX_SIZE, total_addresses
from tests.support.ipv6 import MAX_PODS, PREFIX, hold_prefix, v6
from tests.support.node import NodeFixture, key
from tests.unit.telemetry.test_collectors import scrape, sources, value

ZERO_TIME = "0001-01-01T00:00:00Z"


@pytest.fixture
async def node(state_path: Path, clock: FakeClock) -> AsyncIterator[NodeFixture]:
    """A node whose engine knows its max pods, as the daemon's does."""
    fixture = NodeFixture(state_path, clock, EngineParams(max_pods=MAX_PODS))
    yield fixture
    await fixture.close()


@pytest.fixture
async def engine(node: NodeFixture) -> Engine:
    """IPv6 mode's node: the primary ENI with its /80; pods ::1 to ::3, ::1's pod deleted (its
    address cooling), so two assigned and one cooling."""
    node.settings = replace(node.settings, pick=pick_v6_addresses)  # the family's pick
    engine = await node.open()
    await hold_prefix(engine, node.clock.now())
    await engine.assign(key("c0"), PodRef("default", "web-0", "u0"))
    await engine.assign(key("c1"), PodRef("default", "web-1", "u1"))
    await engine.assign(key("c2"), PodRef("shop", "cart-0", "u2"))
    await engine.release(key("c0"))
    return engine


async def test_the_metrics_count_the_pods_and_vpc_cnis_total(engine: Engine) -> None:
    families = scrape(Recorders(), sources(engine, max_addresses=MAX_PODS))
    assert value(families, "awscni_total_ip_addresses") == 2**48, "VPC CNI's Size() of a /80"
    assert value(families, "awscni_assigned_ip_addresses") == 2
    assert value(families, "awscni_assigned_ip_per_cidr", cidr=PREFIX) == 2
    assert value(families, "awscni_assigned_ip_per_eni", eni="eni-0000") == 2
    assert value(families, "awscni_total_ipv4_prefixes") == 0, "a /80 is no IPv4 prefix"
    assert value(families, "awscni_eni_allocated") == 1
    assert value(families, "awscni_ip_max") == MAX_PODS
    assert value(families, "ipamd_addresses", state="assigned") == 2
    assert value(families, "ipamd_addresses", state="cooling") == 1
    assert value(families, "ipamd_addresses", state="free") == MAX_PODS - 2, "pods still allowed"
    assert value(families, "ipamd_addresses", state="releasing") == 0


async def test_the_total_counts_a_80_once_whatever_its_pods(engine: Engine) -> None:
    before = total_addresses(engine.snapshot())
    await engine.assign(key("more"))
    assert before == total_addresses(engine.snapshot()) == V6_PREFIX_SIZE


def test_a_lost_80_counts_only_its_owned_addresses() -> None:
    """EC2 no longer lists it: like a lost IPv4 unit, it is the addresses its pods still own."""
    lost = UnitView(PREFIX, "ipv6_prefix", "lost", ((v6(5), AddressState.LOST),))
    eni = EniView("eni-0000", 0, "subnet-1", True, (lost,))
    snap = PoolSnapshot(0.0, (eni,), {AddressState.LOST: 1}, 1, 0, 0)
    assert total_addresses(snap) == 1


async def test_enis_lists_the_80_under_ipv6_cidrs_with_the_addresses_in_use(
    engine: Engine,
) -> None:
    body: dict[str, Any] = eni_infos(View(engine))
    assert (body["TotalIPs"], body["AssignedIPs"]) == (2**48, 2)
    primary = body["ENIs"]["eni-0000"]
    assert primary["IsPrimary"] is True and primary["DeviceNumber"] == 0
    assert primary["AvailableIPv4Cidrs"] == {}
    assert list(primary["IPv6Cidrs"]) == [PREFIX]
    info = primary["IPv6Cidrs"][PREFIX]
    mask = base64.b64encode(ipaddress.IPv6Network(PREFIX).netmask.packed).decode()
    assert info["Cidr"] == {"IP": "2600:1f14:abc:d00:1234::", "Mask": mask}
    assert (info["IsPrefix"], info["AddressFamily"]) == (True, "6")
    addresses = info["IPAddresses"]
    assert list(addresses) == [v6(1), v6(2), v6(3)], "in use only, never the /80's 2^48"
    cooled, web, cart = (addresses[v6(n)] for n in (1, 2, 3))
    assert cooled["IPAMKey"]["containerID"] == "" and cooled["UnassignedTime"] != ZERO_TIME
    assert web["IPAMKey"]["containerID"] == "c1" and web["UnassignedTime"] == ZERO_TIME
    assert web["IPAMMetadata"] == {"k8sPodNamespace": "default", "k8sPodName": "web-1"}
    assert cart["Address"] == v6(3) and cart["IPAMMetadata"]["k8sPodName"] == "cart-0"


async def test_pods_show_their_128(engine: Engine) -> None:
    body = pod_infos(View(engine))
    assert body == {
        "web-1_default_c1": {
            "IPAMKey": {"networkName": "k8s-pod-network", "containerID": "c1", "ifName": "eth0"},
            "IP": v6(2),
            "DeviceNumber": 0,
        },
        "cart-0_shop_c2": {
            "IPAMKey": {"networkName": "k8s-pod-network", "containerID": "c2", "ifName": "eth0"},
            "IP": v6(3),
            "DeviceNumber": 0,
        },
    }


async def test_an_ipv4_node_keeps_its_totals_and_family(node: NodeFixture) -> None:
    """IPv4 is as it was: the total is the addresses of every state, AddressFamily "4"."""
    [cidrs] = await node.seed(enis=1, per_eni=2, kind="prefix")
    engine = node.engine
    assert engine is not None
    await engine.assign(key("a"))
    snap = engine.snapshot()
    assert total_addresses(snap) == sum(snap.counts.values()) == 32
    body: dict[str, Any] = eni_infos(View(engine))
    primary = body["ENIs"]["eni-0000"]
    assert primary["IPv6Cidrs"] == {} and set(primary["AvailableIPv4Cidrs"]) == set(cidrs)
    assert {c["AddressFamily"] for c in primary["AvailableIPv4Cidrs"].values()} == {"4"}
