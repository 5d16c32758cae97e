"""What the API and `ipamctl` show of an IPv6 node: the primary ENI's /80, the pods' /128s with their
pods, and a free count that is the pods max pods still allows, never the /80's 2^48."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ipamd.api.views import IPV6_POD_ROUTES, PodRoutes
from ipamd.cli.ipamctl import render_status
from ipamd.clock import FakeClock
from ipamd.engine.allocator import EngineParams
from ipamd.engine.pick_v6 import pick_v6_addresses
from tests.support.ipv6 import MAX_PODS, PREFIX, hold_prefix, v6
from tests.support.node import NodeFixture
from tests.unit.api.conftest import Api
from tests.unit.api.test_ipamctl import _ipamctl


@pytest.fixture
async def node(state_path: Path, clock: FakeClock) -> AsyncIterator[NodeFixture]:
    """An IPv6 node's engine: its max pods and its family's pick, as the daemon's."""
    settings = EngineParams(max_pods=MAX_PODS, pick=pick_v6_addresses)
    fixture = NodeFixture(state_path, clock, settings)
    yield fixture
    await fixture.close()


@pytest.fixture
def pod_routes() -> PodRoutes:
    """An IPv6 node's, as the composition gives its API."""
    return IPV6_POD_ROUTES


@pytest.fixture
async def v6_api(api: Api) -> Api:
    """IPv6 mode's node behind the API: the primary ENI with its /80; pods a (::1, deleted, so
    cooling), b (::2) and c (::3)."""
    engine, now = api.engine, api.node.clock.now()
    await hold_prefix(engine, now)
    for cid, name in (("a", "web-0"), ("b", "web-1"), ("c", "cart-0")):
        added = await api.add(cid, pod={"namespace": "shop", "name": name, "uid": cid})
        assert added.status == 200, added.body
    assert (await api.delete("a")).status == 200
    return api


async def test_pool_counts_the_pods_and_names_the_80(v6_api: Api) -> None:
    body = (await v6_api.call("GET", "/v1/pool")).body
    free = MAX_PODS - 2
    assert body["counts"] == {
        "free": free,
        "assigned": 2,
        "cooling": 1,
        "held": 0,
        "releasing": 0,
        "lost": 0,
    }
    [eni] = body["enis"]
    assert eni["is_primary"] is True and eni["ipv6_prefixes"] == [PREFIX]
    assert eni["counts"] == body["counts"]


async def test_enis_list_the_80_with_its_addresses_in_use(v6_api: Api) -> None:
    [eni] = (await v6_api.call("GET", "/v1/enis")).body["enis"]
    [unit] = eni["units"]
    assert (unit["cidr"], unit["kind"], unit["state"]) == (PREFIX, "ipv6_prefix", "active")
    assert unit["addresses"] == [
        {"address": v6(1), "state": "cooling"},
        {"address": v6(2), "state": "assigned"},
        {"address": v6(3), "state": "assigned"},
    ]
    assert unit["unlisted"] == MAX_PODS - 2 == eni["counts"]["free"]


async def test_allocations_show_each_pods_128(v6_api: Api) -> None:
    listed = (await v6_api.call("GET", "/v1/allocations")).body["allocations"]
    shown = {a["container_id"]: (a["ips"][0]["address"], a["pod"]["name"]) for a in listed}
    assert shown == {"b": (f"{v6(2)}/128", "web-1"), "c": (f"{v6(3)}/128", "cart-0")}


async def test_ipamctl_status_and_allocations(v6_api: Api) -> None:
    code, out, err = await _ipamctl("--socket", str(v6_api.socket_path), "status")
    assert code == 0, err
    [total] = [line.split() for line in out.splitlines() if line.startswith("total")]
    assert total == ["total", str(MAX_PODS - 2), "2", "1", "0", "0", "0"]
    assert f"  {PREFIX} on eni-0000" in out.splitlines()
    assert "FREE = pods max pods still allows" in out
    assert str(2**48) not in out and str(2**48 - 1) not in out
    code, out, err = await _ipamctl("--socket", str(v6_api.socket_path), "allocations")
    assert code == 0, err
    rows = out.splitlines()[1:]
    assert len(rows) == 2
    assert f"{v6(2)}/128" in rows[0] and "shop/web-1" in rows[0]
    assert f"{v6(3)}/128" in rows[1] and "shop/cart-0" in rows[1]


def test_status_says_the_targets_do_nothing_in_ipv6_mode() -> None:
    counts = {"free": 108, "assigned": 2, "cooling": 0, "held": 0, "releasing": 0, "lost": 0}
    eni = {"eni_id": "eni-0000", "device_index": 0, "is_primary": True, "counts": counts}
    report = {
        "mode": "prefix",
        "targets": {"WARM_PREFIX_TARGET": 1},
        "limits": {"max_enis": 3, "max_pods": 110},
    }
    pool = {"counts": counts, "allocations": 2, "intents": 0, "quarantined": 0, **report}
    ipv4 = render_status({**pool, "enis": [eni]}).splitlines()
    ipv6 = render_status({**pool, "enis": [{**eni, "ipv6_prefixes": [PREFIX]}]}).splitlines()
    assert "mode: prefix  targets: WARM_PREFIX_TARGET=1" in ipv4
    assert not any("IPv6" in line for line in ipv4)
    assert "mode: IPv6, the warm targets, MINIMUM_IP_TARGET and MAX_ENI have no effect" in ipv6
    assert not any("targets:" in line for line in ipv6)
    assert "limits: max_enis=3  max_pods=110" in ipv6
