"""What a simulated cluster costs its process, and what happens when the process runs short
(`bench.cluster.limits`): a node holds three descriptors, a cluster the process cannot hold is
refused before it starts, and a local error (descriptors running out halfway, a state file that
cannot be written) stops the run, naming it, instead of counting as pods that waited."""

from __future__ import annotations

import gc
import os
import resource
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.cluster import limits
from bench.cluster.invariants import node_invariants
from bench.cluster.runner import run_spec
from bench.cluster.sim import LocalFailure, RunSpec
from bench.cluster.workload import INVARIANT, LOCAL, NO_ADDRESS, cause
from cloud.embedded.world import EmbeddedEc2
from datastore.errors import OwnershipConflict
from ipamd.engine.invariants import InvariantBroken
from ipamd.errors import InventoryError, NodeFull, StoreWriteFailed
from ipamd.hostnet.datapath import Datapath
from tests.support.node import NodeFixture, key

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def host() -> Iterator[EmbeddedEc2]:
    with EmbeddedEc2() as embedded:
        yield embedded


def _with_open_files(limit: int, script: str) -> subprocess.CompletedProcess[str]:
    """`script` in a fresh interpreter whose soft and hard limits on open files are `limit`."""

    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        preexec_fn=lower,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_cluster_the_process_cannot_hold_is_refused_before_it_starts() -> None:
    """40 nodes need 3 descriptors each and the process's share: with 200 files allowed, and a
    hard limit no higher, the command says so in one line and exits 2, printing no figure."""
    done = _with_open_files(
        200,
        """
        from bench.cluster.__main__ import main
        main(["--nodes", "40", "--runs", "steady", "--hours", "0.01", "--jobs", "1"])
        """,
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    refusal = done.stderr.strip().splitlines()[-1]
    assert "refused: 40 simulated nodes need 632 open files" in refusal
    assert "may open 200" in refusal
    assert "Traceback" not in done.stderr


def test_descriptors_running_out_halfway_stop_the_run_and_name_the_cause() -> None:
    """Admitted by a limit that is wrong (the process's share left out), a run whose descriptors
    run out while its nodes join stops with the error, a local one: no node is left out quietly,
    no pod counted as one that waited."""
    done = _with_open_files(
        64,
        """
        import sys
        from bench.cluster import limits, runner
        from bench.cluster.sim import LocalFailure, RunSpec
        from cloud.embedded.world import EmbeddedEc2

        limits.PROCESS_FDS = 0  # as many nodes as files allow, and nothing else open
        with EmbeddedEc2() as host:
            nodes = 64 // limits.FDS_PER_NODE
            spec = RunSpec("steady", nodes, ramp_s=60, measure_s=60, warmup_s=30, seed=2)
            try:
                runner.run_spec(spec, host)
            except LocalFailure as err:
                print(f"stopped: {err}")
                sys.exit(0)
        print("ran to the end")
        """,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("stopped: steady: local error: node-"), done.stdout
    assert ": start: " in done.stdout
    # Whichever file the node was opening when none was left: its directory, or its state file.
    assert any(
        why in done.stdout for why in ("Too many open files", "unable to open database file")
    ), done.stdout


def test_a_node_holds_three_descriptors_and_the_run_says_what_a_node_costs(
    host: EmbeddedEc2,
) -> None:
    spec = RunSpec("steady", 6, ramp_s=120, measure_s=600, warmup_s=60, seed=6)
    # What earlier tests left unreachable but open is closed first: the count is the run's alone.
    gc.collect()
    before = limits.open_descriptors()
    result = run_spec(spec, host)
    assert result.descriptors_per_node == limits.FDS_PER_NODE
    assert limits.open_descriptors() == before, "every node's files are closed after the run"
    assert result.rss_mib_per_node > 0
    assert result.peak_rss_mib > result.rss_mib_per_node * spec.nodes
    # The state file and its log, cut back after each checkpoint (`bench.cluster.node.WAL_PAGES`).
    assert 0 < result.state_mib_per_node < 1.0


def test_the_soft_limit_is_raised_to_the_hard_one_and_holds_what_the_nodes_need() -> None:
    assert limits.needed(5000) == 3 * 5000 + limits.PROCESS_FDS
    was = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        soft, hard = limits.raise_soft_limit()
        assert hard in (soft, resource.RLIM_INFINITY)
        if soft != resource.RLIM_INFINITY:
            with pytest.raises(limits.TooFewDescriptors, match="at most"):
                limits.ensure_descriptors(soft)  # three a node: never as many nodes as files
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, was)


def test_a_store_write_failure_in_an_add_stops_the_run(
    host: EmbeddedEc2, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 30th ADD of the run finds the state file unwritable: the pod is counted as a local
    error's, and the run stops there, naming it, rather than going on with a pod that waited."""
    real_add = Datapath.add
    adds = 0

    async def add(self: Datapath, *args: object, **kwargs: object) -> object:
        nonlocal adds
        adds += 1
        if adds == 30:
            raise StoreWriteFailed("write to ipamd.db failed: unable to open database file")
        return await real_add(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Datapath, "add", add)
    spec = RunSpec("steady", 4, ramp_s=300, measure_s=600, warmup_s=60, seed=7)
    with pytest.raises(LocalFailure) as failure:
        run_spec(spec, host)
    message = str(failure.value)
    assert message.startswith("steady: local error: node-")
    assert "ADD" in message
    assert "StoreWriteFailed: write to ipamd.db failed: unable to open database file" in message


def test_each_failed_add_has_its_cause() -> None:
    conflict = StoreWriteFailed("write refused")
    conflict.__cause__ = OwnershipConflict("UNIQUE constraint failed")
    assert cause(conflict) == INVARIANT
    assert cause(InventoryError("unit already present")) == INVARIANT
    assert cause(NodeFull("every address is owned")) == NO_ADDRESS
    assert cause(StoreWriteFailed("disk")) == LOCAL
    assert cause(OSError(24, "Too many open files")) == LOCAL
    assert cause(sqlite3.OperationalError("unable to open database file")) == LOCAL


async def test_the_node_check_reads_the_file_through_the_engines_connection(
    node: NodeFixture,
) -> None:
    """Memory against the file, read through the store the engine commits through: a record the
    engine does not hold (written behind its back) is found, and no descriptor is left behind."""
    engine = await node.open()
    await node.seed(enis=1, per_eni=2)
    await engine.assign(key("a"))
    assert node.store is not None
    node_invariants(engine, node.store, node.clock.now())
    before = limits.open_descriptors()
    node_invariants(engine, node.store, node.clock.now())
    assert limits.open_descriptors() == before
    behind = sqlite3.connect(node.path)
    try:
        behind.execute("DELETE FROM allocation_addresses")
        behind.execute("DELETE FROM allocations")
        behind.commit()
    finally:
        behind.close()
    with pytest.raises(InvariantBroken, match="memory differs from disk"):
        node_invariants(engine, node.store, node.clock.now())
