"""`make report`: run `make bench`, short cluster-simulator and chaos runs, and write
`docs/benchmarks.md` with its plots under `docs/benchmarks/`, followed by the hand-kept history of
the figures (`docs/benchmarks/history.md`, carried over as it is).

Each part runs as its own process (`python -m bench`, `python -m bench.cluster --json`,
`python -m chaos --json`), exactly as its make target does, so the report shows what those commands
print; the engine series the plots need beyond `make bench`'s summary are measured here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.report import markdown, plots, series

CLUSTER_SIZES = (25, 50, 100)
"""Short cluster runs (steady in both modes, a burst, and the subnet takeover) for the
calls-against-size plot; the largest also feeds the tables and the plots, unless a full-size run's
document is given (`--cluster-json`)."""
CLUSTER_ARGS = ("--runs", "steady,burst,steady_prefix,subnet_takeover", "--hours", "1")
CHAOS_FAULTS = 24


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__)
    parser.add_argument("--docs", type=Path, default=Path("docs"), help="where to write the report")
    parser.add_argument(
        "--cluster-json",
        type=Path,
        default=None,
        help="the document of a full-size `python -m bench.cluster --json` run (`make "
        "bench-cluster`) for the cluster tables and plots, instead of the largest short run",
    )
    parser.add_argument(
        "--large-json",
        type=Path,
        action="append",
        default=[],
        help="the document of a larger `python -m bench.cluster --json` run "
        "(`IPAMD_BENCH_NODES=2000 make bench-cluster`), shown in a section of its own and beside "
        "the others; may be given for several sizes",
    )
    args = parser.parse_args(argv)
    docs: Path = args.docs
    with tempfile.TemporaryDirectory(prefix="ipamd-report-") as tmp:
        work = Path(tmp)
        figures = _collect(work)
    if args.cluster_json is not None:
        figures.cluster = json.loads(args.cluster_json.read_text())
    figures.large = [json.loads(path.read_text()) for path in args.large_json]
    images = docs / "benchmarks"
    figures_with_plots = _draw(figures, images, docs)
    (docs / "benchmarks.md").write_text(markdown.render(figures_with_plots))
    print(f"report: wrote {docs / 'benchmarks.md'} and {images}/", file=sys.stderr)
    return 0


class _Collected:
    def __init__(self) -> None:
        self.bench: dict[str, float] = {}
        self.engine: series.EngineSeries | None = None
        self.cluster: dict[str, Any] = {}
        self.sizes: dict[int, dict[str, float]] = {}
        self.chaos: dict[str, Any] = {}
        self.large: list[dict[str, Any]] = []


def _collect(work: Path) -> _Collected:
    got = _Collected()
    got.bench = _name_values(_run([sys.executable, "-m", "bench", "--dir", str(work)]))
    _progress("engine series")
    got.engine = asyncio.run(series.measure(work / "series"))
    for n in CLUSTER_SIZES:
        _progress(f"cluster, {n} nodes")
        out = work / f"cluster-{n}.json"
        _run(
            [
                sys.executable,
                "-m",
                "bench.cluster",
                "--nodes",
                str(n),
                *CLUSTER_ARGS,
                "--json",
                str(out),
            ]
        )
        result = json.loads(out.read_text())
        got.sizes[n] = dict(result.get("calls_per_node_hour", {}).get("steady", {}))
        got.cluster = result
    _progress(f"chaos, {CHAOS_FAULTS} faults")
    out = work / "chaos.json"
    _run([sys.executable, "-m", "chaos", "--faults", str(CHAOS_FAULTS), "--json", str(out)])
    got.chaos = json.loads(out.read_text())
    return got


def _draw(got: _Collected, images: Path, docs: Path) -> markdown.Figures:
    assert got.engine is not None
    drawn: dict[str, str] = {}

    def out(name: str) -> Path:
        path = images / f"{name}.png"
        drawn[name] = str(path.relative_to(docs))
        return path

    plots.add_latency(got.engine.add_ms, out("add_latency"))
    plots.del_cost(got.engine.del_p50_ms_by_intents, out("del_cost"))
    pool_series = got.cluster.get("pool_series", {})
    if any(pool_series.values()):
        plots.pool_over_time(pool_series, out("pool_over_time"))
    waiting = got.cluster.get("waiting_series", {})
    if any(waiting.values()):
        runs = got.cluster.get("runs", {})
        bounds = {
            r: float(m["time_to_address_lower_bound_s"])
            for r, m in runs.items()
            if r in waiting and "time_to_address_lower_bound_s" in m
        }
        plots.pods_waiting(waiting, bounds, out("pods_waiting"))
    if got.sizes:
        plots.calls_by_cluster_size(got.sizes, out("calls_by_cluster_size"))
    return markdown.Figures(
        machine=_machine(),
        bench=got.bench,
        del_p50_ms_by_intents=got.engine.del_p50_ms_by_intents,
        cluster=got.cluster,
        cluster_sizes=got.sizes,
        chaos=got.chaos,
        plots=drawn,
        large=got.large,
        history=markdown.history(docs),
    )


def _run(command: list[str]) -> str:
    """Run one part; its progress goes to our stderr, its `name: value` lines are returned (and
    echoed). A part that fails fails the report."""
    _progress(" ".join(command[1:]))
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False)
    sys.stdout.write(done.stdout)
    if done.returncode != 0:
        raise SystemExit(f"report: {' '.join(command[1:])} exited {done.returncode}")
    return done.stdout


def _name_values(text: str) -> dict[str, float]:
    values: dict[str, float] = {}
    for line in text.splitlines():
        name, sep, value = line.partition(": ")
        if sep:
            try:
                values[name.strip()] = float(value)
            except ValueError:
                continue
    return values


def _machine() -> str:
    return (
        f"{os.cpu_count()} CPUs ({_cpu_model()}), Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}"
    )


def _cpu_model() -> str:
    """The CPU's name as /proc/cpuinfo gives it (its first `model name`), else the platform's."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        key, sep, value = line.partition(":")
        if sep and key.strip() == "model name":
            return value.strip()
    return platform.processor() or platform.machine()


def _progress(text: str) -> None:
    print(f"report: {text} ...", file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
