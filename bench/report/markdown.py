"""`docs/benchmarks.md` from the figures of one `make report` run: plain tables, the plots beside."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TARGETS: Mapping[str, float] = {
    "engine_add_p50_ms": 1.0,
    "engine_add_p50_ms_ipv6": 1.0,
    "engine_add_ipv6_over_ipv4": 1.5,
    "engine_del_p50_ms": 1.0,
    "del_intent_cost_ratio": 1.5,
    "restore_ms_250_alloc_86400_intents": 500.0,
    "plan_ms_15eni_11760_ips": 5.0,
    "reconcile_cpu_ms_11760_ips": 50.0,
    "ec2_describe_per_node_hour_steady": 15.0,
    "describe_subnets_per_node_hour": 2.0,
    "api_add_del_p50_ms": 2.0,
    "api_add_del_p99_ms": 10.0,
    "api_add_del_p99_ms_32_clients": 50.0,
    "api_add_del_over_socket_floor": 25.0,
    "hostnet_add_overhead_over_netlink_floor": 3.0,
    "cni_plugin_start_ratio": 2.0,
    "cni_pod_add_over_ipam_add": 1.5,
    "daemon_rss_mib_250_pods": 120.0,
    "daemon_rss_mib_api_delta": 15.0,
    "takeover_ms_250_pods": 2000.0,
    "takeover_over_plain_start": 1.5,
    "cni_burst_30_pods_p50_ms": 250.0,
    "cni_burst_30_over_cpu_floor": 1.5,
}
"""Upper bounds the project holds itself to (see `bench/` module docstrings)."""

MINIMUMS: Mapping[str, float] = {
    "api_pairs_per_s": 1000.0,
    "api_requests_node_scoped": 1.0,
    "pool_ready_before_add": 0.95,
}
"""Lower bounds, likewise."""


CLUSTER_TARGETS = (
    "Targets at 500 nodes (`make bench-cluster`): the burst's time_to_address_p99_over_bound "
    "≤ 1.5, the steady run's time_to_address_p99_s ≤ 30; in every run 0 add_failed_no_address "
    "and 0 invariant_violations. The time-to-address figures count the pods whose first ADD fell "
    "in the run's measured window (after the ramp in steady runs)."
)

BOUND_MODEL = """### The lower bound on time to address

`time_to_address_lower_bound_s` is the least longest time to address that any node-local pool \
policy obeying the same targets could have had on the run's workload under the run's EC2 API \
budget (`bench/cluster/bound.py`). `time_to_address_p99_over_bound` is the run's p99 over it and \
`time_to_address_max_over_bound` its longest over it, which no such policy, ipamd included, \
can bring below 1; when the bound is 0 (no pod need have waited) both divide by one retry interval of \
the runtime (10 s), the least a pod that waited at all waited. `bound_mutating_calls` is what \
the targets' asks in the window cost at least, beside ipamd's `mutating_calls` (every request, \
throttled ones included).

What is counted:

- **The workload as it happened.** Each pod wants an address on its node from its first ADD \
until it left (its DEL, its ADD given up, or its node terminated), as in the run; nodes join \
when their ipamd started. The runtime retries a refused ADD every 10 s, as kubelet retries a \
pod whose sandbox failed (its pod worker's 10 s backoff; kubelet adds up to half of it again as \
jitter, which would only lengthen the waits, so the simulator leaves it out and every pod's tries \
fall 10 s apart from its first ADD). One within 10 s \
of its node's last refusal, with no commit, no change in the ENIs held back and no address out \
of its cooldown since, is refused without asking the engine, whose answer would be the same, \
and the node wakes a waiting pod only at the first of its own retry instants at which the answer \
may differ: `bench/cluster/waiting.py`).
- **Steps, from the targets.** A policy obeying the targets asks for addresses only when the \
targets (WARM_ENI_TARGET, WARM_IP_TARGET, MINIMUM_IP_TARGET, WARM_PREFIX_TARGET, MAX_ENI, max \
pods, the instance type's limits, read by ipamd's own planner `ipamd.policy.plan_pool`) find the \
pool short, with every pod the node has had at once counted, waiting ones included, and nothing \
given back. Each ask is a step, released when the targets first allow it, and costs the fewest \
mutating calls that deliver it: one AssignPrivateIpAddresses for units on an ENI the node has; \
one CreateNetworkInterface carrying the units and one AttachNetworkInterface for a new ENI.
- **When a step is due.** Step k of a node is due when the node's pods first outnumber the \
addresses of its steps before k. From then one of the w pods beyond those addresses waits until \
step k is done or w pods have left the node (the step's relief).
- **The budget.** Every call takes a token from the run's buckets (same sizes, refill and \
per-action split, full at the start) and is answered after the mutating latency (0.3 s); a step \
is done when its last call is answered, and no sooner than its calls one after another.

