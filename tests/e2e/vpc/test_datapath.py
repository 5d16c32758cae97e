"""End to end (c): pods on every ENI of a node carry traffic, in an emulated VPC that drops (and counts)
what EC2's source/destination check and the internet gateway would drop.

Each test gets a node of its own (`harness.vpc_node`): the world process (EC2, IMDS, the hypervisor
attaching link pairs as ipamd attaches ENIs, the VPC fabric), containerd and ipamd in the node's
network namespace, pods run over CRI with `ipamd-cni` as their interface plugin. A fresh node per test
costs a few seconds and means no test inherits another's rules, SNAT table or ENIs.

An m5.large has 3 ENIs of 10 addresses: the primary ENI holds at most 9 pods, so 20 pods need all
three, and 12 put at least 3 on a secondary ENI.
"""

from __future__ import annotations

import re
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from bench.vpc.fabric import INET_HOST, VPC_HOST, ip
from bench.vpc.processes import wait_until
from ipamd.hostnet.ports import RT_PROTO_IPAMD
from tests.e2e.vpc.harness import (
    VpcNode,
    assert_rules_as_ipamd_holds,
    describe,
    free_subnet_address,
    remove_pods,
    start_pods,
    unreachable,
    vpc_host_ping,
    vpc_node,
)
from tests.e2e.vpc.rules import (
    CONNMARK_RULE,
    PRIORITY_FROM_POD,
    PRIORITY_TO_POD,
    KernelRule,
    host,
    pod_rules,
)

pytestmark = pytest.mark.timeout(600)

PODS = 20
FEW_PODS = 12


def mentions(text: str, address: str) -> bool:
    return re.search(rf"(?<![\d.]){re.escape(address)}(?!\d)", text) is not None


def test_pods_on_every_eni_reach_the_vpc_and_the_internet(pause_image: Path) -> None:
    with vpc_node(pause_image, "on") as node:
        names = start_pods(node, PODS)
        pods = node.pods(names)
        assert set(pods) == set(names), "ipamd holds one allocation per sandbox"
        used = {pod.device_index for pod in pods.values()}
        assert len(used) >= 3, f"pods spread over the ENIs at device indexes {sorted(used)}"

        out = [(s, target) for s in pods for target in (VPC_HOST, INET_HOST)]
        failed = unreachable(node, out)
        assert not failed, f"no answer: {describe(pods, failed)}"
        back = [(s, pods[s].address) for s in pods]
        failed = unreachable(node, back, vpc_host_ping(node))
        assert not failed, f"the VPC host got no answer from: {describe(pods, failed)}"
        drops = node.sdc_drops()
        assert set(drops) >= {pod.eni_id for pod in pods.values()}, drops
        assert set(drops.values()) == {0}, f"source/destination check drops: {drops}"
        assert node.igw_drops() == 0, "the internet gateway saw a pod's own address"
        assert_rules_as_ipamd_holds(node, snat=True)

        remove_pods(node, pods)
        assert node.allocations() == []
        addresses = {pod.address for pod in pods.values()}
        left = [
            r
            for r in node.ipamd_rules()
            if {r.src, r.dst} & {host(a) for a in addresses}
            or r.priority in (PRIORITY_TO_POD, PRIORITY_FROM_POD)
        ]
        assert not left, f"rules of removed pods: {left}"
        table = node.ipamd_nft()
        named = sorted(a for a in addresses if mentions(table, a))
        assert not named, f"the `ip ipamd` table still names {named}:\n{table}"


def test_without_host_networking_pods_on_secondary_enis_are_dropped(pause_image: Path) -> None:
    with vpc_node(pause_image, "off") as node:
        names = start_pods(node, PODS)
        pods = node.pods(names)
        on_primary = {s for s, pod in pods.items() if pod.device_index == 0}
        on_secondary = set(pods) - on_primary
        assert on_primary and on_secondary, pods

        failed = {s for s, _ in unreachable(node, [(s, VPC_HOST) for s in pods])}
        assert failed == on_secondary, (
            f"reached the VPC host only from the primary ENI: unexpected failures "
            f"{describe(pods, [(s, VPC_HOST) for s in failed - on_secondary])}, unexpected "
            f"answers {describe(pods, [(s, VPC_HOST) for s in on_secondary - failed])}"
        )
        drops = node.sdc_drops()
        primary = node.world_ready.primary_eni_id
        print(f"source/destination check drops by ENI: {drops}; igw drops: {node.igw_drops()}")
        # Each pod on a secondary ENI sent one echo request out of eth0, with an address eth0
        # does not own.
        assert drops[primary] >= len(on_secondary), drops
        assert node.ipamd_rules() == frozenset(), "host networking off: ipamd adds no rule"
        assert node.ipamd_nft() == "", "host networking off: ipamd has no nftables table"


