"""End to end: a device index ipamd freed after a restart is the next new ENI's, and that ENI works.

Pods on the ENIs at device indexes 0, 1 and 2; ipamd restarts (its start-up drift lists all three);
the pods on the ENI at 1 go and, with no release delay and one address kept warm, the pool gives that
ENI back, so EC2 shows 0 and 2 in use. New pods then need a third ENI again: it is attached at 1
(`eth1`, table 2), not at 3; its table holds its own routes only, the node's rules are exactly what
ipamd holds, and its pods reach the VPC host and the internet and are reached back.

An m5.large has 3 ENIs of 10 addresses (9 for pods): 20 pods fill the ENIs at 0 and 1 and put 2 on
the one at 2; 10 more, with the ENI at 1 gone, fill the one at 2 and need another.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.vpc.fabric import GATEWAY, INET_HOST, VPC_HOST, node_link, run
from bench.vpc.processes import wait_until
from tests.e2e.vpc.harness import (
    Pod,
    VpcNode,
    assert_rules_as_ipamd_holds,
    describe,
    remove_pods,
    start_pods,
    unreachable,
    vpc_host_ping,
    vpc_node,
)

pytestmark = pytest.mark.timeout(600)

SHRINKING = {
    "WARM_IP_TARGET": "1",
    "IPAMD_RELEASE_DELAY": "0",
    "IPAMD_MIN_ENI_LIFETIME": "0",
    "IP_COOLDOWN_PERIOD": "0",
    "IPAMD_SHRINK_INTERVAL": "1",
    "IPAMD_POOL_INTERVAL": "1",
}
"""What is spare goes back within seconds: an emptied ENI is detached at the next rounds."""


def device_indexes(node: VpcNode) -> dict[int, str]:
    """Device index → the ENI ipamd holds there."""
    return {int(str(e["device_index"])): str(e["eni_id"]) for e in node.enis()}


def table_routes(node: VpcNode, table: int) -> set[tuple[str, str, str]]:
    """The routes of a table in the node as (destination, gateway, device)."""
    argv = ["ip", "-j", "-4", "-n", node.ns.node, "route", "show", "table", str(table)]
    listed = json.loads(run(argv) or "[]")
    return {(str(r["dst"]), str(r.get("gateway", "")), str(r.get("dev", ""))) for r in listed}


def restart(node: VpcNode) -> None:
    assert node.daemon.stop() == 0, "ipamd exits 0 on SIGTERM"
    node.start_ipamd()
    node.wait_ipamd_ready()


def test_a_device_index_freed_after_a_restart_is_the_next_new_enis(pause_image: Path) -> None:
    with vpc_node(pause_image, "on", SHRINKING) as node:
        pods = node.pods(start_pods(node, 20))
        at = device_indexes(node)
        assert set(at) == {0, 1, 2}, f"pods on the ENIs at {sorted(at)}"
        freed = at[1]
        on_freed = [s for s, p in pods.items() if p.eni_id == freed]
        assert on_freed and any(p.device_index == 2 for p in pods.values()), pods

        restart(node)
        remove_pods(node, on_freed)
        wait_until(
            lambda: True if set(device_indexes(node)) == {0, 2} else None,
            "the ENI at device index 1 given back",
            60.0,
        )

        names = start_pods(node, 10, prefix="later")
        at = device_indexes(node)
        assert set(at) == {0, 1, 2}, f"the new ENI at the freed index, not at {sorted(at)}"
        new = at[1]
        assert new != freed
        everyone = node.pods({**names, **{s: p.name for s, p in pods.items()}})
        on_new = {s: p for s, p in everyone.items() if p.eni_id == new}
        assert on_new, f"no pod on the new ENI {new}: {everyone}"

        link = node_link(1)
        assert table_routes(node, 2) == {
            (GATEWAY, "", link),
            ("default", GATEWAY, link),
        }, "table 2 holds the new ENI's routes only"
        assert_rules_as_ipamd_holds(node, snat=True)
        assert_pods_carry_traffic(node, on_new)


def assert_pods_carry_traffic(node: VpcNode, pods: dict[str, Pod]) -> None:
    out = [(s, target) for s in pods for target in (VPC_HOST, INET_HOST)]
    failed = unreachable(node, out)
    assert not failed, f"no answer: {describe(pods, failed)}"
    back = [(s, pods[s].address) for s in pods]
    failed = unreachable(node, back, vpc_host_ping(node))
    assert not failed, f"the VPC host got no answer from: {describe(pods, failed)}"
    drops = node.sdc_drops()
    assert all(drops.get(pod.eni_id, 0) == 0 for pod in pods.values()), drops
    assert node.igw_drops() == 0, "the internet gateway saw a pod's own address"
