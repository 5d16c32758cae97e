"""Pool sizing: pure functions that size the node's warm pool from the VPC CNI knobs.

`plan_pool(stats, targets, limits, strategy)` says which units and ENIs to add or give back; the
pool manager in `ipamd.engine` applies the plan through the EC2 port. The mode (secondary IPs or
/28 prefixes) is a `UnitStrategy` chosen once with `strategy_for`. Nothing here imports asyncio,
does I/O, or knows the engine, the datastore or the cloud adapters.
"""

from ipamd.sizing.inputs import EniStats, NodeLimits, NodeStats, PoolTargets, UnitStats
from ipamd.sizing.max_pods import MaxPods, MaxPodsRule, compute_node_max_pods
from ipamd.sizing.modes import PREFIXES, SECONDARY_IPS, UnitStrategy, strategy_for
from ipamd.sizing.plan import (
    PoolPlan,
    compute_max_pods,
    compute_pod_limit,
    compute_pod_limit_rule,
    effective_max_enis,
    plan_pool,
)
from ipamd.sizing.status import PoolStatus, compute_pool_status

__all__ = [
    "PREFIXES",
    "SECONDARY_IPS",
    "EniStats",
    "MaxPods",
    "MaxPodsRule",
    "NodeLimits",
    "NodeStats",
    "PoolPlan",
    "PoolStatus",
    "PoolTargets",
    "UnitStats",
    "UnitStrategy",
    "compute_max_pods",
    "compute_node_max_pods",
    "compute_pod_limit",
    "compute_pod_limit_rule",
    "compute_pool_status",
    "effective_max_enis",
    "plan_pool",
    "strategy_for",
]
