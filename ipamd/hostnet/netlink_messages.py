"""Translations between ipamd's host-network models (`Rule`, `Route`) and rtnetlink's requests and
messages, for the netlink adapter: which attributes a rule or route is written with and read back
from, and the kernel's quirks in them (tables above 255, a mark without its mask, link-scope routes).

Pure: no socket, no pyroute2 import (messages arrive as pyroute2's objects, read through `msg[...]`
and `get_attr`, and are typed `Any`). A bad CIDR or address is a `HostNetError`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from socket import AF_INET
from typing import Any, Final

from ipamd.hostnet.ports import (
    MAIN_TABLE,
    RESERVED_TABLES,
    RT_PROTO_IPAMD,
    TAKEOVER_PRIORITIES,
    HostNetError,
    Route,
    Rule,
)

RT_SCOPE_UNIVERSE: Final = 0
RT_SCOPE_LINK: Final = 253
RTPROT_KERNEL: Final = 2
IFF_UP: Final = 0x1
FR_ACT_TO_TBL: Final = 1
RTN_UNICAST: Final = 1

_OTHER_SELECTORS: Final = (
    "FRA_IIFNAME",
    "FRA_OIFNAME",
    "FRA_UID_RANGE",
    "FRA_IP_PROTO",
    "FRA_SPORT_RANGE",
    "FRA_DPORT_RANGE",
    "FRA_L3MDEV",
    "FRA_TUN_ID",
    "FRA_GOTO",
)
"""Rule attributes a `Rule` cannot describe: a foreign rule carrying one is never listed, so it can
never be taken for VPC CNI's."""


@dataclass(frozen=True, slots=True)
class Link:
    index: int
    name: str
    mac: str
    mtu: int
    up: bool


def ipv4_network(cidr: str) -> ipaddress.IPv4Network:
    try:
        return ipaddress.IPv4Network(cidr)
    except ValueError as exc:
        raise HostNetError(f"not an IPv4 CIDR: {cidr!r}") from exc


def ipv4_address(text: str) -> ipaddress.IPv4Address:
    try:
        return ipaddress.IPv4Address(text)
    except ValueError as exc:
        raise HostNetError(f"not an IPv4 address: {text!r}") from exc


def rule_request(rule: Rule, *, foreign: bool = False) -> dict[str, object]:
    """The request for ipamd's rule; with `foreign`, without a protocol, which the kernel then
    matches whatever it is (VPC CNI's rules carry none)."""
    request: dict[str, object] = {
        "family": AF_INET,
        "priority": rule.priority,
        "table": rule.table,
    }
    if not foreign:
        request["protocol"] = RT_PROTO_IPAMD
    for key, cidr in (("src", rule.src), ("dst", rule.dst)):
        if cidr:
            network = ipv4_network(cidr)
            request[key] = str(network.network_address)
            request[f"{key}_len"] = network.prefixlen
    if rule.fwmark or rule.fwmask:
        # Both, always: given a mark alone the kernel makes the mask 0xffffffff, and the rule would
        # not list back as the one asked for.
        request["fwmark"] = rule.fwmark
        request["fwmask"] = rule.fwmask
    return request


def rule_of(msg: Any, *, foreign: bool = False) -> Rule | None:
    """ipamd's rule in `msg`, or None; with `foreign`, a rule of another protocol at one of
    `TAKEOVER_PRIORITIES` that a `Rule` describes whole, or None. `msg` is from an IPv4 dump:
    the kernel answers a dump asked with AF_INET with that family's rules only."""
    if (msg.get_attr("FRA_PROTOCOL") == RT_PROTO_IPAMD) is foreign:
        return None
    if foreign and not _plain_lookup(msg):
        return None
    return Rule(
        priority=int(msg.get_attr("FRA_PRIORITY") or 0),
        table=_table(msg, "FRA_TABLE"),
        src=_selector(msg.get_attr("FRA_SRC"), int(msg["src_len"])),
        dst=_selector(msg.get_attr("FRA_DST"), int(msg["dst_len"])),
        fwmark=int(msg.get_attr("FRA_FWMARK") or 0),
        fwmask=int(msg.get_attr("FRA_FWMASK") or 0),
    )


