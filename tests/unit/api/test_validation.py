"""Every way a request is refused, with its status and stable code, and nothing changed by it."""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator

import pytest

from ipamd.wire import MAX_BODY_BYTES, MAX_GC_BODY_BYTES, MAX_VALID_ATTACHMENTS
from tests.unit.api.conftest import NETWORK, Api

JSON = {"Content-Type": "application/json"}
GOOD = {"container_id": "c1", "ifname": "eth0", "network": NETWORK}


def _with(**changes: object) -> dict[str, object]:
    return {**GOOD, **changes}


def _without(name: str) -> dict[str, object]:
    return {k: v for k, v in GOOD.items() if k != name}


def _assert_error(status: int, body: dict[str, object], want_status: int, code: str) -> None:
    assert (status, body.get("code")) == (want_status, code), body
    assert set(body) == {"code", "message", "retryable"}
    assert isinstance(body["message"], str) and body["message"]


RAW_BAD_BODIES = {
    "malformed JSON": b'{"container_id": "c1",',
    "empty body": b"",
    "a list, not an object": b"[]",
    "a string, not an object": b'"c1"',
    "NaN": b'{"container_id": NaN, "ifname": "eth0", "network": "n"}',
    "duplicate key": b'{"container_id": "a", "container_id": "b", "ifname": "eth0", "network": "n"}',
    "not UTF-8": b'{"container_id": "\xff"}',
}


@pytest.mark.parametrize("raw", RAW_BAD_BODIES.values(), ids=RAW_BAD_BODIES.keys())
async def test_undecodable_bodies_are_bad_requests(api: Api, raw: bytes) -> None:
    answer = await api.call("POST", "/v1/allocations", data=raw, headers=JSON)
    _assert_error(answer.status, answer.body, 400, "bad_request")


BAD_FIELDS = {
    "missing container_id": (_without("container_id"), "container_id"),
    "missing ifname": (_without("ifname"), "ifname"),
    "missing network": (_without("network"), "network"),
    "unknown field": (_with(sandbox="x"), "sandbox"),
    "unknown pod field": (_with(pod={"name": "p", "node": "n1"}), "node"),
    "container_id not a string": (_with(container_id=5), "container_id"),
    "network null": (_with(network=None), "network"),
    "pod a list": (_with(pod=["ns", "name"]), "pod"),
    "pod.name a number": (_with(pod={"name": 5}), "pod.name"),
    "pod.name too long": (_with(pod={"name": "p" * 254}), "pod.name"),
    "pod.name with a newline": (_with(pod={"name": "p\nq"}), "pod.name"),
    "empty container_id": (_with(container_id=""), "container_id"),
    "container_id of 257": (_with(container_id="c" * 257), "container_id"),
    "container_id starting with -": (_with(container_id="-c1"), "container_id"),
    "container_id with a slash": (_with(container_id="c/1"), "container_id"),
    "empty ifname": (_with(ifname=""), "ifname"),
    "ifname of 16": (_with(ifname="e" * 16), "ifname"),
    "ifname of 16 bytes in 8 characters": (_with(ifname="é" * 8), "ifname"),
    "ifname with a slash": (_with(ifname="eth/0"), "ifname"),
    "ifname with a colon": (_with(ifname="eth0:1"), "ifname"),
    "ifname with a space": (_with(ifname="eth 0"), "ifname"),
    "ifname dot-dot": (_with(ifname=".."), "ifname"),
    "network with a space": (_with(network="pod network"), "network"),
    "network of 129": (_with(network="n" * 129), "network"),
}


@pytest.mark.parametrize(("body", "named"), BAD_FIELDS.values(), ids=BAD_FIELDS.keys())
async def test_bad_fields_are_bad_requests_naming_the_field(
    api: Api, body: dict[str, object], named: str
) -> None:
    await api.node.seed(enis=1, per_eni=4)
    answer = await api.call("POST", "/v1/allocations", json=body)
    _assert_error(answer.status, answer.body, 400, "bad_request")
    assert named in str(answer.body["message"])
    assert api.engine.state.allocations() == {}


async def test_longest_valid_identifiers_are_accepted(api: Api) -> None:
    await api.node.seed(enis=1, per_eni=4)
    body = _with(container_id="c" * 256, ifname="e" * 15, pod={"name": "p" * 253})
    assert (await api.call("POST", "/v1/allocations", json=body)).status == 200


async def test_oversized_body_is_refused_by_its_declared_length(api: Api) -> None:
    raw = json.dumps(_with(pod={"name": "p" * MAX_BODY_BYTES})).encode()
    answer = await api.call("POST", "/v1/allocations", data=raw, headers=JSON)
    _assert_error(answer.status, answer.body, 413, "payload_too_large")


async def test_oversized_chunked_body_is_refused_as_it_arrives(api: Api) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(5):
            yield b" " * 4096
        yield json.dumps(GOOD).encode()

    async with api.session.post(
        "http://ipamd/v1/allocations", data=chunks(), headers=JSON
    ) as response:
        body = await response.json()
        assert "Content-Length" not in response.request_info.headers
    _assert_error(response.status, body, 413, "payload_too_large")


