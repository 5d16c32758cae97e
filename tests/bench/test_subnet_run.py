"""The cluster simulator's `subnet_takeover` run (`bench.cluster.subnets_run`), small: the nodes'
subnet runs dry while they join, the tagged pod subnet takes over, and no ADD fails for want of an
address."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator

import pytest

from bench.cluster.__main__ import main, specs
from bench.cluster.front import Ec2Budget
from bench.cluster.sim import RunSpec
from bench.cluster.subnets_run import (
    ADDRESSES_PER_PRIMARY,
    DEFAULT_NODES,
    DRY_BELOW,
    NAME,
    PODS_PER_NODE,
    node_subnet_cidr,
    run_takeover,
    takeover_spec,
)
from bench.report import markdown
from cloud.embedded.world import EmbeddedEc2


@pytest.fixture(scope="module")
def host() -> Iterator[EmbeddedEc2]:
    with EmbeddedEc2() as embedded:
        yield embedded


@pytest.mark.parametrize("nodes", [4, 6, 10, 50, 100])
def test_the_node_subnet_holds_every_node_but_not_every_primary_eni_filled(nodes: int) -> None:
    usable = ipaddress.IPv4Network(node_subnet_cidr(nodes)).num_addresses - 5
    assert nodes <= usable < nodes * ADDRESSES_PER_PRIMARY
    assert node_subnet_cidr(100) == "10.1.0.0/23"


def test_the_run_is_a_default_run_of_at_most_100_nodes() -> None:
    runs = specs(500, 0.5, 5000, 1, Ec2Budget())
    takeover = runs["subnet_takeover"]
    assert (takeover.name, takeover.nodes, takeover.pods_per_node) == (NAME, 100, PODS_PER_NODE)
    assert takeover.measure_s == runs["steady"].measure_s and takeover.burst_pods == 0
    assert takeover_spec(RunSpec("x", 8), 8).nodes == 8 <= DEFAULT_NODES


def test_a_small_cluster_runs_its_subnet_dry_and_the_pod_subnet_takes_over(
    host: EmbeddedEc2,
) -> None:
    spec = takeover_spec(RunSpec(NAME, 6, ramp_s=300, measure_s=900, warmup_s=60, seed=7), 6)
    result = run_takeover(spec, host, lambda _: None)
    extra = result.extra
    assert result.pods.failed_no_address == 0
    assert result.pods.add_errors == {}
    assert result.problems == [] and result.violations == 0
    assert result.pods.scheduled > spec.nodes * spec.pods_per_node
    # Dry: too few free addresses left to fill one more primary ENI, and nodes whose primary
    # found it so.
    assert extra["node_subnet_free_min"] < DRY_BELOW
    assert 0 < extra["primaries_short"] < spec.nodes
    # The pod subnet took over: ENIs made there after the node subnet was dry, every node with
    # some, and most pod addresses there.
    assert extra["pod_subnet_enis_after_dry"] > 0
    assert extra["pod_subnet_enis"] >= spec.nodes
    assert extra["pods_on_pod_subnet_share"] > 0.5
    assert extra["nodes"] == spec.nodes


def test_the_run_can_be_chosen_alone(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--runs", "subnet_takeover", "--nodes", "4", "--hours", "0.1"])
    figures = dict(
        line.split(": ") for line in capsys.readouterr().out.splitlines() if ": " in line
    )
    prefix = "bench_cluster_4_nodes_subnet_takeover"
    assert float(figures[f"{prefix}_add_failed_no_address"]) == 0
    assert float(figures[f"{prefix}_invariant_violations"]) == 0
    assert f"{prefix}_pods_on_pod_subnet_share" in figures
    assert f"{prefix}_time_to_address_p99_s" in figures
    assert not any("_steady_" in name for name in figures), "only the run asked for"


def test_the_report_describes_the_run_with_its_figures() -> None:
    figures = {
        "nodes": 100,
        "node_subnet_free_min": 2,
        "primaries_short": 55,
        "pod_subnet_enis": 199,
        "pod_subnet_enis_after_dry": 55,
        "pods_on_pod_subnet_share": 0.737,
        "add_failed_no_address": 0,
        "time_to_address_p99_s": 0,
        "invariant_violations": 0,
    }
    cluster = {"nodes": 100, "runs": {"steady": {"add_failed_no_address": 0}, NAME: figures}}
    page = markdown.render(markdown.Figures("m", {}, [], cluster, {}, {}))
    assert "`subnet_takeover`: 100 nodes share a node subnet" in page
    assert "ran down to 2 free addresses" in page and "held 74% of the pods' addresses" in page
    assert "want of an address: 0 (target 0)" in page
    without = markdown.render(markdown.Figures("m", {}, [], {"runs": {"steady": {}}}, {}, {}))
    assert "`subnet_takeover`" not in without
