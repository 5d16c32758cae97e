"""The emulated VPC's IPv6, for a world whose VPC has an IPv6 /56 (`Layout(ipv6=True)`): what a Nitro
hypervisor and the VPC give the node, and how the fabric follows the IPv6 addresses and /80 prefixes
EC2 lists on each ENI.

- The VPC router forwards IPv6 and answers as `ROUTER_LINK_LOCAL` (fe80::1) on every ENI link, as
  the VPC's router does; the node's `eth0` keeps the link-local address its kernel gives it, accepts
  router advertisements while forwarding (`accept_ra` 2, as VPC CNI sets it) and has the default
  route via fe80::1 that the router's advertisement gives an instance (set here, not advertised).
- Each IPv6 CIDR EC2 lists on an ENI (an address as a /128, a delegated /80) is delivered to that
  ENI's link: a route via the ENI's link-local address (EUI-64 of its MAC) and a permanent neighbour
  entry for that link-local with the ENI's MAC. The fabric never resolves a pod's address: a /80 is
  delivered whole, as the VPC delivers a prefix.
- The VPC host gets an address in the last /64 of the VPC's /56 (no subnet of these worlds takes
  it), on the `vh0` link beside its IPv4 one.
- EC2's source/destination check for IPv6, in its own table `ip6 vpc` (an `ip` table sees no IPv6
  packet), chain `sdc`: from `enN`, every IPv6 packet whose source is neither link-local nor the
  unspecified address (duplicate address detection's) nor inside one of the ENI's IPv6 CIDRs is
  dropped and counted by the named counter `fabric.sdc_counter(eni_id)` of that table.

The internet host stays IPv4 only: no IPv6 route leaves the VPC.
"""

from __future__ import annotations

import ipaddress
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from bench.vpc.fabric import (
    NFT_TABLE,
    SDC_CHAIN,
    VPC_HOST_LINK,
    Eni,
    Fabric,
    FabricError,
    Namespaces,
    address_set,
    fabric_link,
    ip,
    ip_batch,
    nft,
    sdc_counter,
    sysctl,
)

NFT6_FAMILY: Final = "ip6"
ROUTER_LINK_LOCAL: Final = "fe80::1"
"""The VPC router's address on every ENI link: the node's default IPv6 route goes via it."""
HOST_INDEX: Final = 0x10
ROUTER_INDEX: Final = 1
EXEMPT_SOURCES: Final = "::, fe80::/10"
"""Sources the check lets through on every link: duplicate address detection's and link-local."""


@dataclass(frozen=True, slots=True)
class Ipv6Vpc:
    """The VPC's IPv6 block and the node subnet's /64, as EC2 lists them."""

    vpc_cidr: str
    subnet_cidr: str

    @property
    def host_network(self) -> ipaddress.IPv6Network:
        """The last /64 of the VPC's block: the VPC host's."""
        return list(ipaddress.IPv6Network(self.vpc_cidr).subnets(new_prefix=64))[-1]

    @property
    def vpc_host(self) -> str:
        return str(self.host_network[HOST_INDEX])

    @property
    def vpc_host_router(self) -> str:
        return str(self.host_network[ROUTER_INDEX])


def link_local(mac: str) -> str:
    """The link-local address the kernel derives from a MAC (modified EUI-64, RFC 4291 app. A)."""
    octets = [int(part, 16) for part in mac.split(":")]
    eui = [octets[0] ^ 0x02, *octets[1:3], 0xFF, 0xFE, *octets[3:6]]
    return str(ipaddress.IPv6Address(bytes([0xFE, 0x80, *[0] * 6, *eui])))


def build(ns: Namespaces, vpc: Ipv6Vpc, deadline_s: float = 10.0) -> None:
    """The static part: the router forwards IPv6, the VPC host's address and route, the `ip6 vpc`
    table, the node's default route via fe80::1. Returns once the node's link-local on `eth0` has
    passed duplicate address detection (it is the source of the node's neighbour solicitations)."""
    sysctl(ns.vpc, "net.ipv6.conf.all.forwarding", "1")
    ip(ns.vpc, "addr", "add", f"{vpc.vpc_host_router}/64", "dev", VPC_HOST_LINK, "nodad")
    ip(ns.vpchost, "addr", "add", f"{vpc.vpc_host}/64", "dev", "eth0", "nodad")
    ip(ns.vpchost, "-6", "route", "add", "default", "via", vpc.vpc_host_router)
    nft(
        ns.vpc,
        f"""\
table {NFT6_FAMILY} {NFT_TABLE} {{
  chain {SDC_CHAIN} {{
    type filter hook prerouting priority filter; policy accept;
  }}
}}
""",
    )
    sysctl(ns.node, "net.ipv6.conf.eth0.accept_ra", "2")
    ip(ns.node, "-6", "route", "add", "default", "via", ROUTER_LINK_LOCAL, "dev", "eth0")
    _wait_link_local(ns.node, "eth0", deadline_s)


