"""The shared request and response types: strict parsing, round trips, the identifier rules, and
the JSON codec on `_json` that reads and writes exactly as `json` does."""

from __future__ import annotations

import copy
import json
import math
import pickle
import subprocess
import sys
from pathlib import Path

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
    check_container_id,
    check_ifname,
    check_network,
    dumps,
    parse_answer,
    parse_object,
)

REPO = Path(__file__).resolve().parents[3]


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
    from ipamd.cni.ipam import interface_address

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

    from ipamd.cni.ipam import interface_address

    gateway = ipaddress.IPv4Address("10.0.1.203")
    for last in range(256):
        pod = ipaddress.IPv4Address(f"10.0.1.{last}")
        if pod == gateway:
            continue
        net = ipaddress.IPv4Interface(interface_address(f"{pod}/32", str(gateway))).network
        assert gateway in net
        if net.prefixlen < 31:
            assert {pod, gateway}.isdisjoint({net.network_address, net.broadcast_address}), net


@pytest.mark.parametrize("value", ["c", "0abc", "a.b_c-d", "A" * 256])
def test_identifiers_that_are_valid(value: str) -> None:
    assert check_container_id(value) == value
    if len(value) <= 128:
        assert check_network(value) == value


@pytest.mark.parametrize("value", ["", "-a", "_a", ".a", "a b", "a/b", "é", "a\n", "A" * 257, 7])
def test_identifiers_that_are_not(value: object) -> None:
    with pytest.raises(WireError):
        check_container_id(value)


# -- the JSON codec --------------------------------------------------------------------------------

DOCUMENTS = [
    b"{}",
    b' \t\r\n{"a": 1}\n ',
    b'{"n": [0, -1, 2.5, 1e3, -0.0, 12345678901234567890], "b": [true, false, null]}',
    b'{"s": "\\u00e9\\ud83d\\ude00 \\"quoted\\" \\\\ \\/ \\b\\f\\n\\r\\t"}',
    '{"\u00e9": "\U0001f600", "\u00e9\u00e9": ["\u2028"]}'.encode(),
    b'{"deep": {"a": [{"b": [[], {}]}]}}',
]


@pytest.mark.parametrize("raw", DOCUMENTS)
def test_parse_object_reads_what_json_reads(raw: bytes) -> None:
    assert parse_object(raw) == json.loads(raw)


NOT_JSON = [
    b"",
    b"   ",
    b"{",
    b'{"a" 1}',
    b'{"a": 1} x',
    b'{"a": 1}{}',
    b"\xef\xbb\xbf{}",
    b"{'a': 1}",
    b'{"a": "\x01"}',
    b'{"a": 01}',
    b'{"a": [1,]}',
    b'{"a": nul}',
    b'\n\n  {\n  "a": }',
]


@pytest.mark.parametrize("raw", NOT_JSON)
def test_a_body_that_is_not_json_is_worded_as_json_words_it(raw: bytes) -> None:
    with pytest.raises(json.JSONDecodeError) as expected:
        json.loads(raw.decode())
    err = expected.value
    with pytest.raises(WireError) as raised:
        parse_object(raw)
    assert (
        str(raised.value) == f"body is not JSON: {err.msg} at line {err.lineno} column {err.colno}"
    )


def test_a_process_that_never_imported_json_words_the_error_too() -> None:
    """`_json` raises its errors through `json.decoder`, which only `import json` loads."""
    code = (
        "import sys\n"
        "from ipamd.wire import WireError, parse_object\n"
        "assert 'json' not in sys.modules\n"
        "try:\n"
        "    parse_object(b'{\"a\" 1}')\n"
        "except WireError as err:\n"
        "    print(err)\n"
    )
    setup = f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", setup + code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "body is not JSON: Expecting ':' delimiter at line 1 column 6"


def test_an_integer_too_long_for_python_is_a_wire_error_not_a_crash() -> None:
    with pytest.raises(WireError, match="cannot be read"):
        parse_object(b'{"a": ' + b"1" * 5000 + b"}")


def test_parse_answer_reads_any_json_value_as_json_loads_does() -> None:
    assert parse_answer(b'[1, {"a": 2}]') == [1, {"a": 2}]
    assert parse_answer(b'{"a": 1, "a": 2}') == {"a": 2}, "answers are not checked for duplicates"
    assert math.isnan(parse_answer(b"NaN"))  # type: ignore[arg-type]
    assert parse_answer(b'{"x": -Infinity}') == {"x": -math.inf}
    with pytest.raises(WireError):
        parse_answer(b"<html>")
    with pytest.raises(WireError):
        parse_answer(b"\xff")


VALUES: list[object] = [
    {"a": [1, 2.5, -0.0, 1e300, 10**30, True, False, None], "é": '😀\u0001"\\/'},
    [],
    "text",
    3,
    {"nested": {"deeper": [{"x": []}]}, "": ""},
    [math.nan, math.inf, -math.inf],
    {1: "int key", False: "bool key", None: "null key", 2.5: "float key"},
    ("a", "tuple"),
]


@pytest.mark.parametrize("value", VALUES)
def test_dumps_writes_what_json_dumps_writes(value: object) -> None:
    assert dumps(value) == json.dumps(value, separators=(",", ":"))


def test_dumps_refuses_what_json_refuses_and_recovers() -> None:
    with pytest.raises(TypeError, match="Object of type set is not JSON serializable"):
        dumps({"a": {1}})
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference"):
        dumps({"a": loop})
    shared = [1]
    assert dumps({"a": shared, "b": shared}) == '{"a":[1],"b":[1]}', "no stale circular markers"


# -- the value types -------------------------------------------------------------------------------


def test_value_types_compare_hash_and_print_by_their_fields() -> None:
    pod = PodInfo("ns", "p", "u")
    assert pod == PodInfo(namespace="ns", name="p", uid="u") and pod != PodInfo("ns", "p")
    assert hash(pod) == hash(PodInfo("ns", "p", "u"))
    assert len({pod, PodInfo("ns", "p", "u"), PodInfo()}) == 2
    assert repr(pod) == "PodInfo(namespace='ns', name='p', uid='u')"
    assert repr(Route("0.0.0.0/0")) == "Route(dst='0.0.0.0/0', gw=None)"
    assert Attachment("c1", "eth0") != ("c1", "eth0"), "not a tuple"
    assert IpConfig("a", "b", "c") != Route("a", "b"), "not across types"


def test_value_types_are_frozen() -> None:
    error = ErrorBody("internal", "x")
    with pytest.raises(AttributeError):
        error.code = "other"
    with pytest.raises(AttributeError):
        del error.code
    with pytest.raises(AttributeError):
        error.extra = 1  # type: ignore[attr-defined]
    assert error == ErrorBody("internal", "x", retryable=False)


def test_value_types_copy_and_pickle() -> None:
    alloc = Allocation(
        "net",
        "c1",
        "eth0",
        (IpConfig("10.0.0.10/32", "10.0.0.1", "eni-1"),),
        (Route("0.0.0.0/0", "10.0.0.1"),),
        1.5,
        PodInfo("ns", "p", "u"),
    )
    assert copy.copy(alloc) == alloc and copy.deepcopy(alloc) == alloc
    assert pickle.loads(pickle.dumps(alloc)) == alloc
    gc = GcRequest("net", (Attachment("c1", "eth0"),))
    assert pickle.loads(pickle.dumps(gc)) == gc
