"""End to end (c): NodePort and hostPort connections to pods on secondary ENIs go on, without a
single failure, while ipamd takes the node over from aws-node, reconciles and restarts.

The node is prepared as aws-node leaves it (`aws_node.AwsNode`: VPC CNI's ENIs, links, SNAT and
mangle NodePort rules, its plugin's pods and checkpoint, its conflist chaining portmap), with
kube-proxy's rules (`kube_proxy`, in each of its modes) for two NodePort Services, each served by
a pod on a secondary ENI (`web-cluster` on eth1 with externalTrafficPolicy Cluster, masqueraded;
`web-local` on eth2 with Local, the client's address kept), and a third pod on eth2 with a hostPort
(`web-host`, portmap's chains made through containerd). Each of them runs a TCP echo server named
after it (`tcp.TcpServer`). Before ipamd starts, both kinds work from the VPC host and nothing is
dropped.

Such a connection arrives on the primary ENI and is DNATed to the pod; the pod's reply would leave
by the pod's own ENI, with the node's address once un-DNATed, and EC2's source/destination check
would drop it, unless the connection is marked on arrival and the reply routed by main: aws-node's
mangle rules do it before the takeover, ipamd's `inbound` chain after it, and the takeover must
hand over with no gap.

A watch in the VPC host (`tcp.TcpWatch`) opens a fresh connection to each target every 200 ms
while ipamd starts (host networking on) and takes over, then through ipamd's next host-network
reconcile round, then through a restart (SIGTERM, start, ready). No attempt may fail after the
first second of ipamd's start; each target still answers after the reconcile and after the
restart; aws-node's NodePort rules are gone and ipamd's `inbound` chain is there; portmap's chains
of the running pods are untouched; and the VPC has dropped nothing.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.vpc.fabric import VPC_HOST, netns_path
from bench.vpc.processes import wait_until
from tests.e2e.support import require, require_root
from tests.e2e.vpc import kube_proxy
from tests.e2e.vpc.aws_node import (
    POD_NAMESPACE,
    PRIMARY_LINK,
    AwsNode,
    AwsPod,
    aws_node_iptables,
    aws_vpc_node,
    iptables_rules,
    missing_node_port_rules,
    node_port_rules,
    taken_over,
)
from tests.e2e.vpc.harness import VpcNode
from tests.e2e.vpc.tcp import TcpServer, TcpWatch, WatchAttempt, probe

pytestmark = pytest.mark.timeout(600)

SECONDARY_IPS = {0: 2, 1: 2, 2: 3}
POD_PORT = 8080
HOST_PORT = 8081
PLACEMENT = [("aws-p0", 0), ("web-cluster", 1), ("web-local", 2), ("web-host", 2)]
"""aws-node's pods: one on the primary ENI that serves nothing, the three servers on the secondary
ENIs."""
RECONCILE_INTERVAL_S = 5
"""IPAMD_HOST_NETWORK_RECONCILE_INTERVAL: short, so that the next round comes within the test."""
GRACE_S = 1.0
"""Failures in the first second of ipamd's start are not counted (none are expected either)."""
SETTLE_S = 3.0
"""How long the watch goes on after each step."""
TAKEOVER_DEADLINE_S = 60.0
MAX_GAP_S = 0.6
"""The longest pause between two attempts at one target: the watch ran all along."""
INBOUND_CHAIN = "chain inbound"


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    """The pod that must answer: its server's name."""
    port: int
    """On the node's primary address."""
    keeps_client: bool
    """The pod sees the VPC host's address (not masqueraded)."""


TARGETS = (
    Target("web-cluster", 30080, keeps_client=False),
    Target("web-local", 30081, keeps_client=True),
    Target("web-host", HOST_PORT, keeps_client=True),
)


