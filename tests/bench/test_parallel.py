"""The cluster simulator's runs side by side (`bench.cluster.parallel`): in worker processes they give
the figures they give one after another in this process."""

from __future__ import annotations

import pytest

from bench.cluster.__main__ import parse, specs
from bench.cluster.front import Ec2Budget
from bench.cluster.parallel import RunFailed, run_all
from bench.cluster.report import lines

MEASURED_HERE = ("wall_s", "cpu_s", "rss_mib", "descriptors_per_node")
"""Figures of the process that ran it, not of the run."""


def _figures(jobs: int) -> dict[str, list[str]]:
    every = specs(4, 0.05, 20, 3, Ec2Budget())
    chosen = {kind: every[kind] for kind in ("steady", "burst")}
    figures: dict[str, list[str]] = {}
    for name, result, wall_s in run_all(chosen, jobs):
        assert not isinstance(result, RunFailed), result.reason
        every_line = lines("x", name, result, wall_s)
        figures[name] = [ln for ln in every_line if not any(m in ln for m in MEASURED_HERE)]
    return figures


def test_runs_in_worker_processes_give_the_figures_they_give_in_turn() -> None:
    in_turn = _figures(1)
    side_by_side = _figures(2)
    assert sorted(in_turn) == ["burst_20_pods", "steady"]
    assert side_by_side == in_turn
    assert any(line.startswith("x_steady_pods_scheduled: ") for line in in_turn["steady"])


def test_jobs_default_to_none_and_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse([]).jobs is None
    assert parse(["--jobs", "3"]).jobs == 3
    with pytest.raises(SystemExit):
        parse(["--jobs", "0"])
    assert "--jobs must be at least 1" in capsys.readouterr().err
