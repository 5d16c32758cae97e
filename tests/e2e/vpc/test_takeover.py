"""End to end (c): ipamd takes a node over from aws-node in place, in the emulated VPC.

The node is prepared as aws-node leaves it (`aws_node.AwsNode`: VPC CNI's ENIs and their links, its
SNAT chains, its plugin's pods on the primary ENI and two secondary ENIs, its checkpoint) and shown
to work before ipamd ever starts. Then ipamd starts with host networking on while every pod pings
the VPC host and the internet host, and opens new connections to the internet host one after
another (which SNAT and the connmark decide anew, where a running ping keeps what its connection
got); no reply may be lost after the first second. At ready the spare addresses of the adopting
ENIs are cooling (aws-node's checkpoint says nothing of when they were released). Afterwards every
pod has kept its address, ipamd's rules, table and conflist have replaced aws-node's, a new pod comes
up through ipamd, an adopted pod's removal reaches ipamd, and once ipamd stops, its checkpoint read
as aws-node reads it names every live pod and nothing else.

A second test feeds ipamd a malformed and a foreign checkpoint: ipamd logs it, becomes ready and
adopts nothing.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bench.vpc.fabric import INET_HOST, VPC_HOST, run
from bench.vpc.node import DEPLOYED_CONFLIST, LEAK_GRACE_S
from bench.vpc.processes import wait_until
from tests.e2e.vpc.aws_cni_plugin import veth_name
from tests.e2e.vpc.aws_node import (
    AWS_CONFLIST,
    CHECKPOINT_VERSION,
    NETWORK,
    POD_NAMESPACE,
    AwsNode,
    AwsPod,
    aws_node_iptables,
    aws_vpc_node,
    checkpoint_path,
    create_enis,
    rules_mismatch,
    snat_chains,
    taken_over,
    untagged_rules,
)
from tests.e2e.vpc.harness import VpcNode
from tests.e2e.vpc.pings import FreshFlows, Pings
from tests.e2e.vpc.rules import (
    PRIORITY_FROM_POD,
    PRIORITY_TO_POD,
    host,
)

pytestmark = pytest.mark.timeout(600)

SECONDARY_IPS = {0: 3, 1: 3, 2: 3}
"""Secondary addresses per device index: a spare one on each ENI, for the cooling to cover."""
PLACEMENT = [
    ("aws-p0", 0),
    ("aws-p1", 0),
    ("aws-a0", 1),
    ("aws-a1", 1),
    ("aws-b0", 2),
    ("aws-b1", 2),
]
"""aws-node's pods: two on the primary ENI and two on each secondary one."""
SETTLE_S = 3.0
"""How long the pings go on once the takeover is complete."""
TAKEOVER_DEADLINE_S = 60.0
IGNORED_EVENT = "takeover.checkpoint_ignored"
"""What ipamd logs of a checkpoint it will not read."""

Key = tuple[str, str, str]
"""An allocation's key: network name, container ID, interface name."""


def allocations(node: VpcNode) -> dict[Key, list[str]]:
    """ipamd's allocations (`/v1/allocations`) by key → their addresses, without prefix length."""
    items = node.daemon.get("/v1/allocations")["allocations"]
    assert isinstance(items, list)
    return {
        (str(i["network"]), str(i["container_id"]), str(i["ifname"])): [
            str(a["address"]).partition("/")[0] for a in i["ips"]
        ]
        for i in items
    }


def within(deadline_s: float, done: Callable[[], bool]) -> bool:
    """Whether `done()` came true within the deadline (False instead of a failure: the checks
    that follow say what is missing)."""
    end = time.monotonic() + deadline_s
    while not done():
        if time.monotonic() > end:
            return False
        time.sleep(0.2)
    return True


def unreachable(node: VpcNode, pods: list[AwsPod], targets: tuple[str, ...]) -> list[str]:
    probes = [(pod, target) for pod in pods for target in targets]
    with ThreadPoolExecutor(max_workers=12) as pool:
        answered = list(pool.map(lambda p: node.ping(p[0].sandbox_id, p[1]), probes))
    return [
        f"{pod.name} ({pod.address} on eth{pod.device_index}) → {target}"
        for (pod, target), ok in zip(probes, answered, strict=True)
        if not ok
    ]


def read_vpc_cni_checkpoint(path: Path) -> dict[Key, dict[str, object]]:
    """The checkpoint as aws-node reads it (`datastore.ReadBackingStore`): the version must be
    VPC CNI's, then one entry per allocation; unknown keys are ignored."""
    data = json.loads(path.read_text())
    assert data.get("version") == CHECKPOINT_VERSION, f"not VPC CNI's checkpoint: {data!r}"
    entries: dict[Key, dict[str, object]] = {}
    for entry in data["allocations"]:
        key = (str(entry["networkName"]), str(entry["containerID"]), str(entry["ifName"]))
        assert key not in entries, f"{key} twice in the checkpoint"
        entries[key] = entry
    return entries


