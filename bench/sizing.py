"""Pool policy cost: one `plan_pool` call on the largest prefix-mode node.

15 ENIs x 49 /28 prefixes x 16 = 11,760 addresses (a c5.18xlarge-like instance type, 50 IPv4 per
ENI) with 3,000 pods spread over every ENI, some addresses cooling, and WARM_PREFIX_TARGET=1. That
is the worst case for the planner: every unit is counted, and the hundreds of wholly free prefixes
above the target are each checked for release. Median of many calls, in milliseconds.

`ipv6_max_pods_m5large`: the max pods ipamd gives an m5.large in IPv6 mode, from the embedded EC2's
DescribeInstanceTypes answer read by the adapter (no fallback table) and an IPv6 configuration parsed
as the daemon parses it, through the rule the daemon applies (`compute_pod_limit`). EKS's calculator,
run as with prefix delegation, says 110.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

from bench.timing import median
from cloud.ec2 import Boto3Ec2, client_config
from cloud.embedded.world import EmbeddedEc2
from ipamd.config.settings import Config
from ipamd.node.engine_parts import describe_node, pool_targets
from ipamd.sizing import (
    PREFIXES,
    EniStats,
    NodeLimits,
    NodeStats,
    PoolTargets,
    UnitStats,
    compute_pod_limit,
    plan_pool,
    strategy_for,
)
from ipamd.sizing.max_pods import address_family

ENIS = 15
PREFIXES_PER_ENI = 49
PODS = 3_000
CALLS = 300
LIMITS = NodeLimits(max_enis=ENIS, units_per_eni=PREFIXES_PER_ENI)
TARGETS = PoolTargets(warm_prefix_target=1)


async def run(workdir: Path) -> dict[str, float]:
    stats = _node()
    plan = plan_pool(stats, TARGETS, LIMITS, PREFIXES)
    if not plan.release_units:
        raise RuntimeError(f"the benchmark node should have prefixes to release: {plan}")
    samples: list[float] = []
    for _ in range(CALLS):
        start = time.perf_counter()
        plan_pool(stats, TARGETS, LIMITS, PREFIXES)
        samples.append((time.perf_counter() - start) * 1000.0)
    return {
        "plan_ms_15eni_11760_ips": median(samples),
        "ipv6_max_pods_m5large": float(await _ipv6_max_pods("m5.large", workdir)),
    }


async def _ipv6_max_pods(instance_type: str, workdir: Path) -> int:
    """Max pods of `instance_type` in IPv6 mode, its limits read from the embedded EC2."""
    config = Config.from_env(
        {
            "ENABLE_IPv4": "false",
            "ENABLE_IPv6": "true",
            "ENABLE_PREFIX_DELEGATION": "true",
            "IPAMD_KUBELET_CONFIG": str(workdir / "no-kubelet-config.json"),
        }
    )
    with EmbeddedEc2() as host:
        world = host.world(instance_type)
        ec2 = Boto3Ec2(world.client(client_config()), rng=random.Random(1), fallback_limits={})
        node = await describe_node(ec2, world.instance_id)
    targets = pool_targets(config)
    strategy = strategy_for(config.sizing.enable_prefix_delegation)
    return compute_pod_limit(
        targets, node.limits, strategy, address_family(config.family.enable_ipv6)
    )


def _node() -> NodeStats:
    """Every ENI full of prefixes; pods dealt round-robin over the first 20 prefixes of each ENI,
    one address cooling in every seventh prefix."""
    per_eni_pods = PODS // ENIS
    enis: list[EniStats] = []
    for index in range(ENIS):
        units: list[UnitStats] = []
        left = per_eni_pods
        for p in range(PREFIXES_PER_ENI):
            assigned = min(left, 10) if p < 20 else 0
            left -= assigned
            cooling = 1 if p % 7 == 0 and assigned < 16 else 0
            units.append(UnitStats(f"10.{index}.{p}.0/28", 16, assigned, cooling))
        enis.append(EniStats(f"eni-{index:02d}", index, index == 0, 3600.0, tuple(units)))
    return NodeStats(tuple(enis))
