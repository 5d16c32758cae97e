"""The figures of a cluster run: `name: value` lines (as `python -m bench` prints them) and the JSON
document the benchmark report reads."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bench.cluster.sim import RunResult

HOUR_S = 3600.0


def percentile(values: Iterable[float], q: float) -> float:
    """The `q` quantile (0..1) by the nearest-rank method; 0 for no values."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 1))))
    return ordered[rank - 1]


def calls_per_node_hour(result: RunResult) -> dict[str, float]:
    node_hours = result.spec.nodes * result.window_s / HOUR_S
    if node_hours <= 0:
        return {}
    return {op: n / node_hours for op, n in sorted(result.calls.items())}


def metrics(result: RunResult, wall_s: float) -> dict[str, float]:
    pods = result.pods
    tta = pods.time_to_address_s
    return {
        "sim_hours": result.sim_s / HOUR_S,
        "window_hours": result.window_s / HOUR_S,
        "wall_s": wall_s,
        "ec2_calls_per_node_hour": sum(calls_per_node_hour(result).values()),
        "throttled_calls": float(result.throttled),
        "throttled_calls_whole_run": float(result.throttled_total),
        "client_retries": float(result.client_retries),
        "pool_failures": float(result.pool_failures),
        "job_failures": float(result.job_failures),
        "pods_scheduled": float(pods.scheduled),
        "pods_unschedulable": float(pods.unschedulable),
        "pods_deleted": float(pods.deleted),
        "missed_dels": float(pods.missed_dels),
        "nodes_replaced": float(result.nodes_replaced),
        "add_failed_no_address": float(pods.failed_no_address),
        "add_errors": float(sum(pods.add_errors.values())),
        "time_to_address_p50_s": percentile(tta, 0.50),
        "time_to_address_p99_s": percentile(tta, 0.99),
        "time_to_address_max_s": max(tta, default=0.0),
        "invariant_checkpoints": float(result.checkpoints),
        "invariant_violations": float(result.violations),
        "enis_awaiting_eni_gc": float(result.awaiting_eni_gc),
        **result.extra,
    }


def lines(prefix: str, name: str, result: RunResult, wall_s: float) -> list[str]:
    out = [f"{prefix}_{name}_{key}: {value:.3f}" for key, value in metrics(result, wall_s).items()]
    out += [
        f"{prefix}_{name}_ec2_calls_per_node_hour_{op}: {value:.3f}"
        for op, value in calls_per_node_hour(result).items()
    ]
    return out


def document(nodes: int, results: dict[str, tuple[RunResult, float]]) -> dict[str, Any]:
    series: dict[str, Any] = {}
    for result, _ in results.values():
        if not result.spec.burst_pods and not result.spec.churn_per_hour:
            mode = "prefix" if result.spec.prefix else "ip"
            series.setdefault(mode, [list(s) for s in result.series])
    return {
        "nodes": nodes,
        "runs": {name: metrics(r, wall) for name, (r, wall) in results.items()},
        "calls_per_node_hour": {name: calls_per_node_hour(r) for name, (r, _) in results.items()},
        "add_errors": {name: dict(r.pods.add_errors) for name, (r, _) in results.items()},
        "problems": {name: r.problems for name, (r, _) in results.items()},
        "pool_series": series,
    }


def write_json(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
