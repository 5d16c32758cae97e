"""The benchmark report's rendering: every plot is a real PNG the page links to, every figure given
appears in its table, and a figure over its target is called out."""

from __future__ import annotations

import re
from pathlib import Path

from bench.report import markdown, plots

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

CLUSTER = {
    "nodes": 3,
    "runs": {
        "steady": {"invariant_violations": 0, "add_failed_no_address": 0},
        "burst": {
            "time_to_address_p99_s": 4.5,
            "time_to_address_lower_bound_s": 3.0,
            "time_to_address_p99_over_bound": 1.5,
            "throttled_calls": 17,
        },
    },
    "calls_per_node_hour": {
        "steady": {"DescribeNetworkInterfaces": 12.0, "AssignPrivateIpAddresses": 0.5},
        "burst": {"DescribeNetworkInterfaces": 30.0},
    },
    "pool_series": {
        "ip": [[0, 0, 9], [60, 5, 14], [120, 2, 11]],
        "prefix": [[0, 0, 16], [60, 20, 48]],
    },
    "waiting_series": {
        "burst": [[0, 0, 0], [1, 12, 9], [2, 30, 14], [3, 5, 0], [4, 0, 0]],
        "steady": [[0, 0, 0], [60, 1, 0], [120, 0, 0]],
    },
}
CHAOS = {
    "faults_injected": 8,
    "faults_survived": 8,
    "acknowledged_lost": 0,
    "double_owners": 0,
    "by_kind": {
        "sigkill": {"injected": 4, "survived": 4},
        "disk_full": {"injected": 4, "survived": 4},
    },
}


def _draw_all(docs: Path) -> dict[str, str]:
    images = docs / "benchmarks"
    plots.add_latency({"ip": [0.3, 0.31, 0.5, 1.2], "prefix": [0.35, 0.4]}, images / "a.png")
    plots.del_cost([(0, 0.25), (1000, 0.26), (86_400, 0.27)], images / "d.png")
    plots.pool_over_time(CLUSTER["pool_series"], images / "p.png")  # type: ignore[arg-type]
    plots.calls_by_cluster_size(
        {25: {"DescribeNetworkInterfaces": 12.0}, 50: {"DescribeNetworkInterfaces": 12.1}},
        images / "c.png",
    )
    plots.pods_waiting(CLUSTER["waiting_series"], {"burst": 3.0}, images / "w.png")  # type: ignore[arg-type]
    return {
        "add_latency": "benchmarks/a.png",
        "del_cost": "benchmarks/d.png",
        "pool_over_time": "benchmarks/p.png",
        "calls_by_cluster_size": "benchmarks/c.png",
        "pods_waiting": "benchmarks/w.png",
    }


def test_report_links_real_plots_and_shows_every_figure(tmp_path: Path) -> None:
    drawn = _draw_all(tmp_path)
    page = markdown.render(
        markdown.Figures(
            machine="test machine",
            bench={"engine_add_p50_ms": 0.318, "reconcile_cpu_ms_11760_ips": 51.0, "other": 7.0},
            del_p50_ms_by_intents=[(0, 0.25), (86_400, 0.27)],
            cluster=CLUSTER,
            cluster_sizes={25: {"DescribeNetworkInterfaces": 12.0}},
            chaos=CHAOS,
            plots=drawn,
        )
    )
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page)
    assert sorted(links) == sorted(drawn.values())
    for link in links:
        data = (tmp_path / link).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5_000, f"{link} is not a drawn PNG"

    assert "| engine_add_p50_ms | 0.318 | ≤ 1 (met) |" in page
    assert "| reconcile_cpu_ms_11760_ips | 51 | ≤ 50 (NOT met) |" in page
    assert "| other | 7 |  |" in page
    assert "| 86,400 | 0.270 |" in page
    assert "| time_to_address_p99_s | 4.500 |  |" in page  # columns: burst, then steady
    assert "| time_to_address_lower_bound_s | 3 |  |" in page
    assert "| time_to_address_p99_over_bound | 1.500 |  |" in page
    assert "### The lower bound on time to address" in page
    assert "Why it is a lower bound" in page
    assert "| DescribeNetworkInterfaces | 30 | 12 |" in page
    assert "| disk_full | 4 | 4 |" in page
    assert "| faults_survived | 8 |" in page


def test_a_missing_plot_is_said_not_linked(tmp_path: Path) -> None:
    page = markdown.render(markdown.Figures("m", {}, [], CLUSTER, {}, CHAOS, plots={}))
    assert "](" not in page
    assert "_Pool size against pods over time: no data in this run._" in page
    assert "_Pods waiting over time against the lower bound: no data in this run._" in page


