"""End to end (c): Kubernetes Services reach pods on every ENI of a node, through kube-proxy's own
rules (`kube_proxy`, both of its modes) and portmap's hostPorts, in the emulated VPC that drops (and
counts) what EC2's source/destination check would drop.

Traffic is real TCP with its bytes counted both ways (`tcp`): NAT paths are where a reply can go
astray while a ping still looks fine. Every case reads the VPC router's source/destination-check
counters of every ENI link.

What each node proves, for a pod on the primary ENI and one on a secondary ENI:
- NodePort with `externalTrafficPolicy: Local` (the pod sees the client's own address) and `Cluster`
  (masqueraded): the VPC host's connection to `<node primary address>:<nodePort>` completes. The
  connection arrives on the primary ENI; without ipamd's inbound mark the secondary-ENI pod's reply
  would leave by its own ENI with the node's address and be dropped.
- ClusterIP from the secondary-ENI pod to an endpoint elsewhere in the VPC (the VPC host sees the pod's
  own address: it left by its own ENI) and to the same-node pod on the primary ENI.
- NLB IP-target traffic: the VPC host straight to the pod's address, answered by the pod's own ENI.
- Internet egress with kube-proxy's `--masquerade-all`.
- hostPort through containerd's real port mappings (portmap, chained after ipamd-cni); DEL removes it.
- With `AWS_VPC_CNI_NODE_PORT_SUPPORT=false`, the NodePort case to the secondary-ENI pod fails, and
  its ENI's drop counter says why; everything else still passes.

Secondary-IP mode fills the primary ENI's 9 addresses, so the 10th pod is on a secondary ENI. In
prefix mode the primary ENI's first /28 serves 16 pods and the pool grows the primary ENI before any
other, so the node is restarted with custom networking on its own subnet (an ENIConfig for its zone),
which puts new pods on secondary ENIs only: one pod on a primary-ENI /28, one on a secondary-ENI /28.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.vpc.fabric import INET_HOST, REGION, VPC_HOST, in_netns, netns_path, run, sysctl
from bench.vpc.processes import wait_until
from tests.e2e.vpc import kube_proxy
from tests.e2e.vpc.harness import Pod, VpcNode, vpc_node
from tests.e2e.vpc.kube_proxy import Endpoint, Mode, Service
from tests.e2e.vpc.tcp import TcpResult, TcpServer, probe

pytestmark = pytest.mark.timeout(900)

POD_PORT = 8080
"""Where each pod's (and the VPC and internet hosts') TCP server listens."""
SIZE = 20_000
"""Bytes each way per connection: many segments, so a lost reply segment shows."""
PRIMARY_PODS = 9
"""An m5.large's primary ENI: 10 addresses, its own primary one among them."""
HOST_PORTS = (31080, 31081)
"""The hostPorts of the primary-ENI pod and of the secondary-ENI pod."""


@dataclass(frozen=True, slots=True)
class Target:
    """One pod with a server in it, and its hostPort."""

    pod: Pod
    netns: str
    host_port: int


@dataclass(frozen=True, slots=True)
class Stage:
    node: VpcNode
    on_primary: Target
    on_secondary: Target

    @property
    def node_ip(self) -> str:
        return self.node.world_ready.primary_ip


def _services(stage: Stage) -> dict[str, Service]:
    """The Services of one round: a Local and a Cluster NodePort per pod, a ClusterIP to the VPC
    host and one to the primary-ENI pod."""
    services: dict[str, Service] = {}
    for n, (label, target) in enumerate(
        (("primary", stage.on_primary), ("secondary", stage.on_secondary))
    ):
        endpoint = Endpoint(target.pod.address, POD_PORT, is_local=True)
        for m, policy in enumerate(("Local", "Cluster")):
            name = f"{policy.lower()}-{label}"
            services[name] = Service(
                name=name,
                namespace="e2e",
                cluster_ip=f"172.20.0.{10 + 2 * n + m}",
                port=80,
                node_port=30080 + 2 * n + m,
                external_traffic_policy=policy,  # type: ignore[arg-type]
                endpoints=(endpoint,),
            )
    services["vpc-host"] = Service(
        "vpc-host", "e2e", "172.20.0.20", 80, endpoints=(Endpoint(VPC_HOST, POD_PORT),)
    )
    primary = Endpoint(stage.on_primary.pod.address, POD_PORT, is_local=True)
    services["same-node"] = Service("same-node", "e2e", "172.20.0.21", 80, endpoints=(primary,))
    return services


