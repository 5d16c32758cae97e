"""The burst bench (`bench.cni_burst`): its figures from the recorded spans, the wrapper that
records each plugin run without changing it, and a small burst through containerd on the emulated
VPC's node by the same code path as the 30-pod one (root only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import cni_burst, cni_timing
from bench.cni_timing import Span

MS = 1_000_000


def _span(container_id: str, started_ms: int, answered_ms: int, cpu_ms: int = 20) -> Span:
    return Span("ADD", container_id, "eth0", started_ms * MS, answered_ms * MS, 0, cpu_ms * MS)


def test_the_figures_compare_the_burst_with_lone_adds_spread_over_the_cpus() -> None:
    burst = [_span("a", 0, 100), _span("b", 10, 210), _span("c", 20, 320), _span("d", 30, 400)]
    lone = [_span("x", 0, 40, 30), _span("y", 0, 50, 35), _span("z", 0, 60, 45)]
    figures = cni_burst.figures(burst, lone, cpus=2)
    assert figures["cni_burst_4_pods_p50_ms"] == pytest.approx(250.0)
    assert figures["cni_burst_4_pods_p99_ms"] == pytest.approx(367.9)
    assert figures["cni_burst_4_wall_ms"] == pytest.approx(400.0)
    assert figures["cni_burst_lone_add_ms"] == pytest.approx(50.0)
    # 4 ADDs of 50 ms on 2 CPUs could end in 100 ms; the burst took 400.
    assert figures["cni_burst_4_over_cpu_floor"] == pytest.approx(4.0)
    # The plugin's own CPU: 20 ms in each burst ADD, the lone ones' median 35.
    assert figures["cni_burst_4_add_cpu_p50_ms"] == pytest.approx(20.0)
    assert figures["cni_burst_lone_add_cpu_ms"] == pytest.approx(35.0)


def test_the_bare_pythons_figures_are_its_bursts_p50_and_its_median_lone_run() -> None:
    burst = [_span("a", 0, 90), _span("b", 0, 110), _span("c", 0, 300)]
    lone = [_span("x", 0, 12), _span("y", 0, 14), _span("z", 0, 19)]
    assert cni_burst.bare_figures(burst, lone) == {
        "cni_burst_3_bare_python_p50_ms": pytest.approx(110.0),
        "cni_burst_bare_python_lone_ms": pytest.approx(14.0),
    }


def test_the_bare_plugin_answers_an_add_with_one_address_and_a_del_with_nothing(
    tmp_path: Path,
) -> None:
    """`BARE_ENTRY` run by this interpreter as the launcher's flags run it: an ADD's answer is a
    CNI result with eth0 in the sandbox and one address; a DEL prints nothing."""
    env = {"CNI_CONTAINERID": "0a1bffff", "CNI_NETNS": "/run/netns/x"}
    args = [sys.executable, "-I", "-S", "-B", "-c", cni_burst.BARE_ENTRY]
    add = subprocess.run(
        args, input=b"{}", env={**env, "CNI_COMMAND": "ADD"}, capture_output=True, check=True
    )
    assert json.loads(add.stdout) == {
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0", "sandbox": "/run/netns/x"}],
        "ips": [{"address": "198.18.10.27/32", "interface": 0}],
    }
    delete = subprocess.run(
        args, input=b"{}", env={**env, "CNI_COMMAND": "DEL"}, capture_output=True, check=True
    )
    assert delete.stdout == b""


def test_the_node_holds_the_burst_before_it_and_asks_ec2_for_nothing_during_it() -> None:
    env = cni_burst.node_env(30)
    assert env["ENABLE_PREFIX_DELEGATION"] == "true"
    assert env["MINIMUM_IP_TARGET"] == "30"
    assert env["WARM_IP_TARGET"] == "", "a warm target would grow the pool during the burst"
    assert env["IPAMD_POOL_INTERVAL"] == "", "the default pace, not chaos' shortened one"
    assert "IP_COOLDOWN_PERIOD" not in env


@pytest.fixture
def wrapped(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in plugin that echoes its stdin and exits 7, behind the timing wrapper."""
    plugin = tmp_path / "plugin"
    plugin.write_text('#!/bin/sh\ncat\necho "args:$*" >&2\nexit 7\n')
    plugin.chmod(0o755)
    records = tmp_path / "runs.jsonl"
    wrapper = tmp_path / "ipamd-cni"
    why = cni_timing.build(plugin, records, wrapper)
    if why is not None:
        pytest.skip(why)
    return wrapper, records


def test_the_wrapper_records_a_run_and_changes_nothing_of_it(wrapped: tuple[Path, Path]) -> None:
    wrapper, records = wrapped
    env = {**os.environ, "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c0ffee", "CNI_IFNAME": "eth0"}
    conf = b'{"cniVersion": "1.0.0"}'
    done = subprocess.run(
        [str(wrapper), "one"], input=conf, env=env, capture_output=True, check=False
    )
    assert (done.returncode, done.stdout) == (7, conf)
    assert done.stderr == b"args:one\n"
    (span,) = cni_timing.read(records)
    assert (span.command, span.container_id, span.ifname, span.status) == (
        "ADD",
        "c0ffee",
        "eth0",
        7,
    )
    assert 0 < span.ms < 10_000
    assert 0 < span.cpu_ms <= span.ms, "the plugin's CPU time, within its wall time"


def test_the_wrapper_keeps_a_field_to_the_characters_an_id_has(
    wrapped: tuple[Path, Path],
) -> None:
    wrapper, records = wrapped
    env = {**os.environ, "CNI_COMMAND": "DEL", "CNI_CONTAINERID": 'a"b\\c'}
    subprocess.run([str(wrapper)], env=env, capture_output=True, check=False)
    (line,) = records.read_text().splitlines()
    assert json.loads(line)["container_id"] == "a?b?c"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("pods", [3])
def test_a_small_burst_through_containerd_gives_the_named_figures(
    tmp_path: Path, pods: int
) -> None:
    why = cni_burst.unavailable()
    if why is not None:
        pytest.skip(why)
    figures = cni_burst.measure(tmp_path, pods, lone_runs=1)
    assert set(figures) == {
        f"cni_burst_{pods}_pods_p50_ms",
        f"cni_burst_{pods}_pods_p99_ms",
        f"cni_burst_{pods}_over_cpu_floor",
        f"cni_burst_{pods}_wall_ms",
        "cni_burst_lone_add_ms",
        f"cni_burst_{pods}_add_cpu_p50_ms",
        "cni_burst_lone_add_cpu_ms",
        f"cni_burst_{pods}_bare_python_p50_ms",
        "cni_burst_bare_python_lone_ms",
    }
    assert all(value > 0 for value in figures.values()), figures
    root = f"ipamd-bench-{os.getpid()}"
    left = [str(m / root) for m in Path("/sys/fs/cgroup").iterdir() if (m / root).exists()]
    assert left == [], "the node's cgroups are removed with it"
