"""The tests' side of the emulated VPC (`bench.vpc.node`): the node with the probes a test reads it
by, and `vpc_node`, skipped without root and failed as root when a tool or plugin the node needs is
missing (`.ci/run` installs them all).

Probes read what the test needs from the kernel, from ipamd's API and from its metrics (read in the
node's namespace, where they are served): pings from a pod's namespace and from the VPC host, the
VPC's drop counters, ipamd's policy rules (protocol 167) in the node, the node's `ip ipamd` nftables
table, and which ENI (device index) holds each pod's address. And what the datapath tests do with
a node's pods: start and remove many at once, ping from each, and check ipamd's rules against its
API (`start_pods`, `unreachable`, `assert_rules_as_ipamd_holds`, ...).

Nothing here runs a command in the test process's own network namespace: every one names its
namespace (`ip -n`, `nsenter --net=`).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bench.vpc import node as bench_node
from bench.vpc.fabric import IGW_COUNTER, Namespaces, in_netns, netns_path, read_counters, run
from bench.vpc.fabric_ipv6 import NFT6_FAMILY
from bench.vpc.processes import bare, make_workdir
from ipamd.hostnet.ports import RT_PROTO_IPAMD
from tests.e2e.conflist import NETWORK
from tests.e2e.support import require, require_root
from tests.e2e.vpc.rules import KernelRule, expected_rules

REPO = Path(__file__).resolve().parents[3]
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>.*)\})? (?P<value>\S+)")
"""A line of Prometheus' text format: a name, its labels, a value."""
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_FETCH = (
    "import sys, urllib.request;"
    " print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())"
)
"""Run by the node's Python in the node's namespace: the page at argv[1]."""


@dataclass(frozen=True, slots=True)
class Pod:
    sandbox_id: str
    name: str
    address: str
    eni_id: str
    device_index: int


