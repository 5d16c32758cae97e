"""`python -m bench.kube_clients [--python PATH]`: what each Kubernetes client would cost ipamd's
process, measured as ipamd would pay it: the import time and the resident memory of importing
what a client needs to list and watch pods and nodes, on top of what ipamd loads anyway
(asyncio, ssl, json, aiohttp), each in a fresh process, the median of `--runs`.

The candidates are ipamd's own thin client on aiohttp (`ipamd.kube.client` and `.watch`), the
official async client (`kubernetes_asyncio`), `lightkube` and `kr8s`. Only ipamd's is a dependency
of the project: the others are measured where `--python` names an interpreter that has them (one
made with `python -m venv` and `pip install kubernetes-asyncio lightkube kr8s`); a candidate that
interpreter cannot import is reported as missing, never guessed. docs/operations.md keeps the
figures and the choice.

Prints `kube_client_<name>_import_ms: value` and `kube_client_<name>_rss_mib: value`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CANDIDATES = {
    "ipamd_aiohttp": "import ipamd.kube.client, ipamd.kube.watch",
    "kubernetes_asyncio": "from kubernetes_asyncio import client, config, watch",
    "lightkube": (
        "from lightkube import AsyncClient\nfrom lightkube.resources.core_v1 import Node, Pod"
    ),
    "kr8s": "import kr8s.asyncio\nfrom kr8s.asyncio.objects import Node, Pod",
}
"""What each needs imported to list and watch a node's pods and its Node."""

PROBE = """
import time
def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
import asyncio, json, ssl, aiohttp
before, t = rss(), time.perf_counter()
{code}
print(__import__("json").dumps([(time.perf_counter() - t) * 1000, rss() - before]))
"""


def measure(python: str, code: str, runs: int) -> tuple[float, float] | None:
    """Median import milliseconds and resident MiB added; None if `python` cannot import it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    times, rss = [], []
    for _ in range(runs + 1):  # the first warms the page cache and writes no figure
        done = subprocess.run(
            [python, "-c", PROBE.format(code=code)],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        if done.returncode != 0:
            return None
        ms, mib = json.loads(done.stdout)
        times.append(ms)
        rss.append(mib)
    return statistics.median(times[1:]), statistics.median(rss[1:])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.kube_clients", description=__doc__)
    parser.add_argument("--python", default=sys.executable, help="interpreter for the others")
    parser.add_argument("--runs", type=int, default=11)
    args = parser.parse_args(argv)
    for name, code in CANDIDATES.items():
        python = sys.executable if name == "ipamd_aiohttp" else args.python
        figures = measure(python, code, args.runs)
        if figures is None:
            print(f"kube_client_{name}: missing in {python}", file=sys.stderr)
            continue
        print(f"kube_client_{name}_import_ms: {figures[0]:.3f}")
        print(f"kube_client_{name}_rss_mib: {figures[1]:.3f}", flush=True)


if __name__ == "__main__":
    main()
