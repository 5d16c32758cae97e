"""The CNI GC verb through the API: what the runtime does not list, past grace, goes like a DEL."""

from __future__ import annotations

import pytest

from tests.unit.api.conftest import GC_GRACE_S, NETWORK, Api


def _gc(valid: list[tuple[str, str]], network: str = NETWORK) -> dict[str, object]:
    return {
        "network": network,
        "valid_attachments": [{"container_id": c, "ifname": i} for c, i in valid],
    }


async def test_gc_releases_unlisted_attachments_past_grace_only(api: Api) -> None:
    await api.node.seed(enis=1, per_eni=8)
    for cid in ("live", "dead", "dead2"):
        assert (await api.add(cid)).status == 200
    other = await api.call(
        "POST",
        "/v1/allocations",
        json={"container_id": "elsewhere", "ifname": "eth0", "network": "other"},
    )
    assert other.status == 200
    api.node.clock.advance(GC_GRACE_S)
    assert (await api.add("young")).status == 200

    answer = await api.call("POST", "/v1/gc", json=_gc([("live", "eth0"), ("gone", "eth0")]))
    assert answer.status == 200
    released = answer.body["released"]
    assert isinstance(released, list)
    assert sorted(r["container_id"] for r in released) == ["dead", "dead2"]
    assert all(r["network"] == NETWORK and r["ifname"] == "eth0" for r in released)
    keys = {(k.network, k.container_id) for k in api.engine.state.allocations()}
    assert keys == {(NETWORK, "live"), (NETWORK, "young"), ("other", "elsewhere")}
    assert (await api.add("dead")).status == 409, "GC releases with a delete intent, as DEL does"
    api.node.check()


async def test_gc_with_an_empty_list_releases_the_whole_network_past_grace(api: Api) -> None:
    await api.node.seed(enis=1, per_eni=4)
    await api.add("a")
    await api.add("b")
    api.node.clock.advance(GC_GRACE_S)
    answer = await api.call("POST", "/v1/gc", json=_gc([]))
    assert answer.status == 200 and len(answer.body["released"]) == 2
    assert api.engine.state.allocations() == {}
    again = await api.call("POST", "/v1/gc", json=_gc([]))
    assert again.status == 200 and again.body == {"released": []}
    api.node.check()


@pytest.mark.parametrize("damaged", [True])
async def test_gc_with_an_unusable_state_file_is_refused_as_del_is(api: Api) -> None:
    body = {"network": NETWORK, "valid_attachments": []}
    collected = await api.call("POST", "/v1/gc", json=body)
    deleted = await api.delete("c1")
    assert collected.status == deleted.status == 503
    assert collected.body["code"] == deleted.body["code"] == "state_unavailable"
    assert "ipamctl repair" in str(collected.body["message"])
