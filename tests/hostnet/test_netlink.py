"""The netlink adapter against a real kernel, as root, each test in a network namespace of its own.

The adapter is opened with `netns=` so its socket lives in the test's namespace, and every `ip`
command here runs with `-n <namespace>`: nothing touches the machine's own network namespace. The
`hostnet` fixture checks the adapter sees the namespace's three links and nothing else before any
test changes a thing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from ipamd.hostnet.netlink import NetlinkHostNetwork
from ipamd.hostnet.ports import (
    CONNMARK,
    MAIN_TABLE,
    PRIORITY_CONNMARK,
    PRIORITY_FROM_ENI,
    PRIORITY_FROM_POD,
    PRIORITY_TO_POD,
    RT_PROTO_IPAMD,
    EniLink,
    HostNetError,
    KernelUnreadable,
    LinkNotFound,
    Route,
    Rule,
)

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create network namespaces"),
    pytest.mark.skipif(shutil.which("ip") is None, reason="needs iproute2's ip"),
]

ENI_IF = "veth0"
ENI_MAC = "02:00:00:00:00:01"
PEER_IF = "veth1"
PEER_MAC = "02:00:00:00:00:02"
NETNS_DIR = Path("/run/netns")

TO_POD = Rule(PRIORITY_TO_POD, MAIN_TABLE, dst="10.0.1.5/32")
FROM_POD = Rule(PRIORITY_FROM_POD, 2, src="10.0.1.23/32")
FROM_ENI = Rule(PRIORITY_FROM_ENI, 2, src="10.0.1.10/32")
MARKED = Rule(PRIORITY_CONNMARK, MAIN_TABLE, fwmark=CONNMARK, fwmask=CONNMARK)
FOUR_SHAPES = frozenset({TO_POD, FROM_POD, FROM_ENI, MARKED})

ENI = EniLink(
    eni_id="eni-0123456789abcdef0",
    mac=ENI_MAC.upper(),  # EC2 gives lower case; the match must not care
    address="10.0.1.10",
    prefixlen=24,
    subnet_cidr="10.0.1.0/24",
    mtu=9001,
)


def delete_netns(name: str) -> None:
    subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)


def ip(netns: str, command: str) -> str:
    """`ip -n <netns> <command>`: the only way these tests change or read the network."""
    assert netns, "refusing to run ip outside a test namespace"
    done = subprocess.run(
        ["ip", "-n", netns, *command.split()],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    )
    return done.stdout


def ip_json(netns: str, command: str) -> Any:
    return json.loads(ip(netns, f"-j {command}") or "[]")


def table_routes(netns: str, family: str, table: int | str) -> list[tuple[str, str, str]]:
    """(dst, dev, protocol) of every route in one table (iproute2 leaves out protocol boot)."""
    return [
        (r["dst"], r["dev"], str(r.get("protocol", "boot")))
        for r in ip_json(netns, f"{family} route show table {table}")
    ]


def main_routes(netns: str) -> list[tuple[str, str, str]]:
    return table_routes(netns, "-4", "main")


def addresses(netns: str, ifname: str) -> list[str]:
    (link,) = ip_json(netns, f"-4 addr show dev {ifname}")
    return [f"{a['local']}/{a['prefixlen']}" for a in link["addr_info"]]


def snapshot(netns: str) -> tuple[object, ...]:
    """What `prepare_link` may change, without what the kernel changes on its own a moment after a
    link comes up (operstate, carrier, routes' linkdown flag, IPv6 link-local addresses)."""
    route_keys = ("table", "type", "dst", "gateway", "dev", "protocol", "scope", "metric")
    return (
        [
            (x["ifname"], x["mtu"], x["address"], "UP" in x["flags"])
            for x in ip_json(netns, "link show")
        ],
        [(x["ifname"], x["addr_info"]) for x in ip_json(netns, "-4 addr show")],
        [
            tuple(x.get(key) for key in route_keys)
            for x in ip_json(netns, "-4 route show table all")
        ],
        ip(netns, "-4 rule show"),
    )


@pytest.fixture
def netns() -> Iterator[str]:
    """A fresh namespace with lo and a veth pair (both ends inside it), deleted whatever happens."""
    name = f"ipamd-test-{uuid.uuid4().hex[:10]}"
    try:
        created = subprocess.run(
            ["ip", "netns", "add", name], capture_output=True, text=True, check=False
        )
        if created.returncode != 0:
            pytest.skip(f"cannot create a network namespace: {created.stderr.strip()}")
        ip(name, "link set lo up")
        ip(name, f"link add {ENI_IF} address {ENI_MAC} type veth peer {PEER_IF} address {PEER_MAC}")
        ip(name, f"link set {ENI_IF} up")
        ip(name, f"link set {PEER_IF} up")
        yield name
    finally:
        delete_netns(name)


@pytest.fixture
async def hostnet(netns: str) -> AsyncIterator[NetlinkHostNetwork]:
    adapter = NetlinkHostNetwork(netns=netns)
    await adapter.open()
    try:
        # The guard that keeps every test out of the machine's own namespace.
        seen = await adapter.link_names()
        assert sorted(seen.values()) == ["lo", ENI_IF, PEER_IF], seen
        yield adapter
    finally:
        await adapter.close()


# -- rules ----------------------------------------------------------------------------------------


async def test_the_four_rule_shapes_list_back_equal_and_delete(
    hostnet: NetlinkHostNetwork, netns: str
) -> None:
    await hostnet.add_rules(FOUR_SHAPES)

    assert await hostnet.list_rules() == FOUR_SHAPES
    shown = ip(netns, "rule show")
    assert f"{PRIORITY_TO_POD}:\tfrom all to 10.0.1.5 lookup main proto {RT_PROTO_IPAMD}" in shown
    assert f"{PRIORITY_FROM_POD}:\tfrom 10.0.1.23 lookup 2 proto {RT_PROTO_IPAMD}" in shown
    assert f"{PRIORITY_FROM_ENI}:\tfrom 10.0.1.10 lookup 2 proto {RT_PROTO_IPAMD}" in shown
    assert (
        f"{PRIORITY_CONNMARK}:\tfrom all fwmark 0x80/0x80 lookup main proto {RT_PROTO_IPAMD}"
        in shown
    )

    await hostnet.delete_rules(FOUR_SHAPES)

    assert await hostnet.list_rules() == frozenset()
    assert f"proto {RT_PROTO_IPAMD}" not in ip(netns, "rule show")


async def test_to_pod_rule_lists_back_as_an_equal_object(hostnet: NetlinkHostNetwork) -> None:
    await hostnet.add_rules([Rule(priority=512, table=254, dst="10.0.1.5/32")])

    (listed,) = await hostnet.list_rules()

    assert listed == Rule(priority=512, table=254, src="", dst="10.0.1.5/32", fwmark=0, fwmask=0)


async def test_rules_in_a_table_above_255_and_wider_prefixes(hostnet: NetlinkHostNetwork) -> None:
    rules = {
        Rule(PRIORITY_FROM_POD, 300, src="10.0.64.0/18"),
        Rule(PRIORITY_TO_POD, MAIN_TABLE, dst="10.0.2.0/28"),
    }
    await hostnet.add_rules(rules)

    assert await hostnet.list_rules() == rules


async def test_rule_add_and_delete_are_idempotent(hostnet: NetlinkHostNetwork) -> None:
    await hostnet.add_rules(FOUR_SHAPES)
    await hostnet.add_rules(FOUR_SHAPES)
    assert await hostnet.list_rules() == FOUR_SHAPES

    await hostnet.delete_rules(FOUR_SHAPES)
    await hostnet.delete_rules(FOUR_SHAPES)
    assert await hostnet.list_rules() == frozenset()


async def test_nothing_to_do_is_no_request(hostnet: NetlinkHostNetwork) -> None:
    await hostnet.add_rules([])
    await hostnet.delete_rules([])
    await hostnet.add_routes([])
    await hostnet.delete_routes([])

    assert await hostnet.list_rules() == frozenset()
    assert await hostnet.list_routes() == frozenset()


async def test_five_hundred_rules_go_in_and_come_out(
    hostnet: NetlinkHostNetwork, netns: str
) -> None:
    pods = [f"10.1.{i // 250}.{i % 250 + 1}/32" for i in range(250)]
    rules = frozenset(
        [Rule(PRIORITY_TO_POD, MAIN_TABLE, dst=pod) for pod in pods]
        + [Rule(PRIORITY_FROM_POD, 2 + i % 3, src=pod) for i, pod in enumerate(pods)]
    )
    assert len(rules) == 500

    await hostnet.add_rules(rules)

    assert await hostnet.list_rules() == rules
    assert ip(netns, "rule show").count(f"proto {RT_PROTO_IPAMD}") == 500

    await hostnet.delete_rules(rules)

    assert await hostnet.list_rules() == frozenset()
    assert f"proto {RT_PROTO_IPAMD}" not in ip(netns, "rule show")


# -- routes ---------------------------------------------------------------------------------------


def eni_table(table: int, gateway: str = "10.0.1.1") -> list[Route]:
    """What ipamd puts in a secondary ENI's table, the default route first (on purpose: the adapter
    must still add the gateway's own route before it)."""
    return [
        Route(table, "0.0.0.0/0", ENI_IF, gateway),
        Route(table, f"{gateway}/32", ENI_IF),
    ]


@pytest.mark.parametrize("table", [2, 300])
async def test_routes_list_back_equal_and_delete(
    hostnet: NetlinkHostNetwork, netns: str, table: int
) -> None:
    routes = eni_table(table)

    await hostnet.add_routes(routes)

    assert await hostnet.list_routes() == frozenset(routes)
    shown = ip(netns, f"route show table {table}")
    assert f"default via 10.0.1.1 dev {ENI_IF} proto {RT_PROTO_IPAMD}" in shown
    assert f"10.0.1.1 dev {ENI_IF} proto {RT_PROTO_IPAMD} scope link" in shown

    await hostnet.add_routes(routes)  # replace: no error, no second copy
    assert await hostnet.list_routes() == frozenset(routes)
    assert len(ip(netns, f"route show table {table}").splitlines()) == 2

    await hostnet.delete_routes(routes)

    assert await hostnet.list_routes() == frozenset()
    assert ip(netns, f"route show table {table}") == ""
    await hostnet.delete_routes(routes)  # already gone: not an error


async def test_add_route_replaces_the_gateway(hostnet: NetlinkHostNetwork) -> None:
    await hostnet.add_routes(eni_table(2, "10.0.1.1"))
    await hostnet.add_routes([Route(2, "10.0.1.2/32", ENI_IF)])

    await hostnet.add_routes([Route(2, "0.0.0.0/0", ENI_IF, "10.0.1.2")])

    assert await hostnet.list_routes() == {
        Route(2, "0.0.0.0/0", ENI_IF, "10.0.1.2"),
        Route(2, "10.0.1.1/32", ENI_IF),
        Route(2, "10.0.1.2/32", ENI_IF),
    }


async def test_add_routes_to_an_unknown_link_adds_nothing(hostnet: NetlinkHostNetwork) -> None:
    with pytest.raises(LinkNotFound, match="nosuch0"):
        await hostnet.add_routes([*eni_table(2), Route(2, "10.0.3.0/24", "nosuch0")])

    assert await hostnet.list_routes() == frozenset()


async def test_deleting_routes_of_a_link_that_is_gone(
    hostnet: NetlinkHostNetwork, netns: str
) -> None:
    ip(netns, "link add gone0 type veth peer gone1")
    ip(netns, "link set gone0 up")
    await hostnet.add_routes([Route(2, "10.0.4.0/24", "gone0")])
    assert await hostnet.list_routes() == {Route(2, "10.0.4.0/24", "gone0")}

    ip(netns, "link delete gone0")  # and its peer, and its routes

    assert await hostnet.list_routes() == frozenset()
    await hostnet.delete_routes([Route(2, "10.0.4.0/24", "gone0")])
    await hostnet.delete_routes([Route(2, "10.0.4.0/24", "nosuch0")])


async def test_a_refused_route_is_a_hostnet_error(hostnet: NetlinkHostNetwork) -> None:
    # No route to the gateway anywhere: the kernel refuses (ENETUNREACH).
    with pytest.raises(HostNetError, match="errno") as raised:
        await hostnet.add_routes([Route(2, "0.0.0.0/0", ENI_IF, "192.0.2.1")])

    assert type(raised.value) is HostNetError


async def test_bad_input_is_a_hostnet_error(hostnet: NetlinkHostNetwork) -> None:
    with pytest.raises(HostNetError, match="CIDR"):
        await hostnet.add_rules([Rule(PRIORITY_FROM_POD, 2, src="10.0.1.5/24")])
    with pytest.raises(HostNetError, match="address"):
        await hostnet.add_routes([Route(2, "0.0.0.0/0", ENI_IF, "not-an-address")])

    assert await hostnet.list_rules() == frozenset()
    assert await hostnet.list_routes() == frozenset()


# -- what is not ipamd's --------------------------------------------------------------------------


async def test_foreign_rules_and_routes_are_never_listed_and_survive(
    hostnet: NetlinkHostNetwork, netns: str
) -> None:
    ip(netns, "rule add to 10.0.1.5/32 lookup main pref 512 proto static")
    ip(netns, "rule add from 10.0.1.23/32 lookup 2 pref 1536 proto boot")
    ip(netns, "rule add fwmark 0x80/0x80 lookup main pref 1024")
    ip(netns, f"route add 10.9.0.0/16 dev {ENI_IF} table 2 proto boot")
    ip(netns, f"route add 10.8.0.0/16 dev {ENI_IF} table 300 proto static")
    ip(netns, f"-6 rule add from 2001:db8::5 lookup 2 proto {RT_PROTO_IPAMD}")
    ip(netns, f"-6 route add 2001:db8::/64 dev {ENI_IF} table 2 proto {RT_PROTO_IPAMD}")
    foreign_rules = ip(netns, "rule show")

    assert await hostnet.list_rules() == frozenset()
    assert await hostnet.list_routes() == frozenset()

    # Ours, shaped exactly like theirs, go in beside theirs and come out without theirs.
    await hostnet.add_rules([TO_POD, FROM_POD, MARKED])
    assert await hostnet.list_rules() == {TO_POD, FROM_POD, MARKED}
    await hostnet.delete_rules([TO_POD, FROM_POD, MARKED])
    await hostnet.delete_routes(
        [Route(2, "10.9.0.0/16", ENI_IF), Route(300, "10.8.0.0/16", ENI_IF)]
    )

    assert ip(netns, "rule show") == foreign_rules
    assert table_routes(netns, "-4", 2) == [("10.9.0.0/16", ENI_IF, "boot")]
    assert table_routes(netns, "-4", 300) == [("10.8.0.0/16", ENI_IF, "static")]
    assert table_routes(netns, "-6", 2) == [("2001:db8::/64", ENI_IF, str(RT_PROTO_IPAMD))]


# -- links ----------------------------------------------------------------------------------------


async def test_link_names_maps_every_mac_to_its_link(hostnet: NetlinkHostNetwork) -> None:
    assert await hostnet.link_names() == {
        "00:00:00:00:00:00": "lo",
        ENI_MAC: ENI_IF,
        PEER_MAC: PEER_IF,
    }


async def test_prepare_link_for_an_unknown_mac(hostnet: NetlinkHostNetwork) -> None:
    with pytest.raises(LinkNotFound, match="02:00:00:00:00:99"):
        await hostnet.prepare_link(
            EniLink("eni-1", "02:00:00:00:00:99", "10.0.1.10", 24, "10.0.1.0/24", 9001)
        )


async def test_prepare_link_from_a_down_link_with_stale_addresses(
    hostnet: NetlinkHostNetwork, netns: str
) -> None:
    ip(netns, f"link set {ENI_IF} down")
    ip(netns, f"addr add 10.0.1.99/24 dev {ENI_IF}")
    ip(netns, f"addr add 10.0.1.10/16 dev {ENI_IF}")
    ip(netns, f"addr add 172.16.0.7/12 dev {ENI_IF}")
    ip(netns, f"addr add 10.0.1.200/24 dev {PEER_IF}")

    assert await hostnet.prepare_link(ENI) == ENI_IF

    (link,) = ip_json(netns, f"link show dev {ENI_IF}")
    assert link["mtu"] == 9001
    assert "UP" in link["flags"]
    assert addresses(netns, ENI_IF) == ["10.0.1.10/24"]
    assert addresses(netns, PEER_IF) == ["10.0.1.200/24"]
    assert [route for route in main_routes(netns) if route[1] == ENI_IF] == []
    assert ("10.0.1.0/24", PEER_IF, "kernel") in main_routes(netns)

    before = snapshot(netns)
    assert await hostnet.prepare_link(ENI) == ENI_IF
    assert snapshot(netns) == before


async def test_prepare_link_removes_only_the_kernels_connected_route_on_that_link(
    hostnet: NetlinkHostNetwork, netns: str
) -> None:
    ip(netns, f"addr add 10.0.1.10/24 dev {ENI_IF}")
    ip(netns, f"addr add 10.0.1.200/24 dev {PEER_IF}")
    ip(netns, f"route add 10.0.1.0/24 dev {ENI_IF} metric 50 proto static")
    assert ("10.0.1.0/24", ENI_IF, "kernel") in main_routes(netns)

    assert await hostnet.prepare_link(ENI) == ENI_IF

    assert sorted(main_routes(netns)) == [
        ("10.0.1.0/24", ENI_IF, "static"),
        ("10.0.1.0/24", PEER_IF, "kernel"),
    ]
    assert addresses(netns, ENI_IF) == ["10.0.1.10/24"]

    before = snapshot(netns)
    await hostnet.prepare_link(ENI)
    assert snapshot(netns) == before


async def test_prepare_link_when_its_address_is_a_secondary_of_a_stale_one(
    hostnet: NetlinkHostNetwork, netns: str
) -> None:
    # Deleting the stale primary takes the secondary with it (or promotes it, and the kernel adds
    # the subnet's route for it): either way the end state is the same.
    ip(netns, f"addr add 10.0.1.99/24 dev {ENI_IF}")
    ip(netns, f"addr add 10.0.1.10/24 dev {ENI_IF}")

    await hostnet.prepare_link(ENI)

    assert addresses(netns, ENI_IF) == ["10.0.1.10/24"]
    assert [route for route in main_routes(netns) if route[1] == ENI_IF] == []


# -- the socket -----------------------------------------------------------------------------------


async def test_a_closed_adapter_refuses_and_reopens(hostnet: NetlinkHostNetwork) -> None:
    await hostnet.close()

    with pytest.raises(HostNetError, match="not open"):
        await hostnet.add_rules([TO_POD])
    with pytest.raises(KernelUnreadable, match="not open"):
        await hostnet.list_rules()

    await hostnet.open()
    await hostnet.add_rules([TO_POD])
    assert await hostnet.list_rules() == {TO_POD}


@pytest.fixture
def absent_netns() -> Iterator[str]:
    """A namespace name nobody has; deleted afterwards should the adapter have created it."""
    name = f"ipamd-absent-{uuid.uuid4().hex[:10]}"
    yield name
    if (NETNS_DIR / name).exists():
        delete_netns(name)


async def test_a_missing_namespace_is_an_error_and_is_not_created(absent_netns: str) -> None:
    adapter = NetlinkHostNetwork(netns=absent_netns)

    with pytest.raises(HostNetError, match=absent_netns):
        await adapter.open()

    await adapter.close()
    assert not (NETNS_DIR / absent_netns).exists()
