"""The cluster simulator's sections of docs/benchmarks.md: the default run's (its runs, calls and
plots, the lower bound's model), each larger run's, and every size side by side with what grows
with the cluster (`bench.cluster`'s JSON documents)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bench.report.tables import image, num, runs_table, table, verdict

CLUSTER_TARGETS = (
    "Targets at 500 nodes (`make bench-cluster`): the burst's time_to_address_p99_over_bound "
    "≤ 1.5, the steady run's time_to_address_p99_s ≤ 30; in every run 0 add_failed_no_address "
    "and 0 invariant_violations. The time-to-address figures count the pods whose first ADD fell "
    "in the run's measured window (after the ramp in steady runs).\n\n"
    "Every failed ADD is counted by its cause: `add_failed_no_address` (no address by its "
    "30-minute deadline, or the node full), and of those `add_failed_no_address_ec2_budget` "
    "(its node's pool rounds were refused by the account's budget while it waited); "
    "`add_failed_invariant` (refused by one of ipamd's own invariants, counted as a violation "
    "too); `add_failed_local_error` (the simulator's process: a state file it could not open or "
    "write, a descriptor limit, anything unexpected). A local error anywhere, in an ADD, a job, "
    "a node's start or a check, stops its run at once: the command names it on stderr, prints "
    "none of that run's figures and exits 1, so `local_errors` is 0 in every run shown.\n\n"
    "The steady runs (`steady`, `steady_prefix`, `churn`) build their cluster (the nodes "
    "joining, the ramp) with the account's budget not metered; it applies, its buckets full, "
    "from the measured window on, which is then the grown cluster's steady state. Under EC2's "
    "default budget a cluster's growth costs at least three mutating calls a node before it "
    "holds 15 pods (the primary ENI's addresses, a second ENI's create and attach): at 5,000 "
    "nodes 15,000 calls, 50 minutes of the account's refill, where the ramp lasts ten, so no "
    "node-local policy could have served the ramp's pods within their deadline. The burst runs "
    "are built under the budget, and their burst comes once every node is ready."
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
pods, the instance type's limits, read by ipamd's own planner `ipamd.sizing.plan_pool`) find the \
pool short, with every pod the node has had at once counted, waiting ones included, and nothing \
given back. Each ask is a step, released when the targets first allow it, and costs the fewest \
mutating calls that deliver it: one AssignPrivateIpAddresses for units on an ENI the node has; \
one CreateNetworkInterface carrying the units and one AttachNetworkInterface for a new ENI.
- **When a step is due.** Step k of a node is due when the node's pods first outnumber the \
addresses of its steps before k. From then one of the w pods beyond those addresses waits until \
step k is done or w pods have left the node (the step's relief).
- **The budget.** Every call takes a token from the run's buckets (same sizes, refill and \
per-action split, full at the start) and is answered after the mutating latency (0.3 s); a step \
is done when its last call is answered, and no sooner than its calls one after another. In the \
steady runs, whose cluster is built unmetered, a step asked for before the measured window \
takes no token, and the buckets are full when the window begins.

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


def cluster_section(
    c: Mapping[str, Any],
    cluster_sizes: Mapping[int, Mapping[str, float]],
    plots: Mapping[str, str],
) -> str:
    """The default run's section (`c`), with the short runs' calls against cluster size."""
    runs = c.get("runs", {})
    calls = c.get("calls_per_node_hour", {})
    ops = sorted({op for per in calls.values() for op in per})
    call_rows = [(op, *(num(calls[r].get(op)) for r in sorted(calls))) for op in ops]
    refused = c.get("throttled_per_node_hour", {})
    refused_ops = sorted({op for per in refused.values() for op in per})
    refused_rows = [(op, *(num(refused[r].get(op)) for r in sorted(refused))) for op in refused_ops]
    size_ops = sorted({op for per in cluster_sizes.values() for op in per})
    sizes = sorted(cluster_sizes)
    size_rows = [(op, *(num(cluster_sizes[n].get(op)) for n in sizes)) for op in size_ops]
    return "\n".join(
        [
            f"## A cluster against one EC2 API budget ({c.get('nodes', '?')} nodes, simulated time)\n",
            runs_table(runs),
            "",
            *_takeover(runs.get("subnet_takeover")),
            *_pod_aware(runs.get("bound_warm_pool"), runs.get("bound_pod_aware")),
            CLUSTER_TARGETS,
            "",
            "EC2 calls per node-hour by operation:\n",
            table(("operation", *sorted(calls)), call_rows),
            "",
            *(
                [
                    "Of those, the requests EC2 refused (RequestLimitExceeded), per node-hour:\n",
                    table(("operation", *sorted(refused)), refused_rows),
                    "",
                ]
                if refused_rows
                else []
            ),
            image(plots, "pool_over_time", "Pool size against pods over time"),
            "",
            "Pods waiting for an address in each run's measured window, and under the schedule "
            "that meets the run's lower bound:\n",
            image(plots, "pods_waiting", "Pods waiting over time against the lower bound"),
            "",
            BOUND_MODEL,
            "Steady workload, EC2 calls per node-hour against cluster size:\n",
            table(("operation", *(f"{n} nodes" for n in sizes)), size_rows),
            "",
            image(plots, "calls_by_cluster_size", "EC2 calls per node-hour against cluster size"),
            "",
        ]
    )


def _takeover(run: Mapping[str, float] | None) -> list[str]:
    """The `subnet_takeover` run in words (`bench.cluster.subnets_run`), when the figures have it."""
    if not run:
        return []
    n = {k: num(v) for k, v in run.items()}
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


def _pod_aware(warm: Mapping[str, float] | None, aware: Mapping[str, float] | None) -> list[str]:
    """`bound_warm_pool` against `bound_pod_aware` in words and a table, when the figures have
    both (`python -m bench.cluster`: the same pods, bound before their ADD)."""
    if not warm or not aware:
        return []
    names = (
        "bind_to_address_p50_s",
        "bind_to_address_p99_s",
        "addresses_per_node_mean",
        "addresses_per_node_p99",
        "pods_with_address_per_node_mean",
        "mutating_calls_per_1000_pods",
        "add_failed_no_address",
        "throttled_calls",
    )
    rows = [(name, num(warm.get(name)), num(aware.get(name))) for name in names]
    p99 = aware.get("bind_to_address_p99_s", 0.0) / max(
        warm.get("bind_to_address_p99_s", 0.0), 1e-9
    )
    held = aware.get("addresses_per_node_mean", 0.0) / max(
        warm.get("addresses_per_node_mean", 0.0), 1e-9
    )
    floor = warm.get("pods_with_address_per_node_mean", 0.0) / max(
        warm.get("addresses_per_node_mean", 0.0), 1e-9
    )
    return [
        "`bound_warm_pool` and `bound_pod_aware`: the steady workload for half the time, each pod "
        "bound to its node a while before its ADD (the kubelet's sync of the new pod: log-normal, "
        "median 2 s, sigma 0.8), the same pods in both; VPC CNI's default warm pool, then the "
        "pod-aware pool (`IPAMD_POD_AWARE_POOL=on`) with every warm target at 0.\n",
        table(("figure", "bound_warm_pool", "bound_pod_aware"), rows),
        "",
        f"The pod-aware pool's p99 from binding to an answered ADD over the warm pool's: "
        f"{p99:.3f} (target {verdict(p99, 1.0)}). Its addresses per node over the warm "
        f"pool's: {held:.3f} (target {verdict(held, 0.5)}); the pods alone hold "
        f"{floor:.3f} of the warm pool's addresses, which no pool that gives each pod an address "
        "can hold less than.\n",
    ]


LARGE_WALL_S: Mapping[int, float] = {2000: 900.0, 5000: 2700.0}
"""A larger command's wall time here, at most: 15 minutes at 2,000 nodes, 45 at 5,000."""
LARGE_WALL_SLACK = 1.25
"""A larger command's wall time over the default command's, at most this times the ratio of their
nodes (1 would be linear in the nodes)."""


