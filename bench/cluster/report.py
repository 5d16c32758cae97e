"""The figures of a cluster run: `name: value` lines (as `python -m bench` prints them) and the JSON
document the benchmark report reads."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.cluster.bound import Bound, PodTrace
from bench.cluster.front import AccountFront
from bench.cluster.sim import RunResult

HOUR_S = 3600.0
SERIES_POINTS = 240
"""Points of each run's pods-waiting series (the report's plot)."""


def percentile(values: Iterable[float], q: float) -> float:
    """The `q` quantile (0..1) by the nearest-rank method; 0 for no values."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 1))))
    return ordered[rank - 1]


def calls_per_node_hour(result: RunResult, throttled: bool = False) -> dict[str, float]:
    """Requests per node-hour of the window by operation: all of them, or the throttled ones."""
    node_hours = result.spec.nodes * result.window_s / HOUR_S
    if node_hours <= 0:
        return {}
    counts = result.throttled_by_operation if throttled else result.calls
    return {op: n / node_hours for op, n in sorted(counts.items())}


def measured(pods: Sequence[PodTrace], since_s: float, until_s: float) -> list[PodTrace]:
    """The pods a run's time-to-address figures count: those whose first ADD fell within the
    window and that got an address, or whose ADD was given up at its deadline."""
    return [
        p
        for p in pods
        if (p.address_s is not None or p.gave_up) and since_s <= p.first_add_s <= until_s
    ]


def _waited_s(pod: PodTrace) -> float:
    """From its first ADD to its address; for a pod given up, to its deadline (the least it
    would have waited: kubelet would have gone on asking)."""
    end = pod.address_s if pod.address_s is not None else pod.released_s
    assert end is not None, "a pod given up was released then"
    return end - pod.first_add_s


def times_to_address(result: RunResult) -> list[float]:
    return [_waited_s(p) for p in measured(result.pods.traces, result.since_s, result.until_s)]


def _bind_to_address_s(pod: PodTrace, deadline_s: float) -> float:
    """From its binding to its address (its ADD answered); for a pod given up, to its deadline."""
    assert pod.bound_s is not None
    end = pod.address_s if pod.address_s is not None else pod.first_add_s + deadline_s
    return end - pod.bound_s


def demand_metrics(result: RunResult) -> dict[str, float]:
    """What a pool that knows the pods on their way is judged by: time from binding to an answered
    ADD (where the run binds pods ahead of their ADD), addresses held per node in the window (every
    node at every sample), EC2 mutating calls per 1,000 pods measured."""
    out: dict[str, float] = {}
    pods = measured(result.pods.traces, result.since_s, result.until_s)
    if result.spec.pods.bind_to_add_median_s > 0:
        deadline_s = result.spec.pods.deadline_s
        waits = [_bind_to_address_s(p, deadline_s) for p in pods if p.bound_s is not None]
        out["bind_to_address_p50_s"] = percentile(waits, 0.50)
        out["bind_to_address_p99_s"] = percentile(waits, 0.99)
    held, using = result.node_addresses, result.node_pods
    if held:
        out["addresses_per_node_mean"] = sum(held) / len(held)
        out["addresses_per_node_p99"] = percentile(held, 0.99)
        out["pods_with_address_per_node_mean"] = sum(using) / max(len(using), 1)
    if pods:
        mutations = sum(n for op, n in result.calls.items() if AccountFront.mutating(op))
        out["mutating_calls_per_1000_pods"] = 1000.0 * mutations / len(pods)
    return out


def side_by_side(
    results: Mapping[str, tuple[RunResult, float]], base: str, other: str
) -> dict[str, float]:
    """`other` against `base` (the same pods, bound and deleted alike): its p99 from binding to an
    answered ADD and its mean addresses per node, each over `base`'s."""
    if base not in results or other not in results:
        return {}
    a, b = demand_metrics(results[base][0]), demand_metrics(results[other][0])
    out: dict[str, float] = {}
    for key, name in (
        ("bind_to_address_p99_s", "bind_to_address_p99"),
        ("addresses_per_node_mean", "addresses_per_node_mean"),
        ("mutating_calls_per_1000_pods", "mutating_calls_per_1000_pods"),
    ):
        if key in a and key in b:
            # Both 0: no worse. A base of 0 against more: infinitely worse, said as such.
            out[f"{other}_{name}_over_{base}"] = (
                b[key] / a[key] if a[key] else (1.0 if not b[key] else math.inf)
            )
    return out


def bound_metrics(result: RunResult, tta: list[float]) -> dict[str, float]:
    """The lower bound (`bench.cluster.bound`) beside the run's own figures. The ratios divide by
    the bound, or by the runtime's retry interval when the bound is 0 (every pod could have had
    its address at its first ADD; a pod that waited at all waited one retry at least)."""
    bound = result.bound
    if bound is None:
        return {}
    scale = max(bound.seconds, result.spec.pods.retry_s)
    mutations = sum(n for op, n in result.calls.items() if AccountFront.mutating(op))
    return {
        "time_to_address_lower_bound_s": bound.seconds,
        "time_to_address_p99_over_bound": percentile(tta, 0.99) / scale,
        "time_to_address_max_over_bound": max(tta, default=0.0) / scale,
        "mutating_calls": float(mutations),
        "bound_mutating_calls": float(bound.calls_between(result.since_s, result.until_s)),
    }