The bound is the least T, in whole retry intervals (a pod is served at one of its tries), \
such that every step due in the measured window \
whose relief comes later than due + T is done by due + T, with each node's steps done in order. \
To decide whether a T is possible, tokens go, as soon as the buckets hold them, to the waiting \
call with the earliest deadline: that meets every deadline whenever any schedule does, since \
tokens are alike and one left in the bucket is never worth more later (Jackson's rule).

Why it is a lower bound: take any node-local policy obeying the targets, and T its longest time \
to address on this workload and budget. At each step's due time the node has more pods than the \
addresses of the steps before it, and the policy holds no more than the targets let it ask for; \
so unless the step's relief comes first, some pod waits until the policy has done that step's \
worth of asks, which it therefore does by due + T. It pays at least the fewest calls for each, \
from the same buckets, each answered only after the latency: its calls are a schedule meeting \
the deadlines for T, which the bound found impossible for any T below it.

Assumptions, each on the policy's side: a node's steps are done in the order the targets ask \
for them (with the default targets each is one ENI or one prefix, and the earlier never costs \
more); arrivals and departures are the run's; reads (Describe*), client-side buckets, refused \
requests, backoff, releases and the IP cooldown cost the policy nothing. The bound leaves out \
what ipamd adds for safety (ModifyNetworkInterfaceAttribute for DeleteOnTermination, which ipamd \
sets as background work a minute or more after the ENI's addresses can be handed out) and the \
requests EC2 refused, \
which is why ipamd's own calls can be several times the bound's.
"""


@dataclass(frozen=True, slots=True)
class Figures:
    machine: str
    bench: Mapping[str, float]
    del_p50_ms_by_intents: Sequence[tuple[int, float]]
    cluster: Mapping[str, Any]
    """The JSON of the largest short cluster run (`python -m bench.cluster --json`)."""
    cluster_sizes: Mapping[int, Mapping[str, float]]
    """Steady-run EC2 calls per node-hour by operation, per cluster size."""
    chaos: Mapping[str, Any]
    """The JSON of the short chaos run (`python -m chaos --json`)."""
    plots: Mapping[str, str] = field(default_factory=dict)
    """Plot name -> path relative to docs/."""
    large: Mapping[str, Any] = field(default_factory=dict)
    """The JSON of a run of more nodes (`IPAMD_BENCH_NODES=2000 make bench-cluster`), if given."""
    history: str = ""
    """The hand-kept history of the figures (`HISTORY`), carried into the page as it is."""


HISTORY = Path("benchmarks") / "history.md"
"""Where, under docs/, the history of the figures is kept by hand: how each change of ipamd moved
them when it was made. Only this run's figures are measured; the history is not, so `make report`
reads it and writes it back into the page unchanged, and a regenerated page keeps it."""
HISTORY_HEADING = "## How the figures moved"


def history(docs: Path) -> str:
    """The hand-kept history under `docs`, or nothing when there is none."""
    path = docs / HISTORY
    return path.read_text(encoding="utf-8") if path.is_file() else ""


def render(f: Figures) -> str:
    parts = [
        "# ipamd benchmarks\n",
        "Written by `make report` (do not edit by hand): `make bench`, then short runs of the "
        "cluster simulator (`make bench-cluster`) and of the chaos runner (`make chaos`). "
        "The full-size runs print the same figures; this page shows the short ones, except "
        "where a section names a full-size run (`make report CLUSTER_JSON=...`).\n",
        f"Machine: {f.machine}\n",
        _engine_section(f),
        *([_burst_section(f)] if BURST_P50 in f.bench else []),
        _cluster_section(f),
        *([_large_section(f)] if f.large else []),
        _chaos_section(f),
        *([f"{HISTORY_HEADING}\n", f.history] if f.history else []),
    ]
    return "\n".join(parts)


def _engine_section(f: Figures) -> str:
    rows = [(name, _num(value), _target(name, value)) for name, value in sorted(f.bench.items())]
    intents = [(f"{n:,}", _num(ms)) for n, ms in f.del_p50_ms_by_intents]
    return "\n".join(
        [
            "## One node (`make bench`)\n",
            _table(("figure", "value", "target"), rows),
            "",
            _image(f, "add_latency", "ADD latency distribution"),
            "",
            "DEL p50 against outstanding delete intents (one node, 250 pods, durable commits):\n",
            _table(("outstanding intents", "DEL p50 (ms)"), intents),
            "",
            _image(f, "del_cost", "DEL cost against outstanding intents"),
            "",
        ]
    )


BURST_P50 = "cni_burst_30_pods_p50_ms"
VPC_CNI_PR = "https://github.com/aws/amazon-vpc-cni-k8s/pull/3764"
VPC_CNI_BURST_P50_MS = (("VPC CNI before #3764", 5000.0), ("VPC CNI after #3764", 750.0))
"""VPC CNI's CNI ADD p50 on a 30-pod concurrent create burst, as its PR #3764 reports it (which
creates the host veth straight in the host's namespace instead of moving it there)."""