def nodes_of(doc: Mapping[str, Any]) -> int:
    return int(doc.get("nodes") or 0)


def large_section(base: Mapping[str, Any], large: Mapping[str, Any]) -> str:
    """A larger cluster on the same account and budget: its runs' figures and its wall time, also
    against that of the run in the section above (0 add_failed_no_address, 0 local_errors and 0
    invariant_violations are its targets as well)."""
    runs = large.get("runs", {})
    nodes = nodes_of(large)
    wall, base_wall = large.get("wall_s"), base.get("wall_s")
    bound = LARGE_WALL_S.get(nodes)
    walls = [
        ("wall_s", num(wall), "" if bound is None else verdict(wall, bound)),
        (f"wall_s of the {num(base.get('nodes'))}-node command above", num(base_wall), ""),
    ]
    if wall and base_wall and nodes_of(base):
        ratio = round(wall / base_wall, 3)
        most = round(LARGE_WALL_SLACK * nodes / nodes_of(base), 3)
        walls.append(("wall_s over its wall_s", num(ratio), verdict(ratio, most)))
    return "\n".join(
        [
            f"## The same account at {num(nodes)} nodes "
            f"(`IPAMD_BENCH_NODES={nodes} make bench-cluster`)\n",
            f"{_when(large)}The whole command, its runs side by side (one worker per CPU):\n",
            table(("figure", "value", "target"), walls),
            "",
            runs_table(runs),
            "",
        ]
    )


