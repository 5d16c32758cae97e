"""The emulated VPC's network, in network namespaces: names, addresses, the static topology, and the
commands that make the hypervisor and the VPC fabric follow EC2.

Namespaces (`Namespaces`, created and deleted by the test, never by this module):
- `node`: the instance. `eth0` is the primary ENI (its MAC, its primary address /24, default via the
  subnet's gateway, `rp_filter` 2 as ipamd's init container sets it); `ethN` appear for the ENIs
  attached at device index N, down and without an address, for ipamd to configure.
- `vpc`: the VPC's router and fabric. The gateway address on `lo` (so it answers ARP on every ENI
  link); `enN`, the far end of the node's `ethN`; `vh0` to `vpchost`; `igw0` to `inet`. Each address
  EC2 lists on an ENI is delivered to that ENI's link (a /32 route and a permanent neighbour entry
  with the ENI's MAC), as the VPC fabric delivers it.
- `vpchost`: a host in the VPC (outside the node's subnet); `inet`: a host on the internet.

nftables table `ip vpc` in `vpc`, the test's evidence:
- chain `sdc` (prerouting): EC2's source/destination check. Per ENI, every IPv4 packet arriving from
  its link whose source is not one of the ENI's addresses is dropped and counted by the named counter
  `sdc_counter(eni_id)`.
- chain `igw` (forward): the internet gateway maps only the node's primary address (as an EC2 public
  IP does); anything else leaving by `igw0` is dropped and counted by `IGW_COUNTER`.

A world with IPv6 gets `fabric_ipv6.DualStackFabric`, this fabric plus the VPC's IPv6 (the router's
fe80::1 on every ENI link, the delivery of each ENI's IPv6 CIDRs, the VPC host's IPv6 address) and
IPv6's source/destination check in table `ip6 vpc`.

Nothing here may touch the namespace of the process that runs it: every command names its namespace
(`ip -n`, `nsenter --net=`).
"""

from __future__ import annotations

import ipaddress
import itertools
import json
import logging
import os
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

INSTANCE_TYPE: Final = "m5.large"
REGION: Final = "us-west-2"
SUBNET_CIDR: Final = "10.0.1.0/24"
GATEWAY: Final = "10.0.1.1"
"""The subnet's router: its base address + 1, as EC2 reserves it."""
VPC_HOST: Final = "10.0.2.10"
VPC_HOST_ROUTER: Final = "10.0.2.1"
INET_HOST: Final = "198.51.100.10"
IGW_ADDRESS: Final = "198.51.100.1"
HOST_PREFIXLEN: Final = 24
"""Of the links to `vpchost` and `inet`."""
VPC_HOST_LINK: Final = "vh0"
IGW_LINK: Final = "igw0"
ENI_MTU: Final = 9001
"""The fabric's side of every ENI link: the VPC carries jumbo frames."""

NFT_TABLE: Final = "vpc"
IGW_COUNTER: Final = "igw_drop"
SDC_CHAIN: Final = "sdc"

_names = itertools.count()
logger = logging.getLogger(__name__)


def netns_path(name: str) -> str:
    return f"/run/netns/{name}"


@dataclass(frozen=True, slots=True)
class Namespaces:
    node: str
    vpc: str
    vpchost: str
    inet: str

    @classmethod
    def unique(cls) -> Namespaces:
        """Names no other run uses: this process's PID and a counter."""
        tag = f"ipamd-vpc-{os.getpid()}-{next(_names)}"
        return cls(f"{tag}-node", f"{tag}-vpc", f"{tag}-vpchost", f"{tag}-inet")

    def all(self) -> tuple[str, ...]:
        return (self.node, self.vpc, self.vpchost, self.inet)

    def to_json(self) -> dict[str, str]:
        return {"node": self.node, "vpc": self.vpc, "vpchost": self.vpchost, "inet": self.inet}

    @classmethod
    def from_json(cls, data: Mapping[str, str]) -> Namespaces:
        return cls(data["node"], data["vpc"], data["vpchost"], data["inet"])


