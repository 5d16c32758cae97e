"""A short chaos run (`python -m chaos`) as a test: the daemon as a real process on a world the runner
owns, one fault of each kind, every fault survived, nothing acknowledged lost, no address with two
owners. The run is seeded (the schedule and the pods); its timing is real, so what the daemon is doing
when a fault lands varies between runs.

The full-disk kind needs a tmpfs, so root: otherwise the runner reports it skipped, never survived."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
KINDS_BUT_DISK = (
    "kill",
    "imds_stale",
    "imds_errors",
    "ec2_throttle",
    "ec2_5xx",
    "ec2_timeout",
    "runtime_down",
)


def _chaos(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    report = tmp_path / "chaos.json"
    run = subprocess.run(
        [sys.executable, "-m", "chaos", "--json", str(report), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=140,
        check=False,
    )
    assert report.exists(), run.stderr[-4000:]
    return run, json.loads(report.read_text())


def _assert_all_survived(run: subprocess.CompletedProcess[str], report: dict[str, Any]) -> None:
    assert report["faults_survived"] == report["faults_injected"], run.stderr[-4000:]
    assert report["acknowledged_lost"] == 0
    assert report["double_owners"] == 0
    assert report["deferred_unreleased"] == 0
    assert report["adds_acknowledged"] > 0 and report["dels_acknowledged"] > 0
    assert run.returncode == 0, run.stderr[-4000:]
    lines = dict(line.split(": ", 1) for line in run.stdout.splitlines())
    assert lines["chaos_faults_injected"] == str(report["faults_injected"])
    assert lines["chaos_faults_survived"] == lines["chaos_faults_injected"]


@pytest.mark.timeout(150)
def test_one_fault_of_each_kind_is_survived(tmp_path: Path) -> None:
    kinds = ",".join(KINDS_BUT_DISK)
    run, report = _chaos(tmp_path, "--faults", str(2 * len(KINDS_BUT_DISK)), "--kinds", kinds)

    _assert_all_survived(run, report)
    assert report["faults_injected"] == 2 * len(KINDS_BUT_DISK)
    assert {k: v["injected"] for k, v in report["by_kind"].items()} == dict.fromkeys(
        KINDS_BUT_DISK, 2
    )
    assert report["daemon_kills"] == 2


@pytest.mark.timeout(150)
def test_a_full_state_disk_is_survived(tmp_path: Path) -> None:
    run, report = _chaos(tmp_path, "--faults", "2", "--kinds", "disk_full")

    if os.geteuid() != 0:
        assert report["by_kind"]["disk_full"] == {"injected": 0, "survived": 0, "skipped": 2}
        pytest.skip("the full-disk fault needs root (a tmpfs state directory)")
    _assert_all_survived(run, report)
    assert report["by_kind"]["disk_full"]["injected"] == 2
