"""ADD, GET and DEL of allocations over the real socket: answers, idempotence, intents, error codes."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from ipamd.api import create_app, serve_unix
from ipamd.api.views import PodRoutes
from tests.support.node import NodeFixture
from tests.unit.api.conftest import NETWORK, Api


async def test_add_answers_the_address_with_gateway_eni_and_routes(api: Api) -> None:
    await api.node.seed(enis=1, per_eni=4)
    pod = {"namespace": "default", "name": "web-0", "uid": "0b1c2d3e"}
    answer = await api.add("c1", pod=pod)
    assert answer.status == 200
    body = answer.body
    assert (body["network"], body["container_id"], body["ifname"]) == (NETWORK, "c1", "eth0")
    assert body["pod"] == pod
    [ip] = body["ips"]
    assert ip["address"].startswith("10.0.0.") and ip["address"].endswith("/32")
    assert ip["gateway"] == "169.254.1.1"
    assert ip["eni_id"] == "eni-0000"
    assert body["routes"] == [{"dst": "0.0.0.0/0", "gw": "169.254.1.1"}]
    owner = api.engine.state.owner_of(ip["address"][:-3])
    assert owner is not None
    record = api.engine.state.allocations()[owner]
    assert (record.pod_namespace, record.pod_name, record.pod_uid) == (
        "default",
        "web-0",
        "0b1c2d3e",
    )
    api.node.check()


async def test_same_key_again_gets_the_same_address_and_another_ifname_another(api: Api) -> None:
    await api.node.seed(enis=1, per_eni=4)
    first = await api.add("c1")
    again = await api.add("c1")
    second_if = await api.add("c1", "eth1")
    assert first.status == again.status == second_if.status == 200
    assert again.body["ips"] == first.body["ips"]
    assert second_if.body["ips"] != first.body["ips"]
    assert len(api.engine.state.allocations()) == 2
    api.node.check()


async def test_get_one_allocation_and_an_unknown_one(api: Api) -> None:
    await api.node.seed(enis=1, per_eni=4)
    added = await api.add("c1")
    found = await api.call("GET", f"/v1/allocations/c1/eth0?network={NETWORK}")
    assert found.status == 200 and found.body == added.body
    missing = await api.call("GET", f"/v1/allocations/c2/eth0?network={NETWORK}")
    assert missing.status == 404 and missing.body["code"] == "allocation_not_found"
    other_net = await api.call("GET", "/v1/allocations/c1/eth0?network=other")
    assert other_net.status == 404


async def test_delete_is_idempotent_records_the_intent_and_refuses_a_late_add(api: Api) -> None:
    await api.node.seed(enis=1, per_eni=4)
    added = await api.add("c1")
    address = added.body["ips"][0]["address"]
    first = await api.delete("c1")
    assert first.status == 200
    assert first.body == {
        "released": [
            {"network": NETWORK, "container_id": "c1", "ifname": "eth0", "addresses": [address]}
        ]
    }
    again = await api.delete("c1")
    assert again.status == 200 and again.body == {"released": []}
    late = await api.add("c1")
    assert late.status == 409
    assert late.body["code"] == "delete_intent" and late.body["retryable"] is False
    assert "c1" in str(late.body["message"])
    assert api.engine.state.allocations() == {}
    api.node.check()


async def test_delete_of_an_unknown_container_succeeds_and_still_records_the_intent(
    api: Api,
) -> None:
    await api.node.seed(enis=1, per_eni=4)
    answer = await api.delete("never-added")
    assert answer.status == 200 and answer.body == {"released": []}
    assert "never-added" in api.engine.state.intents()
    assert (await api.add("never-added")).status == 409


async def test_empty_pool_is_a_retryable_503_and_asks_the_pool_to_grow(api: Api) -> None:
    answer = await api.add("c1")
    assert answer.status == 503
    assert answer.body["code"] == "no_address" and answer.body["retryable"] is True
    assert api.engine.pool_wanted
    await api.node.seed(enis=1, per_eni=1)
    assert (await api.add("c1")).status == 200
    exhausted = await api.add("c2")
    assert exhausted.status == 503 and exhausted.body["code"] == "no_address"


@pytest.mark.parametrize("damaged", [True])
async def test_unusable_state_refuses_changes_with_its_code(api: Api) -> None:
    for answer in (await api.add("c1"), await api.delete("c1")):
        assert answer.status == 503
        assert answer.body["code"] == "state_unavailable"
        assert answer.body["retryable"] is False
        assert str(api.node.path) in str(answer.body["message"])
        assert "ipamctl repair" in str(answer.body["message"])


async def test_a_bug_is_a_500_that_tells_nothing_but_is_logged(
    api: Api, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(*args: object, **kwargs: object) -> object:
        raise RuntimeError("secret detail")

    monkeypatch.setattr(api.engine, "assign", broken)
    answer = await api.add("c1")
    assert answer.status == 500
    assert answer.body["code"] == "internal" and "secret" not in str(answer.body["message"])
    assert "secret detail" in caplog.text


async def test_every_view_of_an_allocation_shows_the_gateway_add_answered_with(
    node: NodeFixture, socket_dir: Path
) -> None:
    engine = await node.open()
    await node.seed(enis=1, per_eni=4)
    app = create_app(
        engine,
        ready=lambda: True,
        gc_grace_s=60.0,
        clock=node.clock,
        pod_routes=PodRoutes("10.0.0.5"),
    )
    socket_path = socket_dir / "gw.sock"
    runner = await serve_unix(app, socket_path)
    try:
        connector = aiohttp.UnixConnector(path=str(socket_path))
        async with aiohttp.ClientSession(connector=connector) as session:
            body = {"container_id": "c1", "ifname": "eth0", "network": NETWORK}
            async with session.post("http://ipamd/v1/allocations", json=body) as added:
                answer = await added.json()
            one = f"http://ipamd/v1/allocations/c1/eth0?network={NETWORK}"
            async with session.get(one) as got:
                single = await got.json()
            async with session.get("http://ipamd/v1/allocations") as listed:
                (item,) = (await listed.json())["allocations"]
    finally:
        await runner.cleanup()
    gateways = {ip["gateway"] for view in (answer, single, item) for ip in view["ips"]}
    assert gateways == {"10.0.0.5"}
    assert item["routes"] == answer["routes"] == [{"dst": "0.0.0.0/0", "gw": "10.0.0.5"}]


async def test_enis_say_the_datapath_is_off_without_host_networking(api: Api) -> None:
    """The API here serves the engine alone (IPAMD_HOST_NETWORK=off): nothing is set up on the
    host, and /v1/enis must not claim an ENI's datapath is ready."""
    await api.node.seed(enis=2, per_eni=2)
    enis = (await api.call("GET", "/v1/enis")).body["enis"]
    pool = (await api.call("GET", "/v1/pool")).body["enis"]
    assert {e["datapath"] for e in enis} == {e["datapath"] for e in pool} == {"off"}