def _burst_section(f: Figures) -> str:
    """Ours beside VPC CNI's: the same burst of 30 pods through the runtime, the ADD's p50."""
    b = f.bench
    rows = [
        (
            "ipamd (this run)",
            _num(b[BURST_P50]),
            _num(b.get("cni_burst_30_pods_p99_ms")),
            _target(BURST_P50, b[BURST_P50]),
        ),
        *((name, _num(ms), "not published", "") for name, ms in VPC_CNI_BURST_P50_MS),
    ]
    ratio = b.get("cni_burst_30_over_cpu_floor")
    return "\n".join(
        [
            "## A burst of 30 pods beside VPC CNI (`bench.cni_burst`)\n",
            "30 pods created at once through containerd's CRI (RunPodSandbox from 30 threads), "
            "each pod's CNI ADD timed from the plugin process's start to its answer. VPC CNI's "
            "rows are the p50s that "
            f"[aws/amazon-vpc-cni-k8s#3764]({VPC_CNI_PR}) reports for a 30-pod concurrent create "
            "burst, before and after that change (the host veth created straight in the host's "
            "namespace, as ipamd-cni creates it), on its authors' node. ipamd's row was measured "
            f"on the emulated VPC's node with the shipped plugin, on {f.machine}. The machines "
            "differ: the rows compare magnitudes, not hardware.\n",
            _table(("CNI ADD in a 30-pod burst", "p50 (ms)", "p99 (ms)", "target"), rows),
            "",
            f"The burst took {_num(b.get('cni_burst_30_wall_ms'))} ms from the first ADD's start "
            f"to the last one's answer: {_num(ratio)} times what 30 lone ADDs "
            f"({_num(b.get('cni_burst_lone_add_ms'))} ms each, through containerd on the same "
            "node) take spread over the CPUs; target "
            f"{_target('cni_burst_30_over_cpu_floor', ratio) if ratio is not None else 'unknown'}"
            ".\n",
            BURST_COSTS,
        ]
    )