def _wait_link_local(namespace: str, link: str, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while True:
        listed = json.loads(ip(namespace, "-j", "-6", "addr", "show", "dev", link) or "[]")
        infos = [a for item in listed for a in item.get("addr_info", [])]
        if any(a.get("scope") == "link" and not a.get("tentative") for a in infos):
            return
        if time.monotonic() > end:
            raise FabricError(f"no usable link-local address on {link} in {namespace}: {infos}")
        time.sleep(0.05)


def plug(ns: Namespaces, device_index: int) -> None:
    """The router's fe80::1 on a new ENI link (without duplicate address detection: it is the
    router's own)."""
    ip(ns.vpc, "addr", "add", f"{ROUTER_LINK_LOCAL}/64", "dev", fabric_link(device_index), "nodad")


def render_checks(enis: Iterable[Eni]) -> str:
    """The nft transaction that makes IPv6's source/destination check exactly `enis`; counters and
    sets are named objects that `add` leaves as they are, so counts survive."""
    table = f"{NFT6_FAMILY} {NFT_TABLE}"
    lines: list[str] = []
    rules: list[str] = []
    elements: list[str] = []
    for eni in sorted(enis, key=lambda e: e.device_index):
        members, counter = address_set(eni.eni_id), sdc_counter(eni.eni_id)
        lines.append(f"add set {table} {members} {{ type ipv6_addr; flags interval; }}")
        lines.append(f"add counter {table} {counter}")
        rules.append(
            f'add rule {table} {SDC_CHAIN} iifname "{fabric_link(eni.device_index)}" '
            f"ip6 saddr != {{ {EXEMPT_SOURCES} }} ip6 saddr != @{members} "
            f'counter name "{counter}" drop'
        )
        elements.append(f"flush set {table} {members}")
        if eni.ipv6:
            listed = ", ".join(sorted(eni.ipv6, key=ipaddress.IPv6Network))
            elements.append(f"add element {table} {members} {{ {listed} }}")
    lines.append(f"flush chain {table} {SDC_CHAIN}")
    return "\n".join([*lines, *rules, *elements]) + "\n"


Delivery = dict[str, tuple[str, str]]
"""IPv6 CIDR → (VPC link, the ENI's MAC) of the route installed for it."""


def deliver(ns: Namespaces, plugged: Iterable[Eni], routed: Delivery) -> Delivery:
    """A route per IPv6 CIDR via the ENI's link-local, and that link-local's permanent neighbour
    entry (the ENI's MAC); stale routes gone. Returns what is now installed."""
    wanted: Delivery = {}
    for eni in plugged:
        for cidr in eni.ipv6:
            wanted[cidr] = (fabric_link(eni.device_index), eni.mac)
    stale = [(c, link) for c, (link, _) in routed.items() if wanted.get(c) != routed[c]]
    ip_batch(ns.vpc, [f"route del {c} dev {link}" for c, link in stale], force=True)
    changed = sorted((c, r) for c, r in wanted.items() if routed.get(c) != r)
    neighbours = {(link, mac) for _, (link, mac) in changed}
    ip_batch(
        ns.vpc,
        [
            f"neigh replace {link_local(mac)} lladdr {mac} dev {link} nud permanent"
            for link, mac in sorted(neighbours)
        ]
        + [f"route replace {c} via {link_local(mac)} dev {link}" for c, (link, mac) in changed],
    )
    return wanted


@dataclass
class DualStackFabric(Fabric):
    """`fabric.Fabric` with the VPC's IPv6: built with the static topology, fe80::1 on every ENI link
    it plugs, IPv6's source/destination check and delivery following EC2 on every step."""

    vpc6: Ipv6Vpc = field(kw_only=True)
    checks6: str = ""
    """The `ip6 vpc` transaction last applied."""
    routed6: Delivery = field(default_factory=dict)

    def _build(self) -> None:
        super()._build()
        build(self.ns, self.vpc6)
        plug(self.ns, 0)

    def _plug(self, eni: Eni) -> None:
        super()._plug(eni)
        plug(self.ns, eni.device_index)

    def _apply_checks(self, enis: list[Eni]) -> None:
        super()._apply_checks(enis)
        script = render_checks(enis)
        if script != self.checks6:
            nft(self.ns.vpc, script)
            self.checks6 = script

    def _deliver(self) -> None:
        super()._deliver()
        self.routed6 = deliver(self.ns, self.plugged.values(), self.routed6)