def _when(doc: Mapping[str, Any]) -> str:
    """When the command ran, and how busy the machine was (other work shares its CPUs)."""
    date = doc.get("date")
    if not date:
        return ""
    load = doc.get("load_average") or {}
    busy = (
        f", the machine's load average {num(load.get('start'))} when it began and "
        f"{num(load.get('end'))} when it ended ({num(doc.get('cpus'))} CPUs)"
        if load.get("start") is not None
        else ""
    )
    return f"Run on {date}{busy}. "


SIZE_FIGURES = (
    "nodes",
    "pods_scheduled",
    "wall_s",
    "cpu_s",
    "peak_rss_mib",
    "rss_mib_per_node",
    "state_mib_per_node",
    "descriptors_per_node",
    "ec2_calls_per_node_hour",
    "mutating_calls",
    "throttled_calls",
    "client_retries",
    "time_to_address_p99_s",
    "time_to_address_lower_bound_s",
    "time_to_address_p99_over_bound",
    "time_to_address_max_over_bound",
    "add_failed",
    "add_failed_no_address",
    "add_failed_no_address_ec2_budget",
    "local_errors",
    "invariant_violations",
)
"""The figures shown side by side for every size (each size's own section has them all)."""
KINDS = ("steady", "burst")


def _kind(run: str) -> str:
    """A run's kind: `burst_<P>_pods` is a burst whatever its pods."""
    return "burst" if run.startswith("burst") else run


def _columns(docs: Sequence[Mapping[str, Any]]) -> list[tuple[str, Mapping[str, Any], str]]:
    """(header, document, run name) for each kind, then each size."""
    out = []
    for kind in KINDS:
        for doc in docs:
            for run in sorted(doc.get("runs", {})):
                if _kind(run) == kind:
                    out.append((f"{kind}, {num(nodes_of(doc))} nodes", doc, run))
    return out


