"""What a simulated cluster costs the process that runs it: open files and memory.

**Open files.** A simulated node holds `FDS_PER_NODE` descriptors, all of its state file: the
file, its write-ahead log and its shared-memory index, behind the one SQLite connection its engine
commits through. The invariant checks read the file through that connection too
(`bench.cluster.invariants`): a connection of their own would leave a fourth descriptor open for
the node's whole life, since SQLite (its unix VFS) cannot close a file while another connection of
the process holds a POSIX lock on it, closing would drop that lock, and in WAL mode the engine's
connection always holds one. So N nodes need `FDS_PER_NODE` * N descriptors, and
`PROCESS_FDS` more for everything else (the interpreter, moto, the event loop, imports done
lazily inside a run, a worker's pipes). Before a run the soft limit is raised to the hard limit;
if even that cannot hold the nodes asked for, the run is refused before it starts
(`TooFewDescriptors`) instead of failing ADDs halfway. The daemon on a real node holds its own
set (docs/benchmarks.md says which).

**Memory.** `rss_mib` reads the process's resident set; `peak_rss_mib` its high-water mark since
`reset_peak` (Linux's VmHWM, which writing 5 to /proc/self/clear_refs resets).
"""

from __future__ import annotations

import contextlib
import os
import resource
from pathlib import Path

FDS_PER_NODE = 3
"""Descriptors a simulated node holds: its state file, the file's WAL and its shared memory."""
PROCESS_FDS = 512
"""Descriptors a run's process keeps free for everything but its nodes."""


class TooFewDescriptors(RuntimeError):
    """The process may not open as many files as the nodes asked for need."""


def needed(nodes: int) -> int:
    """Descriptors a run of `nodes` nodes needs in all."""
    return FDS_PER_NODE * nodes + PROCESS_FDS


def raise_soft_limit() -> tuple[int, int]:
    """The soft limit on open files raised to the hard limit (as far as the system lets it);
    returns the (soft, hard) limits in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard and (hard == resource.RLIM_INFINITY or soft < hard):
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def ensure_descriptors(nodes: int) -> int:
    """Raise the soft limit and return it; `TooFewDescriptors` if it cannot hold `nodes` nodes."""
    soft, hard = raise_soft_limit()
    if soft != resource.RLIM_INFINITY and soft < needed(nodes):
        most = max((soft - PROCESS_FDS) // FDS_PER_NODE, 0)
        raise TooFewDescriptors(
            f"{nodes} simulated nodes need {needed(nodes)} open files ({FDS_PER_NODE} a node: "
            f"its state file, WAL and shared memory; {PROCESS_FDS} for the process), and this "
            f"process may open {soft} (soft limit raised to the hard limit, {hard}): at most "
            f"{most} nodes here; run fewer (IPAMD_BENCH_NODES) or raise the hard limit "
            "(ulimit -Hn, LimitNOFILE)"
        )
    return int(soft)


def open_descriptors() -> int:
    """Descriptors the process holds now (-1 where /proc/self/fd cannot be read)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return -1


def _status_kib(field: str) -> float | None:
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(f"{field}:"):
            return float(line.split()[1])
    return None


def rss_mib() -> float:
    """The process's resident set now, MiB (0 where /proc cannot be read)."""
    kib = _status_kib("VmRSS")
    return 0.0 if kib is None else kib / 1024.0


def reset_peak() -> None:
    """Start the resident set's high-water mark over from now (where Linux allows it)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def peak_rss_mib() -> float:
    """The resident set's high-water mark since `reset_peak` (else since the process began), MiB."""
    kib = _status_kib("VmHWM")
    if kib is None:
        kib = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return kib / 1024.0