BURST_COSTS = (
    "Where a burst's time goes on this machine (CPU time per process kind around a burst, profiled "
    "by hand when the bench was written, not by `make report`): both CPUs are busy from the first "
    "ADD to the last. Each pod costs about 90 to 110 ms of CPU in all: ipamd-cni about 18 ms "
    "(interpreter start about 9 ms of it, the call to ipamd about 4 ms), loopback and portmap "
    "about 13 ms, containerd, its shim, runc and the pause process about 29 ms, the kernel's work "
    "for a new namespace and veth 25 to 35 ms, ipamd itself about 3 ms. An ADD in the burst is its "
    "own few milliseconds of CPU stretched by the other runnable processes, so its p50 follows "
    "the plugin's cost times the contention; and the floor counts only the lone ADD, so the "
    "ratio measures containerd's and the kernel's share of a pod more than ipamd's. From run to "
    "run here the p50 moves between about 350 and 650 ms with the machine's other load.\n"
)
"""What a burst costs besides ipamd: measured once, by hand, and said beside the figures."""


def _cluster_section(f: Figures) -> str:
    c = f.cluster
    runs = c.get("runs", {})
    calls = c.get("calls_per_node_hour", {})
    ops = sorted({op for per in calls.values() for op in per})
    call_rows = [(op, *(_num(calls[r].get(op)) for r in sorted(calls))) for op in ops]
    refused = c.get("throttled_per_node_hour", {})
    refused_ops = sorted({op for per in refused.values() for op in per})
    refused_rows = [
        (op, *(_num(refused[r].get(op)) for r in sorted(refused))) for op in refused_ops
    ]
    size_ops = sorted({op for per in f.cluster_sizes.values() for op in per})
    sizes = sorted(f.cluster_sizes)
    size_rows = [(op, *(_num(f.cluster_sizes[n].get(op)) for n in sizes)) for op in size_ops]
    return "\n".join(
        [
            f"## A cluster against one EC2 API budget ({c.get('nodes', '?')} nodes, simulated time)\n",
            _runs_table(runs),
            "",
            *_takeover(runs.get("subnet_takeover")),
            CLUSTER_TARGETS,
            "",
            "EC2 calls per node-hour by operation:\n",
            _table(("operation", *sorted(calls)), call_rows),
            "",
            *(
                [
                    "Of those, the requests EC2 refused (RequestLimitExceeded), per node-hour:\n",
                    _table(("operation", *sorted(refused)), refused_rows),
                    "",
                ]
                if refused_rows
                else []
            ),
            _image(f, "pool_over_time", "Pool size against pods over time"),
            "",
            "Pods waiting for an address in each run's measured window, and under the schedule "
            "that meets the run's lower bound:\n",
            _image(f, "pods_waiting", "Pods waiting over time against the lower bound"),
            "",
            BOUND_MODEL,
            "Steady workload, EC2 calls per node-hour against cluster size:\n",
            _table(("operation", *(f"{n} nodes" for n in sizes)), size_rows),
            "",
            _image(f, "calls_by_cluster_size", "EC2 calls per node-hour against cluster size"),
            "",
        ]
    )


LARGE_WALL_S = 900.0
"""The larger command's wall time here, at most (15 minutes)."""
LARGE_WALL_RATIO = 5.0
"""Its wall time over the default command's, at most (linear in the nodes would be 4)."""


