"""`python -m bench.cluster`: the cluster simulator's runs, `name: value` lines on stdout (progress on
stderr), and with `--json PATH` the document the benchmark report reads.

Runs (all on m5.large nodes with VPC CNI's defaults, WARM_ENI_TARGET=1, and EC2's documented API
budget; `--runs` picks some):

- `steady`: IP mode, ~15 pods per node with 30-minute mean lifetimes, 1 % of DELs missed, measured
  for `--hours` after a 10-minute ramp; the cluster is built (nodes joining, the ramp) with the
  account's budget not metered, and the budget applies from the measured window on
  (`RunSpec.build_unmetered`: the window is the grown cluster's steady state, not its growth,
  which at thousands of nodes the default budget spreads over hours); the figures count the pods
  whose first ADD came after the ramp;
- `burst_<P>_pods`: P pods (10 per node by default: 5,000 at 500 nodes) scheduled within a minute
  onto an idle, warm cluster and kept; it ends when every pod has its address (or its deadline);
- `steady_prefix`: the steady run in prefix mode (WARM_PREFIX_TARGET=1), for half of `--hours`;
- `churn`: the steady run while 20 % of the nodes an hour are terminated and replaced (under the
  budget, in the window), for half of `--hours`;
- `subnet_takeover`: at most 100 nodes share a subnet that runs dry and a tagged pod subnet takes
  over, the steady workload at 12 pods per node (`bench.cluster.subnets_run`);
- `bound_warm_pool` and `bound_pod_aware`: the steady run for half of `--hours` with each pod bound
  to its node a while before its ADD (the kubelet's sync of the new pod: log-normal, median 2 s,
  sigma 0.8, `workload.PodSettings`), the same pods in both: VPC CNI's default warm pool, then the
  pod-aware pool (IPAMD_POD_AWARE_POOL=on, fed the pods bound and not yet answered, as the API's pod
  watch feeds it) with every warm target at 0. Side by side: the p99 from binding to an answered
  ADD, addresses per node and EC2 mutating calls per 1,000 pods, the second over the first
  (`<prefix>_bound_pod_aware_<figure>_over_bound_warm_pool`).

Up to 500 nodes the default is all five; above, `steady` and `burst` (how the one account's budget
bears a larger cluster; the others are measured at 500 or fewer).

The runs are independent (each has an account, an event loop and nodes of its own), so they run in
`--jobs` worker processes at once, one per CPU by default; each run's figures are printed as it ends,
and the `wall_s` of each is its own.

Before anything runs, the soft limit on open files is raised to the hard limit; if that cannot hold
the nodes asked for (`bench.cluster.limits`: 3 descriptors a node), the command says so and exits 2.
A run stopped by a local error prints why on stderr and none of its figures; the others go on, and
the command exits 1.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from bench.cluster import limits
from bench.cluster.front import Ec2Budget
from bench.cluster.parallel import RunFailed, run_all, say
from bench.cluster.report import document, lines, side_by_side, write_json
from bench.cluster.sim import POD_AWARE, RunResult, RunSpec
from bench.cluster.subnets_run import takeover_spec
from bench.cluster.workload import PodSettings

NODES_ENV = "IPAMD_BENCH_NODES"
DEFAULT_NODES = 500
DEFAULT_HOURS = 1.0
"""Measured cluster hours of the steady run (churn and prefix mode: half)."""
RUN_KINDS = (
    "steady",
    "burst",
    "steady_prefix",
    "churn",
    "subnet_takeover",
    "bound_warm_pool",
    "bound_pod_aware",
)
DEFAULT_RUNS = RUN_KINDS
BIND_TO_ADD_MEDIAN_S = 2.0
LARGE_RUNS = ("steady", "burst")
"""The default runs above `DEFAULT_NODES` nodes."""


def specs(
    nodes: int, hours: float, burst_pods: int, seed: int, budget: Ec2Budget
) -> dict[str, RunSpec]:
    base = RunSpec("steady", nodes, measure_s=hours * 3600, budget=budget, seed=seed)
    grown = replace(base, build_unmetered=True)
    bound_first = replace(
        grown,
        name="bound_warm_pool",
        measure_s=hours * 1800,
        pods=PodSettings(bind_to_add_median_s=BIND_TO_ADD_MEDIAN_S),
        seed=seed + 5,
    )
    return {
        "steady": grown,
        "burst": replace(
            base, name=f"burst_{burst_pods}_pods", burst_pods=burst_pods, seed=seed + 1
        ),
        "churn": replace(
            grown, name="churn", measure_s=hours * 1800, churn_per_hour=0.2, seed=seed + 2
        ),
        "steady_prefix": replace(
            grown, name="steady_prefix", prefix=True, measure_s=hours * 1800, seed=seed + 3
        ),
        "subnet_takeover": takeover_spec(replace(base, seed=seed + 4), nodes),
        "bound_warm_pool": bound_first,
        "bound_pod_aware": replace(bound_first, name="bound_pod_aware", settings=POD_AWARE),
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.cluster",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    default_nodes = int(os.environ.get(NODES_ENV) or DEFAULT_NODES)
    parser.add_argument(
        "--nodes",
        type=int,
        default=default_nodes,
        help=f"cluster size (default ${NODES_ENV}, else {DEFAULT_NODES})",
    )
    parser.add_argument(
        "--hours",
        type=float,
        default=DEFAULT_HOURS,
        help="measured cluster hours of the steady run (churn and prefix: half)",
    )
    parser.add_argument("--burst-pods", type=int, default=None, help="default: 10 per node")
    parser.add_argument(
        "--runs",
        default=None,
        help=f"comma-separated subset of {','.join(RUN_KINDS)} (default: all up to "
        f"{DEFAULT_NODES} nodes, {','.join(LARGE_RUNS)} above)",
    )
    parser.add_argument("--no-throttling", action="store_true", help="an unlimited EC2 account")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="runs at once, each in a worker process (default: one per CPU, at most one per run; "
        "1: one after another in this process)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.runs is None:
        args.runs = ",".join(DEFAULT_RUNS if args.nodes <= DEFAULT_NODES else LARGE_RUNS)
    unknown = set(args.runs.split(",")) - set(RUN_KINDS)
    if unknown:
        parser.error(f"unknown runs: {', '.join(sorted(unknown))}")
    if args.jobs is not None and args.jobs < 1:
        parser.error(f"--jobs must be at least 1: {args.jobs}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    budget = Ec2Budget(throttling=not args.no_throttling)
    burst_pods = args.burst_pods if args.burst_pods is not None else 10 * args.nodes
    every = specs(args.nodes, args.hours, burst_pods, args.seed, budget)
    chosen = {kind: every[kind] for kind in args.runs.split(",")}
    try:
        limits.ensure_descriptors(max(spec.nodes for spec in chosen.values()))
    except limits.TooFewDescriptors as err:
        say(f"refused: {err}")
        raise SystemExit(2) from None
    jobs = args.jobs or min(os.cpu_count() or 1, len(chosen))
    prefix = f"bench_cluster_{args.nodes}_nodes"
    done: dict[str, tuple[RunResult, float]] = {}
    failed: list[str] = []
    started = time.perf_counter()
    load_before = _load()
    for name, result, wall_s in run_all(chosen, jobs):
        if isinstance(result, RunFailed):
            say(f"{name}: FAILED after {wall_s:.0f} s: {result.reason}")
            failed.append(name)
            continue
        done[name] = (result, wall_s)
        for line in lines(prefix, name, result, wall_s):
            print(line, flush=True)
        for problem in result.problems:
            say(f"{name}: VIOLATION {problem}")
    if failed:
        say(f"FAILED on a local error: {', '.join(failed)} (no figures printed for it)")
        raise SystemExit(1)
    results = {spec.name: done[spec.name] for spec in chosen.values()}
    total_violations = sum(r.violations for r, _ in results.values())
    for name, value in side_by_side(results, "bound_warm_pool", "bound_pod_aware").items():
        print(f"{prefix}_{name}: {value:.3f}")
    print(f"{prefix}_invariant_violations: {total_violations:.3f}")
    print(f"{prefix}_throttled_calls: {sum(r.throttled_total for r, _ in results.values()):.3f}")
    wall_s = time.perf_counter() - started
    print(f"{prefix}_wall_s: {wall_s:.3f}", flush=True)
    if args.json is not None:
        context = {
            "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "cpus": os.cpu_count(),
            "load_average": {"start": load_before, "end": _load()},
        }
        write_json(args.json, document(args.nodes, results, wall_s, context))


def _load() -> float | None:
    """The machine's load average over the last minute (None where it cannot be read)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


if __name__ == "__main__":
    main()