def services(pods: dict[str, AwsPod]) -> list[kube_proxy.Service]:
    """The two NodePort Services, each with its pod as the one endpoint (on this node)."""

    def endpoint(name: str) -> list[kube_proxy.Endpoint]:
        return [kube_proxy.Endpoint(pods[name].address, POD_PORT, is_local=True)]

    cluster, local = (next(t for t in TARGETS if t.name == n) for n in ("web-cluster", "web-local"))
    return [
        kube_proxy.Service(
            cluster.name,
            POD_NAMESPACE,
            "172.20.0.10",
            80,
            node_port=cluster.port,
            external_traffic_policy="Cluster",
            endpoints=endpoint(cluster.name),
        ),
        kube_proxy.Service(
            local.name,
            POD_NAMESPACE,
            "172.20.0.11",
            80,
            node_port=local.port,
            external_traffic_policy="Local",
            endpoints=endpoint(local.name),
        ),
    ]


def portmap_rules(node: VpcNode) -> set[str]:
    """portmap's chains and rules in the node's iptables (all named `CNI-...`)."""
    return {line for line in iptables_rules(node).splitlines() if "CNI-" in line}


def prepare(node: VpcNode, mode: kube_proxy.Mode, stack: contextlib.ExitStack) -> set[str]:
    """aws-node's node with its pods, their servers and kube-proxy's rules, shown to work from the
    VPC host; returns portmap's rules."""
    aws = AwsNode.prepare(node, SECONDARY_IPS)
    placed = aws.run_pods(PLACEMENT, host_ports={"web-host": {HOST_PORT: POD_PORT}})
    aws.write_checkpoint(placed)
    pods = {pod.name: pod for pod in placed}
    for target in TARGETS:
        server = TcpServer(node.netns_of(pods[target.name].sandbox_id), POD_PORT, target.name)
        stack.enter_context(server)
    primary_ip = node.world_ready.primary_ip
    kube_proxy.install(node.ns.node, mode, services(pods), primary_ip)

    missing = missing_node_port_rules(node)
    assert not missing, f"aws-node's NodePort rules are not as VPC CNI makes them: {missing}"
    portmap = portmap_rules(node)
    dnat = f"--to-destination {pods['web-host'].address}:{POD_PORT}"
    assert any(dnat in line for line in portmap), f"no portmap DNAT to web-host: {portmap}"
    problems = []
    for target in TARGETS:
        result = probe(netns_path(node.ns.vpchost), primary_ip, target.port, 4096)
        kept = result.peer_ip == VPC_HOST
        if not result.ok or result.server != target.name or kept != target.keeps_client:
            problems.append(f"{target.name} on port {target.port}: {result}")
    assert not problems, (
        f"the node as aws-node leaves it does not serve (preparation wrong): {problems}"
    )
    assert set(node.sdc_drops().values()) <= {0}, f"drops before ipamd: {node.sdc_drops()}"
    return portmap


def is_taken_over(node: VpcNode) -> bool:
    return taken_over(node) and INBOUND_CHAIN in node.ipamd_nft()


def hostnet_rounds(node: VpcNode) -> float:
    """ipamd's host-network reconcile rounds that succeeded, on its schedule."""
    return node.metric("ipamd_reconcile_runs_total", job="hostnet", outcome="ok")


@dataclass
class Timeline:
    """Unix times of the steps, for the verdict and the log."""

    started: float = 0.0
    ready: float = 0.0
    taken_over: float = 0.0
    reconciled: float = 0.0
    stopped: float = 0.0
    restarted: float = 0.0
    ended: float = 0.0

    def describe(self) -> str:
        steps = ("ready", "taken_over", "reconciled", "stopped", "restarted", "ended")
        return ", ".join(f"{step} +{getattr(self, step) - self.started:.2f} s" for step in steps)


def go_through_takeover(node: VpcNode) -> Timeline:
    """ipamd started, ready, the takeover complete, its next reconcile round, a restart: each step
    followed by SETTLE_S of watching."""
    times = Timeline(started=time.time())
    node.start_ipamd()
    node.wait_ipamd_ready()
    times.ready = time.time()
    wait_until(lambda: True if is_taken_over(node) else None, "the takeover", TAKEOVER_DEADLINE_S)
    times.taken_over = time.time()
    time.sleep(SETTLE_S)  # the watch's window; not an ordering

    rounds = hostnet_rounds(node)
    wait_until(
        lambda: True if hostnet_rounds(node) > rounds else None,
        "ipamd's next host-network reconcile round",
        3 * RECONCILE_INTERVAL_S + 5,
        every_s=0.2,
    )
    times.reconciled = time.time()
    time.sleep(SETTLE_S)

    assert node.daemon.stop() == 0, f"ipamd's exit on SIGTERM:\n{node.daemon.log_tail()}"
    times.stopped = time.time()
    node.start_ipamd()
    node.wait_ipamd_ready()
    times.restarted = time.time()
    time.sleep(SETTLE_S)
    times.ended = time.time()
    return times


