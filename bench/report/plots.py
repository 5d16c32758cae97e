"""The report's PNG plots (matplotlib, non-interactive Agg backend). Each function draws one figure
from plain data and writes it to `path`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

Point = Sequence[float]


def add_latency(samples: Mapping[str, Sequence[float]], path: Path) -> None:
    """ADD latency distribution per mode: the empirical CDF of every sample."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for mode, values in samples.items():
        ordered = sorted(values)
        n = len(ordered)
        ax.step(ordered, [(i + 1) / n for i in range(n)], where="post", label=f"{mode} mode")
    ax.set_xlabel("ADD latency (ms, durable commit)")
    ax.set_ylabel("fraction of ADDs")
    ax.set_title("Engine ADD latency distribution")
    ax.grid(True, alpha=0.3)
    ax.legend()
    _save(fig, path)


def del_cost(points: Sequence[tuple[int, float]], path: Path) -> None:
    """DEL p50 against outstanding delete intents."""
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = [n for n, _ in points]
    ys = [ms for _, ms in points]
    ax.plot(xs, ys, marker="o")
    ax.set_xscale("symlog", linthresh=1000)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("outstanding delete intents")
    ax.set_ylabel("DEL p50 (ms)")
    ax.set_title("DEL cost against outstanding intents")
    ax.grid(True, alpha=0.3)
    _save(fig, path)


def pool_over_time(series: Mapping[str, Sequence[Point]], path: Path) -> None:
    """Pods and pool addresses over simulated time, one panel per mode. Each point is
    (time in s, pods, addresses in the pool)."""
    modes = [m for m, points in series.items() if points]
    fig, axes = plt.subplots(
        len(modes) or 1, 1, figsize=(8, 3.2 * max(1, len(modes))), squeeze=False
    )
    for ax, mode in zip(axes[:, 0], modes, strict=False):
        points = series[mode]
        hours = [p[0] / 3600 for p in points]
        ax.plot(hours, [p[1] for p in points], label="pods")
        ax.plot(hours, [p[2] for p in points], label="addresses in the pool")
        ax.set_title(f"{mode} mode")
        ax.set_xlabel("simulated time (h)")
        ax.set_ylabel("addresses")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    _save(fig, path)


def pods_waiting(
    series: Mapping[str, Sequence[Point]], bounds: Mapping[str, float], path: Path
) -> None:
    """Pods waiting for an address over each run's measured window, in the run and under the
    schedule that meets the lower bound; one panel per run. Each point is (seconds into the
    window, waiting in the run, waiting under the bound)."""
    runs = [r for r, points in series.items() if points]
    fig, axes = plt.subplots(len(runs) or 1, 1, figsize=(8, 3.0 * max(1, len(runs))), squeeze=False)
    for ax, run in zip(axes[:, 0], runs, strict=False):
        points = series[run]
        minutes = [p[0] / 60 for p in points]
        ax.plot(minutes, [p[1] for p in points], label="the run")
        ax.plot(minutes, [p[2] for p in points], label="the lower bound's schedule", linestyle="--")
        bound = bounds.get(run)
        note = f" (lower bound on the longest wait: {bound:,.0f} s)" if bound is not None else ""
        ax.set_title(f"{run}{note}", fontsize="medium")
        ax.set_xlabel("minutes into the measured window")
        ax.set_ylabel("pods waiting")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    _save(fig, path)


def calls_by_cluster_size(by_size: Mapping[int, Mapping[str, float]], path: Path) -> None:
    """EC2 calls per node-hour, by operation, against the number of nodes."""
    sizes = sorted(by_size)
    operations = sorted({op for calls in by_size.values() for op in calls})
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for op in operations:
        ax.plot(sizes, [by_size[n].get(op, 0.0) for n in sizes], marker="o", label=op)
    ax.set_xscale("log")
    ax.set_xlabel("nodes in the cluster")
    ax.set_ylabel("EC2 calls per node-hour")
    ax.set_title("EC2 calls per node-hour against cluster size (steady workload)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    _save(fig, path)


def _save(fig: Figure, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