def node_link(device_index: int) -> str:
    """The node's name for the ENI at `device_index`, as the kernel names the NICs of an instance."""
    return f"eth{device_index}"


def fabric_link(device_index: int) -> str:
    """The VPC's end of that ENI's link, in `vpc`."""
    return f"en{device_index}"


def _object_name(eni_id: str) -> str:
    return eni_id.replace("-", "_")  # nft names take letters, digits and `_`, not `-`


def sdc_counter(eni_id: str) -> str:
    """The named counter of the source/destination-check drops on one ENI."""
    return f"sdc_{_object_name(eni_id)}"


def address_set(eni_id: str) -> str:
    return f"addrs_{_object_name(eni_id)}"


class FabricError(RuntimeError):
    """A command failed: names it and quotes its stderr."""


def run(argv: list[str], stdin: str | None = None) -> str:
    done = subprocess.run(
        argv, input=stdin, capture_output=True, text=True, timeout=30, check=False
    )
    if done.returncode != 0:
        raise FabricError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def in_netns(namespace: str, *argv: str) -> list[str]:
    """`argv` run in a named network namespace (only the network namespace: mounts stay visible)."""
    return ["nsenter", f"--net={netns_path(namespace)}", *argv]


def ip(namespace: str, *args: str) -> str:
    return run(["ip", "-n", namespace, *args])


def ip_batch(namespace: str, lines: Iterable[str], *, force: bool = False) -> None:
    """Several `ip` commands in one process; `force` carries on past failed lines (and so fails
    nothing: the one failure it serves to tolerate is "already gone")."""
    script = "".join(f"{line}\n" for line in lines)
    if not script:
        return
    argv = ["ip", "-n", namespace, *(["-force"] if force else []), "-batch", "-"]
    if force:
        subprocess.run(argv, input=script, capture_output=True, text=True, timeout=30, check=False)
    else:
        run(argv, script)


def nft(namespace: str, script: str) -> None:
    """One nftables transaction: all of `script` applies, or none of it."""
    run(in_netns(namespace, "nft", "-f", "-"), script)


def sysctl(namespace: str, key: str, value: str) -> None:
    run(in_netns(namespace, "sysctl", "-qw", f"{key}={value}"))


def read_counters(namespace: str, family: str = "ip") -> dict[str, int]:
    """Packets counted by each named counter of table `<family> vpc`."""
    out = run(in_netns(namespace, "nft", "-j", "list", "counters", "table", family, NFT_TABLE))
    counters: dict[str, int] = {}
    for item in json.loads(out)["nftables"]:
        if "counter" in item:
            counters[str(item["counter"]["name"])] = int(item["counter"]["packets"])
    return counters


@dataclass(frozen=True, slots=True)
class Eni:
    """One ENI attached to the instance, as EC2 lists it now."""

    eni_id: str
    device_index: int
    mac: str
    primary_ip: str
    addresses: frozenset[str]
    """Every address EC2 routes to it: primary, secondary and each address of its /28 prefixes."""
    ipv6: frozenset[str] = frozenset()
    """Every IPv6 CIDR EC2 routes to it: its IPv6 addresses (as /128s) and its /80 prefixes."""


def prefix_addresses(cidr: str) -> set[str]:
    return {str(a) for a in ipaddress.IPv4Network(cidr)}


