"""What the daemon reports of itself beyond the engine's snapshot: the knobs, limits and max-pods
rule `GET /v1/pool` and introspection show, and the sources the metrics endpoint reads. Read-only:
nothing here changes a part."""

from __future__ import annotations

from ipamd.errors import utc_text
from ipamd.netpolicy.enforcement import NetworkPolicy
from ipamd.node.daemon import Daemon
from ipamd.sizing.plan import compute_pod_limit_rule
from ipamd.telemetry.metrics import Sources


def pool_report(daemon: Daemon) -> dict[str, object]:
    """The knobs and limits `GET /v1/pool` reports beside the counts (`ipamctl status`), with the
    rule that set max pods (the same pure rule the daemon's parts applied)."""
    targets, limits, pool = daemon.parts.targets, daemon.parts.node.limits, daemon.pool.report()
    return {
        # IPv6 mode's one /80 follows none of the targets below (docs/configuration.md).
        "mode": daemon.parts.family.pool_mode(pool.strategy.kind),
        "targets": {
            "WARM_ENI_TARGET": targets.warm_eni_target,
            "WARM_IP_TARGET": targets.warm_ip_target,
            "MINIMUM_IP_TARGET": targets.minimum_ip_target,
            "WARM_PREFIX_TARGET": targets.warm_prefix_target,
        },
        "limits": {
            "max_enis": limits.max_enis,
            "units_per_eni": limits.units_per_eni,
            **max_pods_report(daemon),
        },
        "subnets": {
            "free_addresses": pool.subnet_free,
            "scarce": pool.scarce,
            "prefix_fallback": pool.prefix_fallback,
        },
        "last_failure": last_failure(daemon),
        "ready": daemon.ready,
        "not_ready": daemon.not_ready or None,
        "degraded": list(daemon.degraded()),
        "in_force": in_force(daemon),
        "spare": spare(daemon),
    }


def in_force(daemon: Daemon) -> dict[str, object]:
    """Which warm targets the pool follows, and which it ignores and why, as the node's family
    says (`ipamd.node.family`)."""
    return daemon.parts.family.in_force(lambda: _targets_in_force(daemon))


def _targets_in_force(daemon: Daemon) -> dict[str, object]:
    """VPC CNI's rules: either IP target > 0 overrides the ENI and prefix targets; the other
    mode's target has no effect."""
    targets, strategy = daemon.pool.targets(), daemon.pool.report().strategy
    goal = strategy.goal_for(targets, daemon.parts.node.limits).name
    ignored: dict[str, str] = {}
    if goal == "pods":
        used = ["IPAMD_POD_AWARE_POOL"]
        why = "0 with a pod-aware pool: it keeps addresses for the pods bound here alone"
        ignored = {"WARM_ENI_TARGET": why, "WARM_PREFIX_TARGET": why}
    elif goal == "warm_ip":
        used = ["WARM_IP_TARGET", "MINIMUM_IP_TARGET"]
        why = "WARM_IP_TARGET or MINIMUM_IP_TARGET is set, which overrides it"
        ignored = {"WARM_ENI_TARGET": why, "WARM_PREFIX_TARGET": why}
    elif goal == "warm_prefix":
        used = ["WARM_PREFIX_TARGET"]
        ignored = {"WARM_ENI_TARGET": "prefix mode follows WARM_PREFIX_TARGET"}
    else:
        used = ["WARM_ENI_TARGET"]
        ignored = {"WARM_PREFIX_TARGET": "it applies in prefix mode only"}
    return {"goal": goal, "targets": used, "ignored": ignored}


def spare(daemon: Daemon) -> dict[str, object]:
    """What the pool would give back and keeps for now (IPAMD_RELEASE_DELAY, the shrink
    interval), and when the first of it may go."""
    waiting, at = daemon.pool.conditions.spare()
    return {"waiting": waiting, "release_at": utc_text(at) if at is not None else None}


def last_failure(daemon: Daemon) -> dict[str, object] | None:
    """The pool's last failed round (None if none failed): EC2's words, when, whether it is final
    (EC2 will refuse again until someone changes something) and still standing, and when the next
    round may run."""
    h = daemon.pool.health
    if h.last_error_at is None:
        return None
    return {
        "error": h.last_error,
        "at": utc_text(h.last_error_at),
        "blocking": bool(h.blocked),
        "next_try_at": utc_text(h.next_try_at) if h.next_try_at is not None else None,
    }


def max_pods_report(daemon: Daemon) -> dict[str, object]:
    """The node's max pods, the rule that set it (the same pure rule the daemon's parts applied),
    why, and what the kubelet's config said."""
    parts = daemon.parts
    family = daemon.parts.family.name
    strategy = daemon.pool.report().strategy
    rule = compute_pod_limit_rule(parts.targets, parts.node.limits, strategy, family)
    kubelet = daemon.config.sizing.kubelet_config
    return {
        "max_pods": daemon.engine.settings.max_pods,
        "max_pods_rule": str(rule.rule),
        "max_pods_reason": rule.reason,
        "kubelet_config": kubelet.describe() if kubelet else "not read",
    }


def actions_in_progress(daemon: Daemon) -> dict[str, int]:
    """VPC CNI's `awscni_ipamd_action_inprogress` as far as ipamd's parts show it: start-up until
    ready (not while refusing an unusable state file), an ENI being created or attached, units
    or ENIs being returned to EC2."""
    starting, pool = not daemon.ready and daemon.engine.unavailable is None, daemon.pool.report()
    return {
        "nodeInit": int(starting),
        "increaseDatastorePool": int(pool.creating_enis),
        "decreaseDatastorePool": int(pool.releasing),
    }


def metric_sources(daemon: Daemon, policy: NetworkPolicy) -> Sources:
    """What the metrics endpoint reads of the daemon's parts, each read when scraped."""
    limits = daemon.parts.node.limits
    marking = daemon.datapath is not None and daemon.datapath.marks_connections
    return Sources(
        snapshot=daemon.engine.snapshot,
        max_enis=limits.max_enis,
        max_addresses=daemon.engine.settings.max_pods or 0,
        max_pods_rule=str(max_pods_report(daemon)["max_pods_rule"]),
        job_outcomes=lambda: daemon.jobs.outcomes,
        leaks_released=lambda: daemon.leak_gc.released,
        pool_failures=lambda: daemon.pool.report().errors_by_code,
        subnet_free=lambda: daemon.pool.report().subnet_free,
        subnet_scarce=lambda: daemon.pool.report().scarce,
        pool_blocked=daemon.pool.blocked_by,
        prefix_fallback=lambda: daemon.pool.report().prefix_fallback,
        hostnet_fixes=lambda: daemon.datapath.health.fixes if daemon.datapath else {},
        hostnet_add_failures=lambda: daemon.datapath.health.add_failures if daemon.datapath else 0,
        hostnet_reconciles=lambda: daemon.datapath.health.reconciles if daemon.datapath else {},
        actions_in_progress=lambda: actions_in_progress(daemon),
        connmark_backend="nftables" if marking else "",
        rp_filter_strict=lambda: bool(daemon.datapath and daemon.datapath.health.rp_filter_strict),
        network_policy_calls=lambda: policy.calls,
        network_policy_enforced=policy.applies,
    )