def test_a_larger_cluster_has_its_section_with_its_wall_time_against_the_base() -> None:
    base = {**CLUSTER, "wall_s": 100.0}
    large = {
        "nodes": 12,
        "wall_s": 520.0,
        "runs": {"steady": {"time_to_address_p99_s": 40.0, "invariant_violations": 0}},
    }
    page = markdown.render(markdown.Figures("m", {}, [], base, {}, CHAOS, large=[large]))
    section = page[page.index("## The same account at 12 nodes") : page.index("## One account")]
    assert "`IPAMD_BENCH_NODES=12 make bench-cluster`" in section
    assert "| wall_s | 520 |  |" in section  # no target at this size
    assert "| wall_s of the 3-node command above | 100 |  |" in section
    assert "| wall_s over its wall_s | 5.200 | ≤ 5 (NOT met) |" in section  # 1.25 times 12 / 3
    assert "| time_to_address_p99_s | 40 |" in section


def _sized(
    nodes: int, wall_s: float, reads: float, refused: int, bound_s: float
) -> dict[str, object]:
    """A command's document at `nodes` nodes: its steady run reading `reads` a node-hour."""
    return {
        "nodes": nodes,
        "wall_s": wall_s,
        "date": "2026-12-07",
        "cpus": 2,
        "load_average": {"start": 0.5, "end": 1.25},
        "budget": {"describe_refill_per_s": 20.0, "mutate_refill_per_s": 5.0},
        "runs": {
            "steady": {
                "ec2_calls_per_node_hour": reads,
                "throttled_calls": refused,
                "descriptors_per_node": 3.0,
                "rss_mib_per_node": 0.7,
                "add_failed": 0,
                "time_to_address_p99_s": 0.0,
                "wall_s": wall_s / 2,
            },
            f"burst_{10 * nodes}_pods": {
                "time_to_address_lower_bound_s": bound_s,
                "time_to_address_p99_over_bound": 1.2,
                "wall_s": wall_s / 3,
            },
        },
        "calls_per_node_hour": {
            "steady": {"DescribeNetworkInterfaces": reads - 2, "DescribeSubnets": 2.0},
            f"burst_{10 * nodes}_pods": {"CreateNetworkInterface": 50.0},
        },
        "throttled_per_node_hour": {"steady": {"DescribeNetworkInterfaces": refused / nodes}},
    }


def test_every_size_side_by_side_with_the_accounts_load_and_what_grows() -> None:
    base = _sized(500, 130.0, 15.0, 0, 60.0)
    larges = [_sized(5000, 2400.0, 15.0, 3000, 2500.0), _sized(2000, 570.0, 15.0, 0, 620.0)]
    page = markdown.render(markdown.Figures("m", {}, [], base, {}, CHAOS, large=larges))
    assert page.index("## The same account at 2,000 nodes") < page.index(
        "## The same account at 5,000 nodes"
    )
    five = page[page.index("## The same account at 5,000 nodes") : page.index("## One account")]
    assert "Run on 2026-12-07, the machine's load average 0.500 when it began" in five
    assert "| wall_s | 2,400 | ≤ 2,700 (met) |" in five
    assert "| wall_s over its wall_s | 18.462 | ≤ 12.500 (NOT met) |" in five
    section = page[page.index("## One account at 500, 2,000, 5,000 nodes") : page.index("## Chaos")]
    assert (
        "| figure | steady, 500 nodes | steady, 2,000 nodes | steady, 5,000 nodes "
        "| burst, 500 nodes | burst, 2,000 nodes | burst, 5,000 nodes |"
    ) in section
    assert "| descriptors_per_node | 3 | 3 | 3 |  |  |  |" in section
    assert "| DescribeSubnets | 2 | 2 | 2 |  |  |  |" in section
    assert "| DescribeNetworkInterfaces | 0 | 0 | 0.600 |  |  |  |" in section  # refused
    # 15 reads a node-hour: 2.08, 8.33 and 20.83 a second against a refill of 20.
    assert "| 5,000 | 20.83 (104% of 20) | 0.000 (0% of 5) | 3,000 |" in section
    assert "EC2 calls per node-hour in the steady hour: the same at every size (15, 15, 15)" in (
        section
    )
    assert "ipamd's steady reads alone are 20.8 a second, 104% of the read bucket's refill" in (
        section
    )
    assert "its lower bound grows with the nodes" in section
    assert "up with the cluster (60 s, 620 s, 2,500 s)" in section


def test_without_a_larger_cluster_there_is_no_such_section() -> None:
    page = markdown.render(markdown.Figures("m", {}, [], CLUSTER, {}, CHAOS))
    assert "## The same account at" not in page


DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_hand_kept_history_survives_a_regeneration(tmp_path: Path) -> None:
    (tmp_path / markdown.HISTORY).parent.mkdir(parents=True)
    (tmp_path / markdown.HISTORY).write_text("### A change (abc1234)\n\nFrom 2 ms to 1 ms.\n")
    for _ in range(2):  # regenerating twice keeps it once, unchanged
        kept = markdown.history(tmp_path)
        page = markdown.render(markdown.Figures("m", {}, [], CLUSTER, {}, CHAOS, history=kept))
        (tmp_path / "benchmarks.md").write_text(page)
    assert page.endswith(
        f"\n{markdown.HISTORY_HEADING}\n\n### A change (abc1234)\n\nFrom 2 ms to 1 ms.\n"
    )
    assert page.count(markdown.HISTORY_HEADING) == 1
    assert markdown.history(tmp_path / "elsewhere") == ""
    bare = markdown.render(markdown.Figures("m", {}, [], CLUSTER, {}, CHAOS))
    assert markdown.HISTORY_HEADING not in bare