def _ok(result: TcpResult, what: str) -> TcpResult:
    assert result.ok, f"{what}: {result}"
    assert result.bytes_sent == result.bytes_received == SIZE, f"{what}: {result}"
    return result


def _no_drops(stage: Stage, what: str) -> None:
    drops = stage.node.sdc_drops()
    assert set(drops.values()) <= {0}, f"{what}: source/destination check drops {drops}"


def _from_vpc_host(stage: Stage, address: str, port: int) -> TcpResult:
    return probe(netns_path(stage.node.ns.vpchost), address, port, SIZE)


def check_node_ports(stage: Stage, services: dict[str, Service], *, secondary: bool) -> None:
    """NodePorts of both policies reach the primary-ENI pod, and the secondary-ENI pod when
    `secondary`."""
    labels = ("primary", "secondary") if secondary else ("primary",)
    for label in labels:
        target = stage.on_primary if label == "primary" else stage.on_secondary
        for policy in ("local", "cluster"):
            service = services[f"{policy}-{label}"]
            assert service.node_port is not None
            what = f"NodePort {policy} to the {label}-ENI pod {target.pod.address}"
            result = _ok(_from_vpc_host(stage, stage.node_ip, service.node_port), what)
            assert result.server == target.pod.name, what
            if policy == "local":
                assert result.peer_ip == VPC_HOST, f"{what}: the client's address is kept"
            else:
                assert result.peer_ip != VPC_HOST, f"{what}: masqueraded"
            _no_drops(stage, what)


def check_pod_paths(stage: Stage, *, masquerade_all: bool = False) -> None:
    """ClusterIP from the secondary-ENI pod (to the VPC and to the same node), and the VPC host
    straight to each pod's address (an NLB's IP targets). It leaves by its own ENI: with its own
    address, or with `masquerade_all` that ENI's (kube-proxy masquerades it to the address of the
    link it leaves by)."""
    source = stage.on_secondary
    result = _ok(probe(source.netns, "172.20.0.20", 80, SIZE), "ClusterIP to the VPC host")
    assert result.server == "vpc-host"
    eni = next(e for e in stage.node.enis() if e["eni_id"] == source.pod.eni_id)
    expected = eni["primary_ip"] if masquerade_all else source.pod.address
    assert result.peer_ip == expected, "it left by its own ENI"
    result = _ok(probe(source.netns, "172.20.0.21", 80, SIZE), "ClusterIP to the same node")
    assert result.server == stage.on_primary.pod.name
    for target in (stage.on_primary, stage.on_secondary):
        what = f"the VPC host to {target.pod.address} (an NLB IP target)"
        result = _ok(_from_vpc_host(stage, target.pod.address, POD_PORT), what)
        assert result.peer_ip == VPC_HOST, f"{what}: the client's address is kept"
    _no_drops(stage, "ClusterIP and IP targets")


def check_internet_egress(stage: Stage) -> None:
    before = stage.node.igw_drops()
    for target in (stage.on_primary, stage.on_secondary):
        what = f"internet egress of {target.pod.address} with --masquerade-all"
        result = _ok(probe(target.netns, INET_HOST, POD_PORT, SIZE), what)
        assert result.peer_ip == stage.node_ip, f"{what}: SNATed to the node's address"
    assert stage.node.igw_drops() == before
    _no_drops(stage, "internet egress")


def run_every_mode(stage: Stage, *, node_port_support: bool = True) -> None:
    """Every case in each of kube-proxy's modes; without node port support, the NodePort cases to
    the secondary-ENI pod last (the pod's kernel goes on retransmitting its dropped replies)."""
    services = _services(stage)
    try:
        for mode in kube_proxy.MODES:
            run_one_mode(stage, mode, services, node_port_support)
        if not node_port_support:
            for mode in kube_proxy.MODES:
                kube_proxy.install(stage.node.ns.node, mode, list(services.values()), stage.node_ip)
                check_node_port_fails_without_support(stage, services)
    finally:
        kube_proxy.remove(stage.node.ns.node)


def run_one_mode(
    stage: Stage, mode: Mode, services: dict[str, Service], node_port_support: bool
) -> None:
    node = stage.node
    kube_proxy.install(node.ns.node, mode, list(services.values()), stage.node_ip)
    check_node_ports(stage, services, secondary=node_port_support)
    check_host_ports(stage, secondary=node_port_support)
    check_pod_paths(stage)
    kube_proxy.install(
        node.ns.node, mode, list(services.values()), stage.node_ip, masquerade_all=True
    )
    check_internet_egress(stage)
    check_pod_paths(stage, masquerade_all=True)