def sizes_section(docs: Sequence[Mapping[str, Any]]) -> str:
    """Every size's steady and burst runs side by side: their figures, their EC2 calls per
    node-hour and the refused ones, the account's load, and what grows with the cluster."""
    docs = sorted(docs, key=nodes_of)
    columns = _columns(docs)
    header = ("figure", *(h for h, _, _ in columns))

    def figure(name: str) -> tuple[str, ...]:
        cells = []
        for _, doc, run in columns:
            value = nodes_of(doc) if name == "nodes" else doc["runs"][run].get(name)
            cells.append(num(value))
        return (name, *cells)

    def per_op(key: str) -> list[tuple[str, ...]]:
        ops = sorted({op for _, doc, run in columns for op in doc.get(key, {}).get(run, {})})
        return [
            (op, *(num(doc.get(key, {}).get(run, {}).get(op)) for _, doc, run in columns))
            for op in ops
        ]

    sizes = ", ".join(num(nodes_of(d)) for d in docs)
    return "\n".join(
        [
            f"## One account at {sizes} nodes, side by side\n",
            "The steady and burst runs of the commands above (the same account, budget and "
            "workload per node; the steady run's figures are of its measured hour, the burst's "
            "of the whole burst).\n",
            table(header, [figure(name) for name in SIZE_FIGURES]),
            "",
            "EC2 calls per node-hour by operation:\n",
            table(("operation", *header[1:]), per_op("calls_per_node_hour")),
            "",
            "Of those, the requests EC2 refused (RequestLimitExceeded), per node-hour:\n",
            table(("operation", *header[1:]), per_op("throttled_per_node_hour") or [("none",)]),
            "",
            _account_load(docs),
            "",
            _what_grows(docs),
            NODE_COSTS,
        ]
    )


NODE_COSTS = (
    "What a node costs the simulator's process, and what ipamd holds on a real node. A "
    "simulated node holds 3 descriptors (`descriptors_per_node`), all of its state file: the "
    "file, its write-ahead log and its shared-memory index, behind the engine's one SQLite "
    "connection. The invariant checks read the file through that connection too: a checker's "
    "own would leave a fourth descriptor open for the node's life, since SQLite cannot close a "
    "file while another connection of the process holds a lock on it, and in WAL mode the "
    "engine's always does. The command raises its soft limit on open files to the hard limit, "
    "and refuses to start (one line, exit 2) when 3 a node and 512 for the process do not fit "
    "in it: 5,000 nodes need 15,512. The state files are in RAM (/dev/shm), their logs "
    "checkpointed every 100 pages and cut back (`state_mib_per_node`); `rss_mib_per_node` is "
    "the process's peak resident set less what it held before the account was built, over the "
    "nodes (moto's share of each instance and ENI included). The daemon on a real node keeps "
    "what it keeps: counted by hand on `ipamd run --embedded`, ready and idle, 37 descriptors, "
    "9 of them the embedded cloud's and runtime's own servers. The daemon's 28: its state "
    "file's 3 and the state directory's lock, its log file, its listening sockets (the API's "
    "unix socket, the network-policy agent's config socket, the metrics and introspection "
    "ports), its connection to the runtime (CRI), its HTTP connections to IMDS (and EC2 while "
    "calls are in flight; boto3 pools at most 10), and its event loops' and gRPC's own "
    "(epoll, eventfd, a socket pair), with standard input, output and error.\n"
)
"""Counted by hand when the simulator's limits were set (not by `make report`)."""


def _steady(doc: Mapping[str, Any]) -> tuple[Mapping[str, float], Mapping[str, float]]:
    """The steady run's figures and its calls per node-hour (empty when it has none)."""
    return doc.get("runs", {}).get("steady", {}), doc.get("calls_per_node_hour", {}).get(
        "steady", {}
    )


def _rates(doc: Mapping[str, Any]) -> tuple[float, float, float, float]:
    """The account's requests a second in the steady window, (reads, writes), and its budget's
    refill of each."""
    _, calls = _steady(doc)
    nodes = nodes_of(doc)
    reads = sum(n for op, n in calls.items() if op.startswith("Describe")) * nodes / 3600
    writes = sum(n for op, n in calls.items() if not op.startswith("Describe")) * nodes / 3600
    budget = doc.get("budget") or {}
    return (
        reads,
        writes,
        float(budget.get("describe_refill_per_s", 20.0)),
        float(budget.get("mutate_refill_per_s", 5.0)),
    )