def test_the_committed_page_carries_the_history_as_the_report_writes_it() -> None:
    kept = markdown.history(DOCS)
    assert "CreateNetworkInterface" in kept, "the history is found"
    assert (DOCS / "benchmarks.md").read_text().endswith(f"\n{markdown.HISTORY_HEADING}\n\n{kept}")


BURST = {
    "cni_burst_30_pods_p50_ms": 180.5,
    "cni_burst_30_pods_p99_ms": 310.0,
    "cni_burst_30_over_cpu_floor": 1.8,
    "cni_burst_30_wall_ms": 900.0,
    "cni_burst_lone_add_ms": 33.0,
}


def test_the_burst_is_shown_beside_vpc_cnis_with_the_machine_named() -> None:
    page = markdown.render(markdown.Figures("2 CPUs (Some CPU)", BURST, [], CLUSTER, {}, CHAOS))
    section = page[page.index("## A burst of 30 pods") : page.index("## A cluster")]
    assert "| ipamd (this run) | 180.500 | 310 | ≤ 250 (met) |" in section
    assert "| VPC CNI before #3764 | 5,000 | not published |  |" in section
    assert "| VPC CNI after #3764 | 750 | not published |  |" in section
    assert "(https://github.com/aws/amazon-vpc-cni-k8s/pull/3764)" in section
    assert "2 CPUs (Some CPU)" in section
    assert "1.800 times what 30 lone ADDs (33 ms each" in section
    assert "target ≤ 1.500 (NOT met)" in section
    assert "| cni_burst_30_pods_p50_ms | 180.500 | ≤ 250 (met) |" in page
    assert "used" not in section.split("Where a burst")[0], "no CPU figure, no CPU sentence"


def test_the_bare_interpreter_is_shown_as_the_floor_of_a_python_plugin() -> None:
    bench = {**BURST, "cni_burst_30_bare_python_p50_ms": 120.0}
    page = markdown.render(markdown.Figures("m", bench, [], CLUSTER, {}, CHAOS))
    rows = [line for line in page.splitlines() if line.startswith("| ")]
    ours = rows.index("| ipamd (this run) | 180.500 | 310 | ≤ 250 (met) |")
    assert (
        rows[ours + 1]
        == "| ipamd-cni's interpreter alone, a canned answer (this run) | 120 |  |  |"
    )


def test_the_burst_adds_own_cpu_is_set_against_its_wall_time() -> None:
    bench = {**BURST, "cni_burst_30_add_cpu_p50_ms": 19.0, "cni_burst_lone_add_cpu_ms": 21.5}
    page = markdown.render(markdown.Figures("m", bench, [], CLUSTER, {}, CHAOS))
    assert "used 19 ms of CPU at the p50 (a lone one 21.500 ms)" in page
    assert "p50 wall time is 9.500 times its own CPU time" in page


def test_without_the_burst_there_is_no_comparison() -> None:
    page = markdown.render(
        markdown.Figures("m", {"engine_add_p50_ms": 0.3}, [], CLUSTER, {}, CHAOS)
    )
    assert "VPC CNI before #3764" not in page


def test_the_pod_aware_pool_is_shown_beside_the_warm_pool_with_its_targets() -> None:
    warm = {
        "bind_to_address_p99_s": 12.5,
        "addresses_per_node_mean": 27.0,
        "pods_with_address_per_node_mean": 15.5,
        "mutating_calls_per_1000_pods": 0.0,
    }
    aware = {
        "bind_to_address_p99_s": 12.5,
        "addresses_per_node_mean": 18.3,
        "pods_with_address_per_node_mean": 15.5,
        "mutating_calls_per_1000_pods": 449.6,
    }
    cluster = {**CLUSTER, "runs": {"bound_warm_pool": warm, "bound_pod_aware": aware}}
    page = markdown.render(
        markdown.Figures(
            machine="m",
            bench={},
            del_p50_ms_by_intents=[],
            cluster=cluster,
            cluster_sizes={},
            chaos=CHAOS,
        )
    )
    assert "| addresses_per_node_mean | 27 | 18.300 |" in page
    assert "over the warm pool's: 1.000 (target ≤ 1 (met))" in page
    assert "over the warm pool's: 0.678 (target ≤ 0.500 (NOT met))" in page
    assert "the pods alone hold 0.574 of the warm pool's addresses" in page


def test_without_both_pools_there_is_no_pod_aware_comparison() -> None:
    page = markdown.render(
        markdown.Figures(
            machine="m",
            bench={},
            del_p50_ms_by_intents=[],
            cluster=CLUSTER,
            cluster_sizes={},
            chaos=CHAOS,
        )
    )
    assert "bound_pod_aware" not in page
