"""EC2 calls the pool costs, counted on the embedded EC2 (every attempt the adapter makes):
to fill an m5.large from empty in each mode, to add one ENI with its addresses once pods used the
pool up (`ec2_calls_per_new_eni`, `ec2_mutations_per_new_eni`: CreateNetworkInterface carrying the
addresses, the attach and DeleteOnTermination, and for this first ENI since start-up one listing of
the device indexes in use; no assign), and the mutations
behind 1,000 pod churn events with WARM_IP_TARGET=5 and MINIMUM_IP_TARGET=10 (VPC CNI's docs warn
these knobs drive EC2 call volume)."""

from __future__ import annotations

import random
from pathlib import Path

from bench.node import pod_key
from cloud.embedded.world import EmbeddedEc2
from ipamd.errors import NoAddressAvailable
from ipamd.node.cloud_node import CloudNode, open_cloud_node
from ipamd.pool.enis import BIND_SETTLE_S
from ipamd.sizing.inputs import PoolTargets

MUTATIONS = frozenset(
    {
        "AssignPrivateIpAddresses",
        "UnassignPrivateIpAddresses",
        "CreateNetworkInterface",
        "AttachNetworkInterface",
        "ModifyNetworkInterfaceAttribute",
        "DetachNetworkInterface",
        "DeleteNetworkInterface",
    }
)
CHURN_EVENTS = 1_000


async def run(workdir: Path) -> dict[str, float]:
    with EmbeddedEc2() as host:
        ip_fill = await _fill_calls(host, workdir / "ip", prefix_mode=False)
        prefix_fill = await _fill_calls(host, workdir / "prefix", prefix_mode=True)
        eni_calls, eni_mutations = await _new_eni_calls(host, workdir / "eni")
        churn = await _churn_mutations(host, workdir / "churn")
    return {
        "ec2_calls_fill_m5large_ip_mode": ip_fill,
        "ec2_calls_fill_m5large_prefix_mode": prefix_fill,
        "ec2_calls_per_new_eni": eni_calls,
        "ec2_mutations_per_new_eni": eni_mutations,
        "ec2_mutations_per_1000_pod_churn": churn,
    }


async def _fill_calls(host: EmbeddedEc2, workdir: Path, prefix_mode: bool) -> float:
    # Counted from the first Describe of the node (adopting its ENIs) to the pool at its targets;
    # the one-off DescribeInstances/DescribeInstanceTypes of start-up are included.
    async with open_cloud_node(host, workdir, "m5.large", prefix_mode=prefix_mode) as node:
        await node.settle()
        return float(sum(node.calls.counts.values()))


async def _new_eni_calls(host: EmbeddedEc2, workdir: Path) -> tuple[float, float]:
    """The round that adds the warm ENI once pods took the primary ENI's 9 addresses, and the
    later round that sets its DeleteOnTermination."""
    async with open_cloud_node(host, workdir, "m5.large") as node:
        await node.settle()
        for n in range(9):
            await node.engine.assign(pod_key("pod", n))
        enis = len(node.engine.state.enis())
        calls, mutations = sum(node.calls.counts.values()), _mutations(node)
        await node.pool.run_once()
        if len(node.engine.state.enis()) != enis + 1:
            raise RuntimeError("the round added no ENI")
        node.clock.advance(BIND_SETTLE_S)  # its DeleteOnTermination goes in a later, quiet round
        await node.pool.run_once()
        if node.pool.unbound_enis:
            raise RuntimeError("DeleteOnTermination was not set")
        return float(sum(node.calls.counts.values()) - calls), float(_mutations(node) - mutations)


async def _churn_mutations(host: EmbeddedEc2, workdir: Path) -> float:
    targets = PoolTargets(warm_ip_target=5, minimum_ip_target=10, min_eni_lifetime_s=0)
    async with open_cloud_node(host, workdir, "m5.large", targets=targets) as node:
        await node.settle()
        before = _mutations(node)
        rng = random.Random(5)
        live: list[int] = []
        for event in range(CHURN_EVENTS):
            # A random walk around 15 pods, as a node running a busy batch workload sees.
            if live and (len(live) > 20 or rng.random() < 0.5):
                await node.engine.release(pod_key("churn", live.pop(rng.randrange(len(live)))))
            else:
                try:
                    await node.engine.assign(pod_key("churn", event))
                    live.append(event)
                except NoAddressAvailable:
                    pass
            node.clock.advance(rng.uniform(1, 10))
            await node.pool.run_once()
        return float(_mutations(node) - before)


def _mutations(node: CloudNode) -> int:
    return sum(n for (op, _), n in node.calls.counts.items() if op in MUTATIONS)