def build_topology(ns: Namespaces, primary: Eni) -> None:
    """The static part: the VPC's router, its two hosts, the node's primary ENI, the nft table."""
    ip(ns.vpc, "link", "set", "lo", "up")
    ip(ns.vpc, "addr", "add", f"{GATEWAY}/32", "dev", "lo")
    sysctl(ns.vpc, "net.ipv4.ip_forward", "1")
    for link, peer_ns, host, router in (
        (VPC_HOST_LINK, ns.vpchost, VPC_HOST, VPC_HOST_ROUTER),
        (IGW_LINK, ns.inet, INET_HOST, IGW_ADDRESS),
    ):
        ip(ns.vpc, "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", peer_ns)
        ip(ns.vpc, "addr", "add", f"{router}/{HOST_PREFIXLEN}", "dev", link)
        ip(ns.vpc, "link", "set", link, "up")
        ip(peer_ns, "link", "set", "lo", "up")
        ip(peer_ns, "addr", "add", f"{host}/{HOST_PREFIXLEN}", "dev", "eth0")
        ip(peer_ns, "link", "set", "eth0", "up")
        ip(peer_ns, "route", "add", "default", "via", router)
    nft(
        ns.vpc,
        f"""\
table ip {NFT_TABLE} {{
  counter {IGW_COUNTER} {{ }}
  chain {SDC_CHAIN} {{
    type filter hook prerouting priority filter; policy accept;
  }}
  chain igw {{
    type filter hook forward priority filter; policy accept;
    oifname "{IGW_LINK}" ip saddr != {primary.primary_ip} counter name "{IGW_COUNTER}" drop
  }}
}}
""",
    )
    subnet = ipaddress.IPv4Network(SUBNET_CIDR)
    ip(ns.node, "link", "set", "lo", "up")
    plug_link(ns, primary)
    ip(ns.node, "addr", "add", f"{primary.primary_ip}/{subnet.prefixlen}", "dev", "eth0")
    ip(ns.node, "link", "set", "eth0", "up")
    ip(ns.node, "route", "add", "default", "via", GATEWAY, "dev", "eth0")
    sysctl(ns.node, "net.ipv4.conf.eth0.rp_filter", "2")  # as ipamd's init container sets it


def plug_link(ns: Namespaces, eni: Eni) -> None:
    """The ENI's link: `ethN` in the node with the ENI's MAC (down, as a new NIC comes up), `enN` in
    the VPC, up. A half-made pair of an earlier attempt goes first."""
    name, far = node_link(eni.device_index), fabric_link(eni.device_index)
    ip_batch(ns.node, [f"link del {name}"], force=True)
    ip(ns.node, "link", "add", name, "address", eni.mac, "type", "veth", "peer", "name", far)
    ip(ns.node, "link", "set", far, "netns", ns.vpc)
    ip(ns.vpc, "link", "set", far, "mtu", str(ENI_MTU), "up")


def _unplug(ns: Namespaces, device_index: int) -> None:
    ip_batch(ns.node, [f"link del {node_link(device_index)}"], force=True)  # takes its peer along


def render_checks(enis: Iterable[Eni]) -> str:
    """The nft transaction that makes the source/destination check exactly `enis` (those with a
    link). Counters and sets are named objects that `add` leaves as they are, so counts survive."""
    lines: list[str] = []
    rules: list[str] = []
    elements: list[str] = []
    for eni in sorted(enis, key=lambda e: e.device_index):
        members, counter = address_set(eni.eni_id), sdc_counter(eni.eni_id)
        lines.append(f"add set ip {NFT_TABLE} {members} {{ type ipv4_addr; }}")
        lines.append(f"add counter ip {NFT_TABLE} {counter}")
        rules.append(
            f'add rule ip {NFT_TABLE} {SDC_CHAIN} iifname "{fabric_link(eni.device_index)}" '
            f'ip saddr != @{members} counter name "{counter}" drop'
        )
        elements.append(f"flush set ip {NFT_TABLE} {members}")
        if eni.addresses:
            listed = ", ".join(sorted(eni.addresses, key=ipaddress.IPv4Address))
            elements.append(f"add element ip {NFT_TABLE} {members} {{ {listed} }}")
    lines.append(f"flush chain ip {NFT_TABLE} {SDC_CHAIN}")
    return "\n".join([*lines, *rules, *elements]) + "\n"