async def test_gc_body_limit_is_larger_but_bounded(api: Api) -> None:
    many = [{"container_id": f"c{i}", "ifname": "eth0"} for i in range(MAX_VALID_ATTACHMENTS)]
    fits = await api.call("POST", "/v1/gc", json={"network": NETWORK, "valid_attachments": many})
    assert fits.status == 200, fits.body
    too_many = [*many, {"container_id": "one-more", "ifname": "eth0"}]
    answer = await api.call(
        "POST", "/v1/gc", json={"network": NETWORK, "valid_attachments": too_many}
    )
    _assert_error(answer.status, answer.body, 400, "bad_request")
    huge = b'{"network": "n", "valid_attachments": []' + b" " * MAX_GC_BODY_BYTES + b"}"
    answer = await api.call("POST", "/v1/gc", data=io.BytesIO(huge), headers=JSON)
    _assert_error(answer.status, answer.body, 413, "payload_too_large")


BAD_GC = {
    "list missing": {"network": NETWORK},
    "list a dict": {"network": NETWORK, "valid_attachments": {}},
    "entry missing ifname": {"network": NETWORK, "valid_attachments": [{"container_id": "c"}]},
    "entry with CNI's key spelling": {
        "network": NETWORK,
        "valid_attachments": [{"containerID": "c", "ifname": "eth0"}],
    },
    "entry with a bad ifname": {
        "network": NETWORK,
        "valid_attachments": [{"container_id": "c", "ifname": "x" * 16}],
    },
    "unknown field": {"network": NETWORK, "valid_attachments": [], "dry_run": True},
}


@pytest.mark.parametrize("body", BAD_GC.values(), ids=BAD_GC.keys())
async def test_bad_gc_bodies_release_nothing(api: Api, body: dict[str, object]) -> None:
    await api.node.seed(enis=1, per_eni=4)
    await api.add("c1")
    api.node.clock.advance(3600)
    answer = await api.call("POST", "/v1/gc", json=body)
    _assert_error(answer.status, answer.body, 400, "bad_request")
    assert len(api.engine.state.allocations()) == 1


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "application/json; charset=latin-1"],
)
async def test_a_body_that_is_not_utf8_json_is_an_unsupported_media_type(
    api: Api, content_type: str
) -> None:
    raw = json.dumps(GOOD).encode()
    answer = await api.call(
        "POST", "/v1/allocations", data=raw, headers={"Content-Type": content_type}
    )
    _assert_error(answer.status, answer.body, 415, "unsupported_media_type")


async def test_json_with_a_utf8_charset_is_accepted(api: Api) -> None:
    await api.node.seed(enis=1, per_eni=4)
    raw = json.dumps(GOOD).encode()
    headers = {"Content-Type": "application/json; charset=utf-8"}
    assert (await api.call("POST", "/v1/allocations", data=raw, headers=headers)).status == 200


async def test_unknown_route_and_wrong_method(api: Api) -> None:
    missing = await api.call("GET", "/v1/nothing")
    _assert_error(missing.status, missing.body, 404, "not_found")
    wrong = await api.call("PUT", "/v1/allocations", json=GOOD)
    _assert_error(wrong.status, wrong.body, 405, "method_not_allowed")
    assert set(wrong.headers["Allow"].split(",")) >= {"GET", "POST"}


BAD_DELETES = {
    "no network": "/v1/allocations/c1/eth0",
    "network twice": f"/v1/allocations/c1/eth0?network={NETWORK}&network=other",
    "unknown parameter": f"/v1/allocations/c1/eth0?network={NETWORK}&force=1",
    "bad network": "/v1/allocations/c1/eth0?network=a%20b",
    "ifname too long": f"/v1/allocations/c1/{'e' * 16}?network={NETWORK}",
    "ifname with a colon": f"/v1/allocations/c1/eth0:1?network={NETWORK}",
    "bad container id": f"/v1/allocations/-c1/eth0?network={NETWORK}",
}


@pytest.mark.parametrize("path", BAD_DELETES.values(), ids=BAD_DELETES.keys())
async def test_bad_deletes_are_bad_requests_and_record_nothing(api: Api, path: str) -> None:
    await api.node.seed(enis=1, per_eni=4)
    await api.add("c1")
    answer = await api.call("DELETE", path)
    _assert_error(answer.status, answer.body, 400, "bad_request")
    assert api.engine.state.intents() == {} and len(api.engine.state.allocations()) == 1


@pytest.mark.parametrize(
    "path", ["/v1/intents?limit=abc", "/v1/intents?limit=0", "/v1/intents?limit=²", "/v1/pool?x=1"]
)
async def test_bad_query_parameters_on_reads(api: Api, path: str) -> None:
    answer = await api.call("GET", path)
    _assert_error(answer.status, answer.body, 400, "bad_request")