def _plain_lookup(msg: Any) -> bool:
    return bool(
        int(msg.get_attr("FRA_PRIORITY") or 0) in TAKEOVER_PRIORITIES
        and msg["action"] == FR_ACT_TO_TBL
        and not msg["tos"]
        and not any(msg.get_attr(name) for name in _OTHER_SELECTORS)
    )


def route_request(route: Route, oif: int, *, foreign: bool = False) -> dict[str, object]:
    """The request for ipamd's route; with `foreign`, without a protocol (the kernel then matches
    any)."""
    network = ipv4_network(route.dst)
    request: dict[str, object] = {
        "family": AF_INET,
        "table": route.table,
        "dst": str(network.network_address),
        "dst_len": network.prefixlen,
        "oif": oif,
        # Given on delete too: pyroute2 sends scope universe when none is given, and the kernel
        # then finds no link-scope route to delete.
        "scope": RT_SCOPE_UNIVERSE if route.gateway else RT_SCOPE_LINK,
    }
    if not foreign:
        request["proto"] = RT_PROTO_IPAMD
    if route.gateway:
        request["gateway"] = str(ipv4_address(route.gateway))
    return request


def route_of(msg: Any, names: Mapping[int, str], *, foreign: bool = False) -> Route | None:
    """ipamd's route in `msg`, or None; with `foreign`, a unicast route of another protocol in a
    table outside `RESERVED_TABLES`, or None. `msg` is from an IPv4 dump, as `rule_of`'s."""
    if (msg["proto"] == RT_PROTO_IPAMD) is foreign:
        return None
    if foreign and (msg["type"] != RTN_UNICAST or _table(msg, "RTA_TABLE") in RESERVED_TABLES):
        return None
    # No RTA_OIF: a multipath route, which ipamd never adds; an unknown one: its link is gone.
    ifname = names.get(msg.get_attr("RTA_OIF"))
    if ifname is None:
        return None
    dst_len = int(msg["dst_len"])
    return Route(
        table=_table(msg, "RTA_TABLE"),
        dst=f"{msg.get_attr('RTA_DST') or '0.0.0.0'}/{dst_len}",
        ifname=ifname,
        gateway=str(msg.get_attr("RTA_GATEWAY") or ""),
    )


def is_connected_route(msg: Any, index: int, subnet: ipaddress.IPv4Network) -> bool:
    """Whether `msg`, from an IPv4 route dump, is the kernel's route to `subnet` on `index`."""
    return bool(
        msg["proto"] == RTPROT_KERNEL
        and _table(msg, "RTA_TABLE") == MAIN_TABLE
        and msg.get_attr("RTA_OIF") == index
        and msg.get_attr("RTA_DST") == str(subnet.network_address)
        and msg["dst_len"] == subnet.prefixlen
    )


def link_of(msg: Any) -> Link:
    return Link(
        index=int(msg["index"]),
        name=str(msg.get_attr("IFLA_IFNAME")),
        mac=str(msg.get_attr("IFLA_ADDRESS") or "").lower(),
        mtu=int(msg.get_attr("IFLA_MTU") or 0),
        up=bool(msg["flags"] & IFF_UP),
    )


def _table(msg: Any, attr: str) -> int:
    # The header's table field holds 252 (RT_TABLE_COMPAT) for tables above 255; the attribute
    # holds the real one.
    table = msg.get_attr(attr)
    return int(table if table is not None else msg["table"])


def _selector(address: object, length: int) -> str:
    return f"{address}/{length}" if address is not None and length else ""


def describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer from the kernel in time"
    return f"{type(exc).__name__}: {exc}"
