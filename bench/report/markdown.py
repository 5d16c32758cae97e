"""`docs/benchmarks.md` from the figures of one `make report` run: plain tables, the plots beside
(the cluster simulator's sections are `bench.report.clusters`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.report.clusters import cluster_section, large_section, nodes_of, sizes_section
from bench.report.tables import image, num, table, verdict

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
    large: Sequence[Mapping[str, Any]] = ()
    """The JSON of each run of more nodes (`IPAMD_BENCH_NODES=2000 make bench-cluster`, 5000),
    if given: a section each, and one with every size side by side."""
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
        cluster_section(f.cluster, f.cluster_sizes, f.plots),
        *(large_section(f.cluster, large) for large in sorted(f.large, key=nodes_of)),
        *([sizes_section([f.cluster, *f.large])] if f.large else []),
        _chaos_section(f),
        *([f"{HISTORY_HEADING}\n", f.history] if f.history else []),
    ]
    return "\n".join(parts)


def _engine_section(f: Figures) -> str:
    rows = [(name, num(value), _target(name, value)) for name, value in sorted(f.bench.items())]
    intents = [(f"{n:,}", num(ms)) for n, ms in f.del_p50_ms_by_intents]
    return "\n".join(
        [
            "## One node (`make bench`)\n",
            table(("figure", "value", "target"), rows),
            "",
            image(f.plots, "add_latency", "ADD latency distribution"),
            "",
            "DEL p50 against outstanding delete intents (one node, 250 pods, durable commits):\n",
            table(("outstanding intents", "DEL p50 (ms)"), intents),
            "",
            image(f.plots, "del_cost", "DEL cost against outstanding intents"),
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
            num(b[BURST_P50]),
            num(b.get("cni_burst_30_pods_p99_ms")),
            _target(BURST_P50, b[BURST_P50]),
        ),
        *((name, num(ms), "not published", "") for name, ms in VPC_CNI_BURST_P50_MS),
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
            table(("CNI ADD in a 30-pod burst", "p50 (ms)", "p99 (ms)", "target"), rows),
            "",
            f"The burst took {num(b.get('cni_burst_30_wall_ms'))} ms from the first ADD's start "
            f"to the last one's answer: {num(ratio)} times what 30 lone ADDs "
            f"({num(b.get('cni_burst_lone_add_ms'))} ms each, through containerd on the same "
            "node) take spread over the CPUs; target "
            f"{_target('cni_burst_30_over_cpu_floor', ratio) if ratio is not None else 'unknown'}"
            ".\n",
            _burst_cpu(b),
            BURST_COSTS,
        ]
    )


def _burst_cpu(b: dict[str, float]) -> str:
    """What the plugin itself spent of a burst ADD, from the wrapper's CPU accounting."""
    cpu = b.get("cni_burst_30_add_cpu_p50_ms")
    if not cpu:
        return ""
    return (
        f"The plugin process of a burst ADD used {num(cpu)} ms of CPU at the p50 (a lone one "
        f"{num(b.get('cni_burst_lone_add_cpu_ms'))} ms): the ADD's p50 wall time is "
        f"{num(b[BURST_P50] / cpu)} times its own CPU time, the rest spent runnable and waiting "
        "for a CPU held by the other sandboxes' processes.\n"
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


def _chaos_section(f: Figures) -> str:
    c = f.chaos
    kinds = c.get("by_kind", {})
    rows = [
        (kind, str(v.get("injected", 0)), str(v.get("survived", 0)))
        for kind, v in sorted(kinds.items())
    ]
    totals = [
        (name, num(c.get(name)))
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
            table(("figure", "value"), totals),
            "",
            table(("fault", "injected", "survived"), rows),
            "",
        ]
    )


def _target(name: str, value: float) -> str:
    floor = MINIMUMS.get(name)
    if floor is not None:
        return f"≥ {num(floor)} ({'met' if value >= floor else 'NOT met'})"
    bound = TARGETS.get(name)
    return "" if bound is None else verdict(value, bound)