def key_of(pod_sandbox: str) -> Key:
    return (NETWORK, pod_sandbox, "eth0")


def prepare_aws_node(node: VpcNode) -> tuple[AwsNode, list[AwsPod]]:
    aws = AwsNode.prepare(node, SECONDARY_IPS)
    pods = aws.run_pods(PLACEMENT)
    aws.write_checkpoint(pods)
    failed = unreachable(node, pods, (VPC_HOST, INET_HOST))
    assert not failed, f"the node as aws-node leaves it does not work (preparation wrong): {failed}"
    assert set(node.sdc_drops().values()) <= {0}, f"drops before ipamd: {node.sdc_drops()}"
    return aws, pods


def start_pings(node: VpcNode, pings: Pings, flows: FreshFlows, pods: list[AwsPod]) -> None:
    """A continuous ping per pod and target, and new connections to the internet host from every
    pod (what SNAT and the connmark decide anew)."""
    for pod in pods:
        for target in (VPC_HOST, INET_HOST):
            pings.start(pod.name, node.netns_of(pod.sandbox_id), target)
        flows.start(pod.name, node.netns_of(pod.sandbox_id), INET_HOST)

    def all_answering() -> bool | None:
        texts = [path.read_text(errors="replace") for path in pings.logs.values()]
        return True if all(" bytes from " in text for text in texts) else None

    wait_until(all_answering, "every ping answered once", 10.0)


def takeover_problems(node: VpcNode, pods: list[AwsPod]) -> list[str]:
    """Everything the takeover promised that is not so, read once it is complete."""
    problems = []
    held = allocations(node)
    for pod in pods:
        if held.get(key_of(pod.sandbox_id)) != [pod.address]:
            problems.append(
                f"{pod.name}: ipamd holds {held.get(key_of(pod.sandbox_id))}, "
                f"the checkpoint {pod.address}"
            )
    if mismatch := rules_mismatch(node):
        problems.append(f"ipamd's rules: {mismatch}")
    if left := untagged_rules(node, (PRIORITY_TO_POD, PRIORITY_FROM_POD)):
        problems.append(f"VPC CNI's rules at 512/1536 still there: {left}")
    if chains := snat_chains(node):
        problems.append(f"aws-node's chains still there: {sorted(chains)}")
    elif left_rules := aws_node_iptables(node):
        problems.append(f"aws-node's connmark rules still there: {left_rules}")
    if not node.ipamd_nft():
        problems.append("no `ip ipamd` nftables table")
    drops = node.sdc_drops()
    if set(drops.values()) - {0} or node.igw_drops():
        problems.append(f"source/destination check drops {drops}, gateway {node.igw_drops()}")
    return problems + conflist_problems(node)


def conflist_problems(node: VpcNode) -> list[str]:
    problems = []
    conf_dir = node.workdir / "net.d"
    if (conf_dir / AWS_CONFLIST).exists():
        problems.append(f"{AWS_CONFLIST} is still in the conf dir")
    ours = conf_dir / DEPLOYED_CONFLIST.name
    name = json.loads(ours.read_text()).get("name") if ours.exists() else None
    if name != NETWORK:
        problems.append(f"ipamd's conflist: {'absent' if name is None else f'network {name!r}'}")
    return problems


def ping_losses(pings: Pings, flows: FreshFlows, since: float) -> list[str]:
    losses = []
    for (source, target), log in sorted(pings.stop().items()):
        lost = log.lost_after(since)
        # The figure the takeover is judged by, for `pytest -s`: 0 lost after the first second.
        print(f"takeover pings {source} -> {target}: sent {log.sent}, lost after 1 s {len(lost)}")
        if log.sent < 2 or lost:
            losses.append(f"{source} → {target}: {len(lost)} of {log.sent} lost {lost[:20]}")
    flows.stop()
    for (source, target), unanswered in sorted(flows.lost_after(since).items()):
        probes = len(flows.probes[(source, target)])
        if probes < 2 or unanswered:
            times = [f"{at - since:+.2f} s" for at in unanswered[:20]]
            losses.append(
                f"{source} → {target}, new connections: {len(unanswered)} of {probes} "
                f"unanswered, started at {times} after the first second"
            )
    return losses


