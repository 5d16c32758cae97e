"""The read-only routes: pool, ENIs, allocations, intents, health and readiness."""

from __future__ import annotations

import pytest

from tests.unit.api.conftest import NETWORK, Api


async def test_pool_counts_per_state_node_wide_and_per_eni(api: Api) -> None:
    await api.node.seed(enis=2, per_eni=3)
    for cid in ("a", "b", "c"):
        await api.add(cid)
    await api.delete("c")  # its address cools down
    answer = await api.call("GET", "/v1/pool")
    assert answer.status == 200
    body = answer.body
    assert body["counts"] == {
        "free": 3,
        "assigned": 2,
        "cooling": 1,
        "held": 0,
        "releasing": 0,
        "lost": 0,
    }
    assert (body["allocations"], body["intents"], body["quarantined"]) == (2, 1, 0)
    enis = body["enis"]
    assert isinstance(enis, list) and [e["eni_id"] for e in enis] == ["eni-0000", "eni-0001"]
    assert enis[0]["is_primary"] is True and enis[1]["device_index"] == 1
    for state in ("free", "assigned", "cooling"):
        assert sum(e["counts"][state] for e in enis) == body["counts"][state]
    assert "units" not in enis[0]
    assert body["taken_at"] == api.node.clock.now()


async def test_enis_list_units_and_the_state_of_each_address(api: Api) -> None:
    [cidrs] = await api.node.seed(enis=1, per_eni=2)
    added = await api.add("a")
    address = added.body["ips"][0]["address"][:-3]
    answer = await api.call("GET", "/v1/enis")
    assert answer.status == 200
    [eni] = answer.body["enis"]
    assert [u["cidr"] for u in eni["units"]] == cidrs
    states = {a["address"]: a["state"] for u in eni["units"] for a in u["addresses"]}
    assert states[address] == "assigned"
    assert sorted(states.values()) == ["assigned", "free"]
    assert all(u["kind"] == "ip" and u["state"] == "active" for u in eni["units"])


async def test_allocations_list_every_allocation_oldest_first_with_its_pod(api: Api) -> None:
    await api.node.seed(enis=1, per_eni=4)
    await api.add("first", pod={"namespace": "ns", "name": "p1", "uid": "u1"})
    api.node.clock.advance(1)
    await api.add("second")
    answer = await api.call("GET", "/v1/allocations")
    assert answer.status == 200
    listed = answer.body["allocations"]
    assert isinstance(listed, list)
    assert [a["container_id"] for a in listed] == ["first", "second"]
    assert listed[0]["pod"] == {"namespace": "ns", "name": "p1", "uid": "u1"}
    assert "pod" not in listed[1]
    assert all(a["network"] == NETWORK and a["ips"][0]["gateway"] for a in listed)
    assert answer.body["quarantined"] == []


async def test_intents_list_active_ones_oldest_first_with_expiry_and_a_limit(api: Api) -> None:
    ttl = api.engine.settings.intent_ttl_s
    start = api.node.clock.now()
    for i, cid in enumerate(("old", "mid", "new")):
        api.node.clock.advance(ttl / 4 if i else 0)
        await api.delete(cid)
    answer = await api.call("GET", "/v1/intents")
    assert answer.status == 200
    body = answer.body
    assert body["total"] == 3 and body["ttl_s"] == ttl
    listed = body["intents"]
    assert isinstance(listed, list)
    assert [i["container_id"] for i in listed] == ["old", "mid", "new"]
    assert listed[0] == {"container_id": "old", "first_del_at": start, "expires_at": start + ttl}
    limited = await api.call("GET", "/v1/intents?limit=1")
    assert limited.body["total"] == 3 and len(limited.body["intents"]) == 1
    api.node.clock.advance(ttl * 0.6)  # "old" has expired; it no longer refuses anything
    later = await api.call("GET", "/v1/intents")
    assert [i["container_id"] for i in later.body["intents"]] == ["mid", "new"]


async def test_healthz_and_readyz_follow_the_readiness_flag(api: Api) -> None:
    health = await api.call("GET", "/healthz")
    assert health.status == 200 and health.body == {"status": "ok"}
    not_yet = await api.call("GET", "/readyz")
    assert not_yet.status == 503
    assert not_yet.body["code"] == "not_ready" and not_yet.body["retryable"] is True
    api.ready.value = True
    ready = await api.call("GET", "/readyz")
    assert ready.status == 200 and ready.body == {"status": "ready"}


@pytest.mark.parametrize("damaged", [True])
async def test_readyz_fails_on_an_unusable_state_file_though_ready_and_healthz_does_not(
    api: Api,
) -> None:
    api.ready.value = True
    broken = await api.call("GET", "/readyz")
    assert broken.status == 503 and str(api.node.path) in str(broken.body["message"])
    assert (await api.call("GET", "/healthz")).status == 200