class VpcNode(bench_node.VpcNode):
    """`bench.vpc.node.VpcNode` with what the tests read of it."""

    # -- ipamd's view -----------------------------------------------------------------------------

    def enis(self) -> list[dict[str, object]]:
        """`/v1/enis`: every ENI with `eni_id`, `device_index`, `is_primary`, `primary_ip`, units."""
        enis = self.daemon.get("/v1/enis")["enis"]
        assert isinstance(enis, list)
        return enis

    def allocations(self) -> list[dict[str, object]]:
        items = self.daemon.get("/v1/allocations")["allocations"]
        assert isinstance(items, list)
        return [item for item in items if item["network"] == NETWORK]

    def pods(self, names: Mapping[str, str] | None = None) -> dict[str, Pod]:
        """Sandbox ID → its pod: the one address ipamd gave it and the ENI that holds it.
        `names` maps sandbox IDs to pod names (for messages)."""
        device = {str(e["eni_id"]): int(str(e["device_index"])) for e in self.enis()}
        pods = {}
        for item in self.allocations():
            ips = item["ips"]
            assert isinstance(ips, list) and len(ips) == 1, item
            sandbox_id, eni_id = str(item["container_id"]), str(ips[0]["eni_id"])
            assert eni_id in device, f"{eni_id} of {item} is not an ENI of /v1/enis"
            name = (names or {}).get(sandbox_id, sandbox_id[:12])
            address = bare(str(ips[0]["address"]))
            pods[sandbox_id] = Pod(sandbox_id, name, address, eni_id, device[eni_id])
        return pods

    def ec2_addresses(self) -> set[str]:
        """Every address of the node's ENIs as ipamd lists them (units and primaries)."""
        found = set()
        for eni in self.enis():
            found.add(str(eni.get("primary_ip", "")))
            units = eni["units"]
            assert isinstance(units, list)
            for unit in units:
                found |= {str(a["address"]) for a in unit["addresses"]}
        return found - {""}

    def metric(self, name: str, **labels: str) -> float:
        """The sample of `name` with these labels (and maybe others) on ipamd's Prometheus
        endpoint, read in the node's namespace, where it listens; 0 when there is none."""
        url = f"http://{self.ipamd_env['IPAMD_METRICS_ADDR']}/metrics"
        text = run(in_netns(self.ns.node, sys.executable, "-c", _FETCH, url))
        for line in text.splitlines():
            found = _SAMPLE.match(line)
            if found is None or found["name"] != name:
                continue
            have = dict(_LABEL.findall(found["labels"] or ""))
            if all(have.get(k) == v for k, v in labels.items()):
                return float(found["value"])
        return 0.0

    # -- the kernel's view ------------------------------------------------------------------------

    def ipamd_rules(self) -> frozenset[KernelRule]:
        """Every IPv4 rule in the node tagged with ipamd's protocol."""
        listed = json.loads(run(["ip", "-j", "-4", "-n", self.ns.node, "rule", "show"]) or "[]")
        return frozenset(
            KernelRule.from_ip_json(item)
            for item in listed
            if str(item.get("protocol")) == str(RT_PROTO_IPAMD)
        )

    def ipamd_nft(self) -> str:
        """The node's `ip ipamd` nftables table as text; "" when there is none."""
        done = subprocess.run(
            in_netns(self.ns.node, "nft", "list", "table", "ip", "ipamd"),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        return done.stdout if done.returncode == 0 else ""

    def ping(self, sandbox_id: str, target: str) -> bool:
        """One echo request from the pod's namespace, answered within 2 s."""
        return _ping(self.netns_of(sandbox_id), target)

    def ping_from_vpc_host(self, target: str) -> bool:
        return _ping(netns_path(self.ns.vpchost), target)

    def sdc_drops(self) -> dict[str, int]:
        """ENI ID → packets EC2's source/destination check dropped on its link, for every ENI the
        world has given a link so far (detached ones included); IPv4's and, in a world with IPv6,
        IPv6's (table `ip6 vpc`) added up."""
        families = ["ip", NFT6_FAMILY] if self.world_ready.vpc_ipv6_cidr else ["ip"]
        drops: dict[str, int] = {}
        for family in families:
            for name, packets in read_counters(self.ns.vpc, family).items():
                if name.startswith("sdc_"):
                    eni_id = name.removeprefix("sdc_").replace("_", "-")  # inverts `sdc_counter`
                    drops[eni_id] = drops.get(eni_id, 0) + packets
        return drops

    def igw_drops(self) -> int:
        """Packets the internet gateway dropped: leaving the VPC from anything but the node's
        primary address."""
        return read_counters(self.ns.vpc)[IGW_COUNTER]


def _ping(netns: str, target: str) -> bool:
    done = subprocess.run(
        ["nsenter", f"--net={netns}", "ping", "-n", "-q", "-c", "1", "-W", "2", target],
        capture_output=True,
        timeout=30,
        check=False,
    )
    return done.returncode == 0


def free_subnet_address(node: VpcNode, preferred: str) -> str:
    """`preferred` if no ENI of the node holds it, else the highest address of the subnet that none
    does (and that is not the gateway or EC2's reserved ones)."""
    taken = node.ec2_addresses()
    if preferred not in taken:
        return preferred
    subnet = ipaddress.IPv4Network(node.world_ready.subnet_cidr)
    for candidate in reversed(list(subnet.hosts())[3:-1]):
        if str(candidate) not in taken:
            return str(candidate)
    raise AssertionError(f"no free address in {subnet}")


@contextlib.contextmanager
def vpc_node(
    pause_image: Path,
    host_network: str,
    env: Mapping[str, str] | None = None,
    *,
    ipv6: bool = False,
) -> Iterator[VpcNode]:
    """`bench.vpc.node.vpc_node` with the tests' probes, once the machine has what it needs."""
    require_root()
    require(*bench_node.TOOLS, plugins=bench_node.PLUGINS)
    node = VpcNode(make_workdir("vpc"), Namespaces.unique())
    with bench_node.running(node, pause_image, host_network, env, ipv6=ipv6) as made:
        yield made


# -- what the datapath tests do with a node's pods ----------------------------------------------


def start_pods(node: VpcNode, count: int, prefix: str = "pod") -> dict[str, str]:
    """Runs `count` pods at once, as a kubelet does after a deployment scales; sandbox ID → name."""
    names = [f"{prefix}-{i:02d}" for i in range(count)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        sandbox_ids = list(pool.map(node.run_pod, names))
    return dict(zip(sandbox_ids, names, strict=True))


def remove_pods(node: VpcNode, sandbox_ids: Iterable[str]) -> None:
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(node.remove_pod, sandbox_ids))


def unreachable(
    node: VpcNode, probes: list[tuple[str, str]], ping: Callable[[str, str], bool] | None = None
) -> list[tuple[str, str]]:
    """The (source, target) pairs whose ping got no answer; pings run in parallel, each waits 2 s."""
    send = ping or node.ping
    with ThreadPoolExecutor(max_workers=16) as pool:
        answered = list(pool.map(lambda probe: send(*probe), probes))
    return [probe for probe, ok in zip(probes, answered, strict=True) if not ok]


def vpc_host_ping(node: VpcNode) -> Callable[[str, str], bool]:
    return lambda _source, address: node.ping_from_vpc_host(address)


def describe(pods: dict[str, Pod], failed: list[tuple[str, str]]) -> list[str]:
    return [
        f"{pods[s].name} ({pods[s].address} on eth{pods[s].device_index}) ↔ {t}" for s, t in failed
    ]


def assert_rules_as_ipamd_holds(node: VpcNode, snat: bool) -> None:
    """The node's protocol-167 rules are exactly what ipamd's API implies (`expected_rules`). The API
    is read just before and just after the kernel, so that a change meanwhile (the pool may grow, and
    an ENI be set up, at any time) is allowed either way, and nothing else is."""
    first = expected_rules(node.allocations(), node.enis(), snat)
    rules = node.ipamd_rules()
    second = expected_rules(node.allocations(), node.enis(), snat)
    missing = sorted((first & second) - rules)
    unexpected = sorted(rules - (first | second))
    assert not missing and not unexpected, f"missing {missing}; unexpected {unexpected}"