def test_ipamd_takes_over_a_node_from_aws_node(pause_image: Path) -> None:
    with contextlib.ExitStack() as stack:
        node = stack.enter_context(aws_vpc_node(pause_image))
        pings = stack.enter_context(contextlib.closing(Pings(node.workdir)))
        flows = stack.enter_context(contextlib.closing(FreshFlows()))
        aws, pods = prepare_aws_node(node)
        start_pings(node, pings, flows, pods)

        started = time.time()
        node.start_ipamd()
        node.wait_ipamd_ready()
        spare = {a for e in aws.enis for a in e.secondary_ips} - {p.address for p in pods}
        states = node.daemon.address_states()
        warm = {a: states.get(a) for a in sorted(spare) if states.get(a) != "cooling"}
        complete = within(TAKEOVER_DEADLINE_S, lambda: taken_over(node))
        time.sleep(SETTLE_S)  # the pings' window after the takeover, not an ordering
        losses = ping_losses(pings, flows, since=started + 1.0)
        problems = [] if complete else [f"takeover incomplete after {TAKEOVER_DEADLINE_S} s"]
        problems += takeover_problems(node, pods)
        problems += [f"lost pings: {loss}" for loss in losses]
        if warm:
            problems.append(f"spare addresses of adopting ENIs not cooling at ready: {warm}")
        assert not problems, "\n".join(problems)

        live = after_the_takeover(node, pods)

        assert node.daemon.stop() == 0, f"ipamd's exit on SIGTERM:\n{node.daemon.log_tail()}"
        written = read_vpc_cni_checkpoint(checkpoint_path(node))
        assert {k: str(e.get("ipv4")) for k, e in written.items()} == {
            key_of(p.sandbox_id): p.address for p in live
        }, f"the checkpoint aws-node would read: {written}"
        for pod in live:
            metadata = written[key_of(pod.sandbox_id)].get("metadata")
            assert isinstance(metadata, dict), written[key_of(pod.sandbox_id)]
            assert (metadata.get("k8sPodNamespace"), metadata.get("k8sPodName")) == (
                POD_NAMESPACE,
                pod.name,
            ), metadata

        # Started again, as the DaemonSet restarts it: the pods' DELs at clean-up reach it.
        node.start_ipamd()
        node.wait_ipamd_ready()


def after_the_takeover(node: VpcNode, pods: list[AwsPod]) -> list[AwsPod]:
    """A new pod through ipamd's conflist, an adopted pod removed; returns the pods then live."""
    sandbox_id = node.run_pod("after-0")
    held = allocations(node).get(key_of(sandbox_id))
    assert held is not None and len(held) == 1, f"ipamd's allocation of the new pod: {held}"
    fresh = AwsPod("after-0", sandbox_id, held[0], device_index=-1)  # ipamd's choice
    assert fresh.address not in {p.address for p in pods}, "a live pod's address handed out again"
    links = run(["ip", "-br", "-n", node.ns.node, "link", "show"])
    assert veth_name("eni", POD_NAMESPACE, fresh.name) in links, f"VPC CNI's veth name:\n{links}"
    failed = unreachable(node, [fresh], (VPC_HOST, INET_HOST))
    assert not failed, f"the new pod: {failed}"

    victim = next(p for p in pods if p.device_index == 1)
    removed_at = time.monotonic()
    node.remove_pod(victim.sandbox_id)
    assert key_of(victim.sandbox_id) not in allocations(node), "the DEL reached ipamd"
    assert time.monotonic() - removed_at < LEAK_GRACE_S, "released by the DEL, not the leak GC"
    left = [r for r in node.ipamd_rules() if host(victim.address) in (r.src, r.dst)]
    assert not left, f"rules of the removed pod: {left}"
    return [p for p in pods if p is not victim] + [fresh]


def test_a_malformed_or_foreign_checkpoint_is_logged_and_ignored(pause_image: Path) -> None:
    with aws_vpc_node(pause_image) as node:
        enis = create_enis(node, {0: 3})
        addresses = enis[0].secondary_ips
        path = checkpoint_path(node)
        path.parent.mkdir(parents=True, exist_ok=True)
        entry = {
            "networkName": NETWORK,
            "ifName": "eth0",
            "allocationTimestamp": time.time_ns(),
            "metadata": {"k8sPodNamespace": POD_NAMESPACE, "interfacesCount": 1},
        }
        foreign = {
            "version": "vpc-cni-ipam/2",
            "allocations": [
                {**entry, "containerID": f"{i:064x}", "ipv4": address}
                for i, address in enumerate(addresses, start=1)
            ],
        }
        for text in ('{"version": "vpc-cni-ipam/1", "allocations": [', json.dumps(foreign)):
            path.write_text(text)
            shutil.rmtree(node.workdir / "state", ignore_errors=True)  # a first start each time
            log_path = node.workdir / "ipamd.log"
            offset = log_path.stat().st_size if log_path.exists() else 0
            node.start_ipamd()
            node.wait_ipamd_ready()
            assert allocations(node) == {}, f"adopted from {text[:60]!r}"
            with log_path.open(errors="replace") as log_file:
                log_file.seek(offset)
                log = log_file.read()
            ignored = [line for line in log.splitlines() if IGNORED_EVENT in line]
            assert any(str(path) in line for line in ignored), f"not logged:\n{log[-3000:]}"
            assert node.daemon.stop() == 0, node.daemon.log_tail()