def metrics(result: RunResult, wall_s: float) -> dict[str, float]:
    pods = result.pods
    tta = times_to_address(result)
    return {
        "sim_hours": result.sim_s / HOUR_S,
        "window_hours": result.window_s / HOUR_S,
        "wall_s": wall_s,
        "cpu_s": result.cpu_s,
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
        "add_failed": float(pods.failed_no_address + pods.failed_invariant + pods.failed_local),
        "add_failed_no_address": float(pods.failed_no_address),
        "add_failed_no_address_ec2_budget": float(pods.failed_ec2_budget),
        "add_failed_invariant": float(pods.failed_invariant),
        "add_failed_local_error": float(pods.failed_local),
        "add_errors": float(sum(pods.add_errors.values())),
        "local_errors": float(result.local_errors),
        "pods_measured": float(len(tta)),
        "time_to_address_p50_s": percentile(tta, 0.50),
        "time_to_address_p99_s": percentile(tta, 0.99),
        "time_to_address_max_s": max(tta, default=0.0),
        **bound_metrics(result, tta),
        **demand_metrics(result),
        "invariant_checkpoints": float(result.checkpoints),
        "invariant_violations": float(result.violations),
        "enis_awaiting_eni_gc": float(result.awaiting_eni_gc),
        "descriptors_per_node": result.descriptors_per_node,
        "rss_mib_per_node": result.rss_mib_per_node,
        "peak_rss_mib": result.peak_rss_mib,
        "state_mib_per_node": result.state_mib_per_node,
        **result.extra,
    }


def lines(prefix: str, name: str, result: RunResult, wall_s: float) -> list[str]:
    out = [f"{prefix}_{name}_{key}: {value:.3f}" for key, value in metrics(result, wall_s).items()]
    out += [
        f"{prefix}_{name}_ec2_calls_per_node_hour_{op}: {value:.3f}"
        for op, value in calls_per_node_hour(result).items()
    ]
    out += [
        f"{prefix}_{name}_ec2_throttled_per_node_hour_{op}: {value:.3f}"
        for op, value in calls_per_node_hour(result, throttled=True).items()
    ]
    return out


def document(
    nodes: int,
    results: dict[str, tuple[RunResult, float]],
    wall_s: float | None = None,
    context: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON the benchmark report reads; `wall_s` is the whole command's (its runs side by side),
    `context` what the command says of where and when it ran (its date, the machine's load)."""
    series: dict[str, Any] = {}
    for result, _ in results.values():
        if not result.spec.burst_pods and not result.spec.churn_per_hour:
            mode = "prefix" if result.spec.prefix else "ip"
            series.setdefault(mode, [list(s) for s in result.series])
    budget = next((r.spec.budget for r, _ in results.values()), None)
    return {
        **(context or {}),
        "nodes": nodes,
        "wall_s": wall_s,
        "budget": {} if budget is None else asdict(budget),
        "runs": {name: metrics(r, wall) for name, (r, wall) in results.items()},
        "calls_per_node_hour": {name: calls_per_node_hour(r) for name, (r, _) in results.items()},
        "throttled_per_node_hour": {
            name: calls_per_node_hour(r, throttled=True) for name, (r, _) in results.items()
        },
        "add_errors": {name: dict(r.pods.add_errors) for name, (r, _) in results.items()},
        "problems": {name: r.problems for name, (r, _) in results.items()},
        "pool_series": series,
        "waiting_series": {
            name: waiting_series(r.pods.traces, r.bound, r.since_s, r.until_s)
            for name, (r, _) in results.items()
            if r.bound is not None
        },
    }


def write_json(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def waiting_series(
    pods: Sequence[PodTrace], bound: Bound, since_s: float, until_s: float
) -> list[tuple[float, int, int]]:
    """(seconds into the window, pods waiting for an address in the run, pods the bound's
    schedule leaves waiting) at `SERIES_POINTS` instants. A pod of the run waits from its first
    ADD until it has an address or leaves; under the bound's schedule a node has as many waiting
    as it has pods beyond the addresses of its steps done by then."""
    run: list[tuple[float, str, int, int]] = []
    best: list[tuple[float, str, int, int]] = []
    for pod in pods:
        end = pod.address_s if pod.address_s is not None else pod.released_s
        if end is None or end > pod.first_add_s:
            run.append((pod.first_add_s, "", 1, 0))
            run.append((math.inf if end is None else end, "", -1, 0))
        best.append((pod.first_add_s, pod.node, 1, 0))
        if pod.released_s is not None:
            best.append((pod.released_s, pod.node, -1, 0))
    for step, done in zip(bound.steps, bound.done_s, strict=True):
        best.append((done, step.node, 0, step.addresses))
    step_s = max((until_s - since_s) / SERIES_POINTS, 1.0)
    times = [since_s + n * step_s for n in range(int((until_s - since_s) / step_s) + 1)]
    counts = [_waiting_at(sorted(events), times) for events in (run, best)]
    return [(round(t - since_s, 3), a, b) for t, a, b in zip(times, *counts, strict=True)]


def _waiting_at(events: Sequence[tuple[float, str, int, int]], times: Sequence[float]) -> list[int]:
    """Pods beyond the addresses, summed over nodes, at each of `times` (ascending)."""
    pods: dict[str, int] = {}
    addresses: dict[str, int] = {}
    total, k = 0, 0
    out: list[int] = []
    for t in times:
        while k < len(events) and events[k][0] <= t:
            _, node, dp, da = events[k]
            before = max(pods.get(node, 0) - addresses.get(node, 0), 0)
            pods[node] = pods.get(node, 0) + dp
            addresses[node] = addresses.get(node, 0) + da
            total += max(pods[node] - addresses[node], 0) - before
            k += 1
        out.append(total)
    return out
