"""`python -m bench [--dir DIR]`: run every benchmark family, print `name: value` lines on stdout.

Each family gets a fresh temporary directory (under DIR if given, to put the state file on a
particular disk); progress and timings of the families themselves go to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from bench import (
    api,
    cni_burst,
    ec2_calls,
    engine_latency,
    hostnet,
    intents,
    plugin,
    pod_aware,
    reconcile,
    restore,
    sizing,
    takeover,
)

Family = Callable[[Path], Awaitable[dict[str, float]]]

FAMILIES: tuple[tuple[str, Family], ...] = (
    ("engine_latency", engine_latency.run),
    ("intents", intents.run),
    ("restore", restore.run),
    ("sizing", sizing.run),
    ("ec2_calls", ec2_calls.run),
    ("reconcile", reconcile.run),
    ("hostnet", hostnet.run),
    ("plugin", plugin.run),
    ("api", api.run),
    ("takeover", takeover.run),
    ("cni_burst", cni_burst.run),
    ("pod_aware", pod_aware.run),
)


async def run_all(base: Path | None, only: frozenset[str] = frozenset()) -> None:
    for name, family in FAMILIES:
        if only and name not in only:
            continue
        started = time.perf_counter()
        print(f"bench: {name} ...", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(prefix=f"ipamd-bench-{name}-", dir=base) as workdir:
            metrics = await family(Path(workdir))
        for metric, value in metrics.items():
            print(f"{metric}: {value:.3f}", flush=True)
        elapsed = time.perf_counter() - started
        print(f"bench: {name} done in {elapsed:.1f} s", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to create the temporary state files"
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        choices=[name for name, _ in FAMILIES],
        help="run only this family (repeatable); all of them by default",
    )
    args = parser.parse_args(argv)
    asyncio.run(run_all(args.dir, frozenset(args.only)))


if __name__ == "__main__":
    main()