def _account_load(docs: Sequence[Mapping[str, Any]]) -> str:
    rows = []
    for doc in docs:
        reads, writes, read_refill, write_refill = _rates(doc)
        refused = _steady(doc)[0].get("throttled_calls")
        rows.append(
            (
                num(nodes_of(doc)),
                f"{reads:.2f} ({reads / read_refill:.0%} of {num(read_refill)})",
                f"{writes:.3f} ({writes / write_refill:.0%} of {num(write_refill)})",
                num(refused),
            )
        )
    return "\n".join(
        [
            "The account's load in the steady run's measured hour: ipamd's requests a second, "
            "against the refill of the bucket they draw on (EC2's documented defaults), and "
            "the requests EC2 refused in that hour:\n",
            table(("nodes", "reads a second", "writes a second", "refused"), rows),
        ]
    )


def _trend(values: Sequence[float], unit: str = "") -> str:
    """`values` (one per size, ascending sizes) in words: the same, or from the first to the
    last."""
    low, high = min(values), max(values)
    shown = ", ".join(f"{num(round(v, 3))}{unit}" for v in values)
    if high <= 0 or (high - low) <= 0.1 * high:
        return f"the same at every size ({shown})"
    return f"{'up' if values[-1] > values[0] else 'down'} with the cluster ({shown})"


def _what_grows(docs: Sequence[Mapping[str, Any]]) -> str:
    steady = [_steady(d)[0] for d in docs]
    bursts: list[Mapping[str, float]] = [
        next((r for name, r in d.get("runs", {}).items() if _kind(name) == "burst"), {})
        for d in docs
    ]
    largest = docs[-1]
    reads, _, read_refill, _ = _rates(largest)

    def of(runs: Sequence[Mapping[str, float]], name: str) -> list[float]:
        return [float(r.get(name, 0.0)) for r in runs]

    lines = [
        "What grows with the cluster and what does not, at "
        f"{', '.join(num(nodes_of(d)) for d in docs)} nodes:\n",
        "- Per node, nothing: each node's schedule is its own. EC2 calls per node-hour in the "
        f"steady hour: {_trend(of(steady, 'ec2_calls_per_node_hour'))}; descriptors a node: "
        f"{_trend(of(steady, 'descriptors_per_node'))}; the simulator's memory a node (MiB): "
        f"{_trend(of(steady, 'rss_mib_per_node'))}.",
        "- The account's load grows with the nodes, and its budget does not: at "
        f"{num(nodes_of(largest))} nodes ipamd's steady reads alone are {reads:.1f} a second, "
        f"{reads / read_refill:.0%} of the read bucket's refill. Requests refused in the steady "
        f"hour: {_trend(of(steady, 'throttled_calls'))}.",
        "- ADDs that failed, in the steady hour: "
        f"{', '.join(num(v) for v in of(steady, 'add_failed'))}; the steady p99 time to "
        f"address: {_trend(of(steady, 'time_to_address_p99_s'), ' s')}.",
        "- A burst of ten pods a node onto the cluster: its lower bound grows with the nodes, "
        "since every node's ENIs are paid from one refill: "
        f"{_trend(of(bursts, 'time_to_address_lower_bound_s'), ' s')}; ipamd's p99 over it: "
        f"{', '.join(num(v) for v in of(bursts, 'time_to_address_p99_over_bound'))} "
        "(target ≤ 1.5).",
        f"- CPU time of the steady run: {_trend(of(steady, 'cpu_s'), ' s')}; of the burst: "
        f"{_trend(of(bursts, 'cpu_s'), ' s')} (its wall time, with a CPU to itself; each run "
        "has a worker process of its own).",
        "",
    ]
    return "\n".join(lines)
