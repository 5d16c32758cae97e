"""The test API server's faults: 429 with Retry-After and 5xx N times, a slow answer, the server
down at start and down mid-watch, a rotated token; and the record of every request."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest

from tests.support.kube_api import KubeApiServer, RecordedRequest
from tests.unit.kube_api.conftest import read_events

NODE = "ip-10-0-0-10"
NODE_PATH = f"/api/v1/nodes/{NODE}"


async def test_throttle_answers_429_with_retry_after_n_times(kube_api: KubeApiServer) -> None:
    kube_api.add_node(NODE)
    kube_api.throttle(2, retry_after_s=7)
    async with kube_api.session() as client:
        answers = [await client.get(NODE_PATH) for _ in range(3)]
        throttled = await answers[0].json()
    assert [a.status for a in answers] == [429, 429, 200]
    assert answers[0].headers["Retry-After"] == "7"
    assert (
        throttled["reason"] == "TooManyRequests" and throttled["details"]["retryAfterSeconds"] == 7
    )
    assert [r.status for r in kube_api.requests] == [429, 429, 200]


async def test_fail_answers_a_5xx_status_n_times_and_only_to_matching_requests(
    kube_api: KubeApiServer,
) -> None:
    kube_api.add_node(NODE)

    def watches(request: RecordedRequest) -> bool:
        return request.is_watch

    kube_api.fail(1, status=500, match=watches)
    kube_api.fail(2, status=503)
    async with kube_api.session() as client:
        first, second = await client.get(NODE_PATH), await client.get(NODE_PATH)
        watch = await client.get("/api/v1/nodes", params={"watch": "1", "timeoutSeconds": "0.1"})
        after = await client.get(NODE_PATH)
        body = await first.json()
        watch.release()
    assert [first.status, second.status, watch.status, after.status] == [503, 503, 500, 200]
    assert body["kind"] == "Status" and body["reason"] == "ServiceUnavailable"


async def test_slow_delays_the_answer(kube_api: KubeApiServer) -> None:
    kube_api.add_node(NODE)
    kube_api.slow(0.5, times=1)
    async with kube_api.session() as client:
        started = time.monotonic()
        assert (await client.get(NODE_PATH)).status == 200
        slow = time.monotonic() - started
        started = time.monotonic()
        assert (await client.get(NODE_PATH)).status == 200  # times=1: this one is not delayed
        fast = time.monotonic() - started
        kube_api.slow(30.0)
        with pytest.raises(TimeoutError):
            await client.get(NODE_PATH, timeout=aiohttp.ClientTimeout(total=0.2))
        kube_api.clear_faults()  # the request still delayed is answered now
    assert slow >= 0.5 > fast


async def test_a_server_down_at_start_refuses_connections_until_up() -> None:
    async with KubeApiServer(serving=False) as api:
        config = json.loads(api.kubeconfig.read_text())
        assert config["clusters"][0]["cluster"]["server"] == api.url and not api.serving
        api.add_node(NODE)
        async with api.session() as client:
            with pytest.raises(aiohttp.ClientConnectionError):
                await client.get(NODE_PATH)
            await api.up()
            assert (await client.get(NODE_PATH)).status == 200
            await api.down()
            with pytest.raises(aiohttp.ClientConnectionError):
                await client.get(NODE_PATH)
            await api.up()
            assert (await client.get(NODE_PATH)).status == 200


async def test_down_cuts_an_open_watch(kube_api: KubeApiServer) -> None:
    async with (
        kube_api.session() as client,
        client.get("/api/v1/pods", params={"watch": "1"}) as watch,
    ):
        await kube_api.wait_for_watches(1)
        kube_api.add_pod("a", NODE)
        assert len(await read_events(watch, 1)) == 1
        await kube_api.down()
        with pytest.raises(aiohttp.ClientPayloadError):
            async with asyncio.timeout(5):
                await watch.content.read()


async def test_a_rotated_token_makes_the_old_one_401() -> None:
    async with KubeApiServer(token_file=True) as api:
        api.add_node(NODE)
        old = api.token
        config = json.loads(api.kubeconfig.read_text())
        assert config["users"][0]["user"] == {"tokenFile": str(api.token_path)}
        assert api.token_path.read_text().strip() == old
        new = api.rotate_token()
        assert new != old and api.token_path.read_text().strip() == new
        async with api.session(token=old) as stale, api.session() as fresh:
            refused = await stale.get(NODE_PATH)
            assert refused.status == 401 and (await refused.json())["reason"] == "Unauthorized"
            assert (await fresh.get(NODE_PATH)).status == 200


async def test_no_token_is_403_but_for_the_public_paths(kube_api: KubeApiServer) -> None:
    async with aiohttp.ClientSession(base_url=kube_api.url) as anonymous:
        assert (await anonymous.get("/api/v1/pods")).status == 403
        assert (await anonymous.get("/version")).status == 200
        assert (await anonymous.get("/readyz")).status == 200
    async with kube_api.session() as client:
        assert (await client.get("/api")).status == 200
        groups = await (await client.get("/apis")).json()
        assert {g["name"] for g in groups["groups"]} == {"crd.k8s.amazonaws.com", "events.k8s.io"}
        resources = await (await client.get("/apis/crd.k8s.amazonaws.com/v1alpha1")).json()
        assert [r["name"] for r in resources["resources"]] == ["eniconfigs"]
        assert (await client.get("/api/v1/configmaps")).status == 404


async def test_every_request_is_recorded_with_its_query_headers_and_body(
    kube_api: KubeApiServer,
) -> None:
    kube_api.add_node(NODE)
    kube_api.throttle(1)
    async with kube_api.session() as client:
        await client.get("/api/v1/pods", params={"fieldSelector": f"spec.nodeName={NODE}"})
        await client.patch(
            NODE_PATH,
            data=json.dumps({"metadata": {"labels": {"a": "b"}}}),
            headers={"Content-Type": "application/merge-patch+json", "User-Agent": "ipamd/0.1.0"},
        )
    throttled, patched = kube_api.requests
    assert (throttled.method, throttled.path, throttled.status) == ("GET", "/api/v1/pods", 429)
    assert throttled.field_selector == f"spec.nodeName={NODE}" and throttled.kind_plural == "pods"
    assert throttled.headers["authorization"] == f"Bearer {kube_api.token}"
    assert patched.json == {"metadata": {"labels": {"a": "b"}}} and patched.status == 200
    assert patched.headers["user-agent"] == "ipamd/0.1.0"
    assert kube_api.requests_for("nodes", "PATCH") == [patched]
