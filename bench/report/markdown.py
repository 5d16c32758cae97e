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
    bare = b.get("cni_burst_30_bare_python_p50_ms")
    if bare is not None:
        rows.insert(
            1, ("ipamd-cni's interpreter alone, a canned answer (this run)", num(bare), "", "")
        )
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
            f"on the emulated VPC's node with the shipped plugin, on {f.machine}, its processes in "
            "the CPU cgroups a node gives them (containerd and the plugins it runs in "
            "`system.slice`, ipamd and the pods under `kubepods`, weighted as the kubelet weighs "
            "them). The machines differ: the rows compare magnitudes, not hardware.\n",
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


def _burst_cpu(b: Mapping[str, float]) -> str:
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
    "Where a burst ADD's time goes (profiled by hand with the kernel's delay accounting on, which "
    "`make bench` does not turn on): the plugin process's run time is its CPU time above, and "
    "almost all the rest it spends runnable, waiting in the run queue for a CPU that containerd, "
    "its shims, the other plugins and runc hold; in one run the wait was 80 to 90 % of each slow "
    "ADD's wall time and the plugin slept (on ipamd's answer, on the kernel) for a few "
    "milliseconds. So an ADD's p50 follows its plugin's CPU times the contention, and the bare "
    "interpreter's row is the floor of a plugin in Python here. The floor of the ratio counts only "
    "the lone ADD, while each pod costs containerd, runc and the kernel two to three times as much "
    "CPU again, so the ratio measures their share of a pod more than ipamd's.\n"
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