def check_node_port_fails_without_support(stage: Stage, services: dict[str, Service]) -> None:
    """docs/configuration.md, AWS_VPC_CNI_NODE_PORT_SUPPORT: with it off, a NodePort or hostPort
    connection to a pod on a secondary ENI fails: the reply leaves by the pod's ENI with the node's
    address."""
    eni = stage.on_secondary.pod.eni_id
    cases = {f"NodePort {p}": services[f"{p}-secondary"].node_port for p in ("local", "cluster")}
    cases["hostPort"] = stage.on_secondary.host_port
    for case, port in cases.items():
        assert port is not None
        before = stage.node.sdc_drops()
        result = _from_vpc_host(stage, stage.node_ip, port)
        assert not result.ok, f"{case} to a secondary-ENI pod, no support: {result}"
        after = stage.node.sdc_drops()
        assert after.get(eni, 0) > before.get(eni, 0), "its reply was dropped on its ENI"
        others = {e: n for e, n in after.items() if e != eni and n != before.get(e, 0)}
        assert not others, f"drops elsewhere: {others}"


def check_host_ports(stage: Stage, *, secondary: bool) -> None:
    """Each pod's hostPort (portmap's DNAT) from the VPC host, the secondary-ENI pod's when
    `secondary`."""
    targets = (stage.on_primary, stage.on_secondary) if secondary else (stage.on_primary,)
    for target in targets:
        what = f"hostPort {target.host_port} of the pod {target.pod.address}"
        result = _ok(_from_vpc_host(stage, stage.node_ip, target.host_port), what)
        assert result.server == target.pod.name, what
        _no_drops(stage, what)


def check_host_port_goes_with_its_pod(stage: Stage) -> None:
    """DEL reaches portmap (chained after ipamd-cni): the removed pod's mapping is gone."""
    node, gone = stage.node, stage.on_secondary
    assert gone.pod.sandbox_id in _nat_rules(node), "portmap's chains name the container"
    node.remove_pod(gone.pod.sandbox_id)
    assert gone.pod.sandbox_id not in _nat_rules(node), "portmap's DEL removed its rules"
    result = _from_vpc_host(stage, stage.node_ip, gone.host_port)
    assert not result.ok, f"the removed pod's hostPort still answers: {result}"
    check_host_ports(stage, secondary=False)


@contextlib.contextmanager
def servers(stage: Stage) -> Iterator[None]:
    """A server in each pod, the VPC host and the internet host."""
    node = stage.node
    with contextlib.ExitStack() as stack:
        for target in (stage.on_primary, stage.on_secondary):
            stack.enter_context(TcpServer(target.netns, POD_PORT, name=target.pod.name))
        stack.enter_context(TcpServer(netns_path(node.ns.vpchost), POD_PORT, name="vpc-host"))
        stack.enter_context(TcpServer(netns_path(node.ns.inet), POD_PORT, name="internet"))
        yield


def _run_target(node: VpcNode, name: str, host_port: int) -> Target:
    """A pod with `host_port` mapped to its POD_PORT through containerd's port mappings."""
    sandbox_id = node.run_pod(name, host_ports={host_port: POD_PORT})
    pod = node.pods({sandbox_id: name})[sandbox_id]
    return Target(pod, node.netns_of(sandbox_id), host_port)


def _secondary_ip_stage(node: VpcNode) -> Stage:
    """PRIMARY_PODS + 1 pods, one at a time so that placement is known: the first is on the
    primary ENI, the last on a secondary one."""
    first = _run_target(node, "svc-00", HOST_PORTS[0])
    for i in range(1, PRIMARY_PODS):
        node.run_pod(f"svc-{i:02d}")
    last = _run_target(node, f"svc-{PRIMARY_PODS:02d}", HOST_PORTS[1])
    assert first.pod.device_index == 0, first.pod
    assert last.pod.device_index >= 1, last.pod
    return Stage(node, first, last)


@pytest.mark.parametrize("node_port_support", [True, False], ids=["node-port", "no-node-port"])
def test_services_reach_pods_on_every_eni_in_secondary_ip_mode(
    pause_image: Path, node_port_support: bool
) -> None:
    env = {} if node_port_support else {"AWS_VPC_CNI_NODE_PORT_SUPPORT": "false"}
    with vpc_node(pause_image, "on", env) as node:
        stage = _secondary_ip_stage(node)
        table = node.ipamd_nft()
        assert ("chain inbound" in table) is node_port_support, table
        with servers(stage):
            run_every_mode(stage, node_port_support=node_port_support)
            if node_port_support:
                check_host_port_goes_with_its_pod(stage)