def watch_problems(attempts: list[WatchAttempt], times: Timeline) -> list[str]:
    """What the watch saw that it should not have: a failure after the grace, a wrong server, a
    gap, or no success after the reconcile or after the restart."""
    problems = []
    since = times.started + GRACE_S
    for target in TARGETS:
        mine = sorted((a for a in attempts if a.target == target.name), key=lambda a: a.at)
        failed = [a for a in mine if not a.result.ok]
        late = [a for a in failed if a.at >= since]
        # The figure the takeover is judged by, for `pytest -s`.
        print(
            f"takeover services {target.name} (port {target.port}): {len(mine)} connections, "
            f"{len(failed)} failed, {len(late)} after the first second"
        )
        for attempt in late[:20]:
            offset = attempt.at - times.started
            problems.append(f"{target.name}: failed at +{offset:.2f} s: {attempt.result.error}")
        wrong = {a.result.server for a in mine if a.result.ok} - {target.name}
        if wrong:
            problems.append(f"{target.name}: answered by {sorted(map(str, wrong))}")
        starts = [a.at for a in mine if times.started <= a.at <= times.ended]
        gaps = [b - a for a, b in itertools.pairwise(starts)]
        if not starts or max(gaps, default=0.0) > MAX_GAP_S:
            problems.append(f"{target.name}: the watch paused ({max(gaps, default=0.0):.2f} s)")
        for step, at in (("reconcile", times.reconciled), ("restart", times.restarted)):
            if not any(a.result.ok for a in mine if a.at >= at):
                problems.append(f"{target.name}: no connection succeeded after the {step}")
    return problems


@pytest.mark.parametrize("mode", kube_proxy.MODES)
def test_node_ports_and_host_ports_go_on_through_a_takeover(
    pause_image: Path, mode: kube_proxy.Mode
) -> None:
    require_root()
    require("iptables", kube_proxy.IPTABLES_RESTORE, kube_proxy.IPTABLES_SAVE, plugins=("portmap",))
    with contextlib.ExitStack() as stack:
        node = stack.enter_context(aws_vpc_node(pause_image))
        node.ipamd_env["IPAMD_HOST_NETWORK_RECONCILE_INTERVAL"] = str(RECONCILE_INTERVAL_S)
        portmap = prepare(node, mode, stack)
        primary_ip = node.world_ready.primary_ip
        watch = stack.enter_context(
            TcpWatch(netns_path(node.ns.vpchost), {t.name: (primary_ip, t.port) for t in TARGETS})
        )
        wait_until(
            lambda: True if all(watch.attempts(t.name) for t in TARGETS) else None,
            "the watch's first connections",
            10.0,
        )

        times = go_through_takeover(node)
        attempts = watch.stop()
        print(f"takeover services ({mode}): {times.describe()}")

        problems = watch_problems(attempts, times)
        left = [rule for rule in aws_node_iptables(node) if "primary ENI" in rule]
        if left or len(missing_node_port_rules(node)) != len(node_port_rules(PRIMARY_LINK)):
            problems.append(f"aws-node's NodePort rules still there: {left}")
        if INBOUND_CHAIN not in node.ipamd_nft():
            problems.append(f"no {INBOUND_CHAIN!r} in ipamd's table:\n{node.ipamd_nft()}")
        if (now := portmap_rules(node)) != portmap:
            problems.append(f"portmap's rules changed: gone {portmap - now}, new {now - portmap}")
        drops = node.sdc_drops()
        if set(drops.values()) - {0} or node.igw_drops():
            problems.append(f"source/destination check drops {drops}, gateway {node.igw_drops()}")
        assert not problems, "\n".join(problems)