def churn_through_a_kill(node: VpcNode, running: dict[str, str]) -> dict[str, str]:
    """Removes 4 of the `running` pods and adds 6 new ones, 4 at a time, and SIGKILLs ipamd (then
    starts it again) once 2 of these 10 operations are done; each is retried until it succeeds, as
    the kubelet retries. Returns the pods running afterwards, sandbox ID → name."""
    doomed = list(running)[:4]
    fresh = [f"churn-{i}" for i in range(6)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        removals = [pool.submit(node.remove_pod, s) for s in doomed]
        additions = [pool.submit(node.run_pod_through_failures, name) for name in fresh]
        ops: list[Future[None] | Future[str]] = [*removals, *additions]

        def under_way() -> int | None:
            done = sum(op.done() for op in ops)
            return done if done >= 2 else None

        wait_until(under_way, "churn under way")
        node.kill_ipamd()
        pending = sum(not op.done() for op in ops)
        node.start_ipamd()
        added = [str(op.result()) for op in additions]
        for op in removals:
            op.result()
    assert pending > 0, "ipamd was killed with churn still under way"
    live = {s: n for s, n in running.items() if s not in doomed}
    return live | dict(zip(added, fresh, strict=True))


def test_restart_restores_rules_before_ready(pause_image: Path) -> None:
    with vpc_node(pause_image, "on") as node:
        live = churn_through_a_kill(node, start_pods(node, 16))
        node.wait_ipamd_ready()
        # A DEL that found ipamd dead succeeded without it, and an ADD killed after its commit left
        # an allocation no sandbox has: the leak GC frees those.
        wait_until(
            lambda: True if set(node.pods()) == set(live) else None,
            "ipamd's allocations equal the live sandboxes",
            60.0,
        )
        assert_rules_as_ipamd_holds(node, snat=True)
        pods = node.pods(live)
        victim = next((p for p in pods.values() if p.device_index >= 1), next(iter(pods.values())))
        # Its 1536 rule when it is on a secondary ENI, else its 512 rule.
        lost = max(pod_rules(victim.address, victim.device_index))
        # No ENI holds the stale rule's address, so no pod can have it.
        stale = KernelRule(PRIORITY_FROM_POD, 2, src=host(free_subnet_address(node, "10.0.1.250")))

        node.kill_ipamd()
        ip(node.ns.node, "rule", "del", *lost.ip_args())
        ip(node.ns.node, "rule", "add", *stale.ip_args(), "protocol", str(RT_PROTO_IPAMD))
        rules = node.ipamd_rules()
        assert lost not in rules and stale in rules, "the hand-made damage is in place"

        node.start_ipamd()
        node.wait_ipamd_ready(every_s=0.02)
        assert_rules_as_ipamd_holds(node, snat=True)  # at once: repaired before ready

        out = [(s, target) for s in pods for target in (VPC_HOST, INET_HOST)]
        failed = unreachable(node, out)
        assert not failed, f"no answer after the restart: {describe(pods, failed)}"
        drops = node.sdc_drops()
        assert set(drops.values()) == {0}, f"source/destination check drops: {drops}"
        assert node.igw_drops() == 0


def test_external_snat_leaves_by_the_pods_own_eni(pause_image: Path) -> None:
    with vpc_node(pause_image, "on", {"AWS_VPC_K8S_CNI_EXTERNALSNAT": "true"}) as node:
        pods = node.pods(start_pods(node, FEW_PODS))
        pod = next(p for p in pods.values() if p.device_index >= 1)
        assert node.ping(pod.sandbox_id, VPC_HOST), "its own ENI carries it within the VPC"
        before = node.igw_drops()
        assert not node.ping(pod.sandbox_id, INET_HOST), "no SNAT: the gateway maps no pod address"
        assert node.igw_drops() > before
        drops = node.sdc_drops()
        assert drops.get(pod.eni_id, 0) == 0, "it left by its own ENI with its own address"
        assert set(drops.values()) == {0}, drops
        table = node.ipamd_nft()
        assert "snat to" not in table and "ct state new" not in table, "external SNAT: no SNAT"
        # AWS_VPC_CNI_NODE_PORT_SUPPORT (default true) still marks inbound connections, whose
        # replies the connmark rule routes; only those.
        assert "chain inbound" in table and CONNMARK_RULE in node.ipamd_rules()

    excluded = {"AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS": "198.51.100.0/24"}
    with vpc_node(pause_image, "on", excluded) as node:
        pods = node.pods(start_pods(node, FEW_PODS))
        chosen = [
            next(p for p in pods.values() if p.device_index == 0),
            next(p for p in pods.values() if p.device_index >= 1),
        ]
        for pod in chosen:
            assert node.ping(pod.sandbox_id, VPC_HOST), f"{pod} reaches the VPC host"
            before = node.igw_drops()
            assert not node.ping(pod.sandbox_id, INET_HOST), f"{pod}: excluded from SNAT"
            assert node.igw_drops() > before
        drops = node.sdc_drops()
        assert set(drops.values()) == {0}, f"excluded traffic leaves by the pod's own ENI: {drops}"
        assert CONNMARK_RULE in node.ipamd_rules(), "SNAT is on for everything else"