def _large_section(f: Figures) -> str:
    """A larger cluster on the same account and budget: its runs' figures and its wall time, also
    against that of the run in the section above (0 add_failed_no_address and 0
    invariant_violations are its targets as well)."""
    large, base = f.large, f.cluster
    runs = large.get("runs", {})
    nodes = large.get("nodes")
    wall, base_wall = large.get("wall_s"), base.get("wall_s")
    walls = [
        ("wall_s", _num(wall), _verdict(wall, LARGE_WALL_S)),
        (f"wall_s of the {_num(base.get('nodes'))}-node command above", _num(base_wall), ""),
    ]
    if wall and base_wall:
        ratio = round(wall / base_wall, 3)
        walls.append(("wall_s over its wall_s", _num(ratio), _verdict(ratio, LARGE_WALL_RATIO)))
    return "\n".join(
        [
            f"## The same account at {_num(nodes)} nodes "
            f"(`IPAMD_BENCH_NODES={nodes} make bench-cluster`)\n",
            "The whole command, its runs side by side (one worker per CPU):\n",
            _table(("figure", "value", "target"), walls),
            "",
            _runs_table(runs),
            "",
        ]
    )


def _runs_table(runs: Mapping[str, Mapping[str, Any]]) -> str:
    """Every figure of every run: a row per figure, a column per run (by name)."""
    names = sorted(runs)
    metrics = sorted({m for run in runs.values() for m in run})
    return _table(
        ("figure", *names), [(m, *(_num(runs[r].get(m)) for r in names)) for m in metrics]
    )


def _verdict(value: float | None, bound: float) -> str:
    if value is None:
        return ""
    return f"≤ {_num(bound)} ({'met' if value <= bound else 'NOT met'})"


def _takeover(run: Mapping[str, float] | None) -> list[str]:
    """The `subnet_takeover` run in words (`bench.cluster.subnets_run`), when the figures have it."""
    if not run:
        return []
    n = {k: _num(v) for k, v in run.items()}
    share = run.get("pods_on_pod_subnet_share", 0.0)
    return [
        f"`subnet_takeover`: {n.get('nodes', '?')} nodes share a node subnet too small to fill "
        "every primary ENI (m5.large, `WARM_ENI_TARGET=1`), and a pod subnet tagged "
        "`kubernetes.io/role/cni=1` on a secondary VPC CIDR block (100.64.0.0/16) is in the same "
        f"zone. The node subnet ran down to {n.get('node_subnet_free_min', '?')} free addresses "
        f"while the nodes joined ({n.get('primaries_short', '?')} primary ENIs left unfilled); "
        f"new ENIs went to the pod subnet ({n.get('pod_subnet_enis', '?')} there, "
        f"{n.get('pod_subnet_enis_after_dry', '?')} made after the node subnet was dry), which "
        f"held {share:.0%} of the pods' addresses at the end. ADDs failed for want of an address: "
        f"{n.get('add_failed_no_address', '?')} (target 0); time to address p99: "
        f"{n.get('time_to_address_p99_s', '?')} s; invariant violations: "
        f"{n.get('invariant_violations', '?')}.\n",
    ]


def _chaos_section(f: Figures) -> str:
    c = f.chaos
    kinds = c.get("by_kind", {})
    rows = [
        (kind, str(v.get("injected", 0)), str(v.get("survived", 0)))
        for kind, v in sorted(kinds.items())
    ]
    totals = [
        (name, _num(c.get(name)))
        for name in (
            "faults_injected",
            "faults_survived",
            "acknowledged_lost",
            "double_owners",
            "adds_acknowledged",
            "dels_acknowledged",
            "wall_s",
        )
        if name in c
    ]
    return "\n".join(
        [
            "## Chaos: the daemon as a real process under faults\n",
            _table(("figure", "value"), totals),
            "",
            _table(("fault", "injected", "survived"), rows),
            "",
        ]
    )


def _image(f: Figures, name: str, alt: str) -> str:
    path = f.plots.get(name)
    return f"![{alt}]({path})" if path else f"_{alt}: no data in this run._"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _num(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.3f}"


def _target(name: str, value: float) -> str:
    floor = MINIMUMS.get(name)
    if floor is not None:
        return f"≥ {_num(floor)} ({'met' if value >= floor else 'NOT met'})"
    bound = TARGETS.get(name)
    return "" if bound is None else _verdict(value, bound)