@dataclass
class Fabric:
    """The hypervisor and the VPC fabric, brought in line with EC2 by `step` (called on every poll).

    Hypervisor: an ENI EC2 shows attached at device index N ≥ 1 gets its link pair `attach_delay_s`
    after it was first seen (on EC2 the kernel sees a new NIC a little after the attach completes);
    a detached one loses it. Fabric: the source/destination check and the delivery of addresses follow
    the ENIs that have a link, with their addresses as EC2 lists them now."""

    ns: Namespaces
    primary: Eni
    attach_delay_s: float = 0.5
    clock: Callable[[], float] = time.monotonic
    plugged: dict[int, Eni] = field(default_factory=dict)
    """Device index → the ENI whose link pair exists, with its addresses as last applied."""
    first_seen: dict[str, float] = field(default_factory=dict)
    routed: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Address → (VPC link, MAC) of the route and neighbour entry installed for it."""
    checks: str = ""
    """The nft transaction last applied."""

    def start(self) -> None:
        """Builds the static topology, then delivers the primary ENI's addresses."""
        self._build()
        self.plugged[0] = self.primary
        self.step([self.primary])

    def step(self, attached: Iterable[Eni]) -> None:
        now = self.clock()
        by_index = {eni.device_index: eni for eni in attached}
        for index, eni in list(self.plugged.items()):
            current = by_index.get(index)
            if index != 0 and (current is None or current.eni_id != eni.eni_id):
                logger.info("unplug %s from %s", eni.eni_id, node_link(index))
                _unplug(self.ns, index)
                del self.plugged[index]
                self.routed = {a: r for a, r in self.routed.items() if r[0] != fabric_link(index)}
        due = []
        for index, eni in sorted(by_index.items()):
            if index in self.plugged:
                self.plugged[index] = eni  # its addresses as EC2 lists them now
                continue
            first = self.first_seen.setdefault(eni.eni_id, now)
            if now - first >= self.attach_delay_s:
                due.append(eni)
        attached_ids = {eni.eni_id for eni in by_index.values()}
        self.first_seen = {k: v for k, v in self.first_seen.items() if k in attached_ids}
        # The check covers a link before the link exists: no packet of it ever goes unchecked.
        self._apply_checks([*self.plugged.values(), *due])
        for eni in due:
            logger.info("plug %s as %s (%s)", eni.eni_id, node_link(eni.device_index), eni.mac)
            self._plug(eni)
            self.plugged[eni.device_index] = eni
            del self.first_seen[eni.eni_id]
        self._deliver()

    def _build(self) -> None:
        build_topology(self.ns, self.primary)

    def _plug(self, eni: Eni) -> None:
        plug_link(self.ns, eni)

    def _apply_checks(self, enis: list[Eni]) -> None:
        script = render_checks(enis)
        if script != self.checks:
            nft(self.ns.vpc, script)
            self.checks = script

    def _deliver(self) -> None:
        """A /32 route and a permanent neighbour entry (the ENI's MAC) per address, stale ones gone."""
        wanted: dict[str, tuple[str, str]] = {}
        for index, eni in sorted(self.plugged.items()):
            for address in eni.addresses:
                wanted[address] = (fabric_link(index), eni.mac)
        stale = [(a, r) for a, r in self.routed.items() if wanted.get(a) != r]
        ip_batch(
            self.ns.vpc,
            [f"neigh del {a} dev {link}" for a, (link, _) in stale]
            + [f"route del {a}/32 dev {link}" for a, (link, _) in stale if a not in wanted],
            force=True,  # an entry already gone is what deleting it asks for
        )
        ip_batch(
            self.ns.vpc,
            [
                line
                for a, (link, mac) in sorted(wanted.items())
                if self.routed.get(a) != (link, mac)
                for line in (
                    f"route replace {a}/32 dev {link}",
                    f"neigh replace {a} lladdr {mac} dev {link} nud permanent",
                )
            ],
        )
        self.routed = wanted