def _eni_config(node: VpcNode) -> Path:
    """An ENIConfig for the node's zone naming the node's own subnet (custom networking)."""
    primary = next(e for e in node.enis() if e["is_primary"])
    zone = f"{REGION}a"  # the world's instance and subnet (cloud/embedded/world_layout.py)
    path = node.workdir / "eniconfig.json"
    path.write_text(json.dumps({zone: {"subnet": primary["subnet_id"]}}))
    return path


def test_services_reach_pods_on_every_eni_in_prefix_mode(pause_image: Path) -> None:
    with vpc_node(pause_image, "on", {"ENABLE_PREFIX_DELEGATION": "true"}) as node:
        on_primary = _run_target(node, "svc-prefix-0", HOST_PORTS[0])
        assert on_primary.pod.device_index == 0
        assert _unit_of(node, on_primary.pod.address).endswith("/28")

        custom = {
            "AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG": "true",
            "IPAMD_ENI_CONFIG_FILE": str(_eni_config(node)),
            "ENI_CONFIG_LABEL_DEF": "topology.kubernetes.io/zone",
        }
        node.daemon.stop()
        node.ipamd_env.update(custom)
        node.start_ipamd()
        node.wait_ipamd_ready()
        on_secondary = _run_target(node, "svc-prefix-1", HOST_PORTS[1])
        assert on_secondary.pod.device_index >= 1, on_secondary.pod
        assert _unit_of(node, on_secondary.pod.address).endswith("/28")

        stage = Stage(node, on_primary, on_secondary)
        with servers(stage):
            run_every_mode(stage)
            check_host_port_goes_with_its_pod(stage)


def _unit_of(node: VpcNode, address: str) -> str:
    for eni in node.enis():
        units = eni["units"]
        assert isinstance(units, list)
        for unit in units:
            if any(a["address"] == address for a in unit["addresses"]):
                return str(unit["cidr"])
    raise AssertionError(f"{address} is in no unit of /v1/enis")


def _nat_rules(node: VpcNode) -> str:
    """The node's iptables nat table as iptables-nft-save prints it: portmap's chains, whose
    comments name each pod's container ID (nft's own listing does not show iptables comments)."""
    return run(in_netns(node.ns.node, "iptables-nft-save", "-t", "nat"))


def test_strict_reverse_path_filtering_is_reported_from_start(pause_image: Path) -> None:
    """Strict `rp_filter` on the primary interface drops inbound connections to secondary-ENI pods
    before they reach them; ipamd says so from its start, in `/readyz`, the log and a metric, and
    stops saying so once it is loose again."""
    fast = {"IPAMD_HOST_NETWORK_RECONCILE_INTERVAL": "1"}
    with vpc_node(pause_image, "on", fast) as node:
        stage = _secondary_ip_stage(node)
        primary_link = "eth0"  # the world's primary ENI link (fabric.node_link(0))
        node.daemon.stop()
        sysctl(node.ns.node, f"net.ipv4.conf.{primary_link}.rp_filter", "1")
        node.start_ipamd()
        node.wait_ipamd_ready()
        status, body = node.daemon.call("GET", "/readyz")
        assert status == 200, body
        degraded = body.get("degraded")
        assert isinstance(degraded, list) and len(degraded) == 1, body
        assert "rp_filter" in degraded[0] and primary_link in degraded[0], degraded
        assert node.metric("ipamd_hostnet_rp_filter_strict") == 1.0
        assert "hostnet.rp_filter_strict" in node.daemon.log_tail(20_000)
        with servers(stage):
            check_host_ports(stage, secondary=False)
            result = _from_vpc_host(stage, stage.node_ip, stage.on_secondary.host_port)
            assert not result.ok, f"strict filtering let a secondary-ENI pod answer: {result}"

            sysctl(node.ns.node, f"net.ipv4.conf.{primary_link}.rp_filter", "2")
            wait_until(
                lambda: True if "degraded" not in node.daemon.call("GET", "/readyz")[1] else None,
                "the next reconcile sees loose filtering",
                30.0,
            )
            assert node.metric("ipamd_hostnet_rp_filter_strict") == 0.0
            check_host_ports(stage, secondary=True)
