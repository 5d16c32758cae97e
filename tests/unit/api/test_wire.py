"""The shared request and response types: strict parsing, round trips, the identifier rules."""

from __future__ import annotations

import pytest

from ipamd.wire import (
    AllocateRequest,
    Allocation,
    Attachment,
    ErrorBody,
    GcRequest,
    IpConfig,
    PodInfo,
    Route,
    WireError,
    check_ifname,
    parse_object,
)


def test_requests_round_trip_through_json() -> None:
    add = AllocateRequest("c1", "eth0", "net", PodInfo("ns", "p", "u"))
    assert AllocateRequest.from_json(add.to_json()) == add
    bare = AllocateRequest("c1", "eth0", "net")
    assert "pod" not in bare.to_json() and AllocateRequest.from_json(bare.to_json()) == bare
    gc = GcRequest("net", (Attachment("c1", "eth0"), Attachment("c2", "net1")))
    assert GcRequest.from_json(gc.to_json()) == gc


def test_responses_round_trip_and_tolerate_fields_they_do_not_know() -> None:
    alloc = Allocation(
        "net",
        "c1",
        "eth0",
        (IpConfig("10.0.0.10/32", "169.254.1.1", "eni-1"),),
        (Route("0.0.0.0/0", "169.254.1.1"), Route("10.0.0.0/8")),
        1.5,
        PodInfo("ns", "p", "u"),
    )
    body = alloc.to_json()
    assert Allocation.from_json(body) == alloc
    assert Allocation.from_json({**body, "added_later": 1}) == alloc
    error = ErrorBody("no_address", "empty", retryable=True)
    assert ErrorBody.from_json({**error.to_json(), "extra": 1}) == error


@pytest.mark.parametrize(
    "body",
    [
        {
            "network": "n",
            "container_id": "c",
            "ifname": "e",
            "ips": "x",
            "routes": [],
            "created_at": 1,
        },
        {
            "network": "n",
            "container_id": "c",
            "ifname": "e",
            "ips": [],
            "routes": [],
            "created_at": True,
        },
        {
            "network": 1,
            "container_id": "c",
            "ifname": "e",
            "ips": [],
            "routes": [],
            "created_at": 1,
        },
        {
            "network": "n",
            "container_id": "c",
            "ifname": "e",
            "ips": [{"address": 1}],
            "created_at": 1,
        },
    ],
)
def test_responses_of_the_wrong_shape_are_wire_errors(body: dict[str, object]) -> None:
    with pytest.raises(WireError):
        Allocation.from_json(body)


@pytest.mark.parametrize("name", ["eth0", "e" * 15, "net-1.2_x", "vlan@eth0"])
def test_linux_interface_names_that_are_valid(name: str) -> None:
    assert check_ifname(name) == name


@pytest.mark.parametrize(
    "name", ["", ".", "..", "e" * 16, "a/b", "a:b", "a b", "a\tb", "a\x00b", "ü" * 8, 5]
)
def test_linux_interface_names_that_are_not(name: object) -> None:
    with pytest.raises(WireError):
        check_ifname(name)


@pytest.mark.parametrize("raw", [b"{", b"[1]", b"Infinity", b'{"a": -Infinity}', b'{"a":1,"a":2}'])
def test_parse_object_is_strict(raw: bytes) -> None:
    with pytest.raises(WireError):
        parse_object(raw)


def test_deeply_nested_json_is_a_wire_error_not_a_crash() -> None:
    with pytest.raises(WireError):
        parse_object(b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}")


def test_interface_address_covers_the_node_gateway_for_ptp() -> None:
    from ipamd.cni.plugin import interface_address

    assert interface_address("10.0.145.101/32", "10.0.0.5") == "10.0.145.101/16"
    assert interface_address("10.0.0.7/32", "10.0.0.6") == "10.0.0.7/31"
    assert interface_address("10.1.2.3/32", "169.254.1.1") == "10.1.2.3/32"
    # The /30 covering both would make the node's address its broadcast (the pod's, its network
    # address): ptp's default route via a broadcast address fails, so the prefix widens.
    assert interface_address("10.0.1.200/32", "10.0.1.203") == "10.0.1.200/28"
    assert interface_address("10.0.1.203/32", "10.0.1.200") == "10.0.1.203/28"
    assert interface_address("10.0.1.208/32", "10.0.1.207") == "10.0.1.208/27"


def test_interface_address_never_makes_either_end_a_network_or_broadcast_address() -> None:
    import ipaddress

    from ipamd.cni.plugin import interface_address

    gateway = ipaddress.IPv4Address("10.0.1.203")
    for last in range(256):
        pod = ipaddress.IPv4Address(f"10.0.1.{last}")
        if pod == gateway:
            continue
        net = ipaddress.IPv4Interface(interface_address(f"{pod}/32", str(gateway))).network
        assert gateway in net
        if net.prefixlen < 31:
            assert {pod, gateway}.isdisjoint({net.network_address, net.broadcast_address}), net
