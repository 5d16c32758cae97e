"""The cluster simulator's runs, each on an embedded EC2 of its own, in this process or at once in
worker processes (`python -m bench.cluster --jobs`): a run shares nothing with another, so running
them side by side changes none of their figures, only the wall time they take together. A run
stopped by a local error (`bench.cluster.sim.LocalFailure`) is handed back as `RunFailed`; the
others go on."""

from __future__ import annotations

import logging
import multiprocessing
import sys
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass

from bench.cluster.runner import run_spec
from bench.cluster.sim import LocalFailure, RunResult, RunSpec
from bench.cluster.subnets_run import run_takeover
from cloud.embedded.world import EmbeddedEc2

RUNNERS = {"subnet_takeover": run_takeover}
"""Runs on a network of their own; the others run on `run_spec`'s."""


def say(message: str) -> None:
    print(f"bench.cluster: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True, slots=True)
class RunFailed:
    """A run that a local error stopped: no figures, only why."""

    reason: str


Outcome = RunResult | RunFailed


def run_one(kind: str, spec: RunSpec) -> tuple[Outcome, float]:
    """One run on an embedded EC2 of its own; returns its result and its wall time."""
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    with EmbeddedEc2() as host:
        say(f"{spec.name}: {spec.nodes} nodes ...")
        t0 = time.perf_counter()
        try:
            result: Outcome = RUNNERS.get(kind, run_spec)(spec, host, say)
        except LocalFailure as err:
            result = RunFailed(str(err))
        return result, time.perf_counter() - t0


def run_all(chosen: Mapping[str, RunSpec], jobs: int) -> Iterator[tuple[str, Outcome, float]]:
    """Each run's (name, result or failure, wall time) as it ends: in this process when `jobs` is
    1, else in up to `jobs` worker processes (started afresh, not forked from this one)."""
    if jobs == 1:
        for kind, spec in chosen.items():
            yield (spec.name, *run_one(kind, spec))
        return
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures: dict[Future[tuple[Outcome, float]], str] = {
            pool.submit(run_one, kind, spec): spec.name for kind, spec in chosen.items()
        }
        for future in as_completed(futures):
            yield (futures[future], *future.result())
