"""Each run of a CNI plugin timed as the plugin process lives it, for the benches that run pods
through a real runtime: `build` makes the wrapper (`cni_timing.c`) that stands in the node's CNI
bin dir under the plugin's name and times each run of the real plugin, `read` what it recorded.

Why a wrapper: `ipamd-cni` neither logs nor reports its own duration, and ipamd's log sees an ADD
only from its request to its answer (not the interpreter's start, the interface, the policy call).
Timing inside the plugin would mean a setting in the product that only benches use, and would
still miss the interpreter's start, the largest part of a lone ADD. A shell script around it would
add a shell's start to every run. The wrapper adds one fork of a static C program (the plugin's
VERSION takes the same time with it and without it, to within the runs' noise of a millisecond),
and no byte of what the plugin reads or answers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from bench.shipped_plugin import link_static

SOURCE = Path(__file__).resolve().parent / "cni_timing.c"


@dataclass(frozen=True, slots=True)
class Span:
    """One run of the plugin: from before its process existed to after it was gone (monotonic
    nanoseconds, one clock for every process on the machine)."""

    command: str
    container_id: str
    ifname: str
    started_ns: int
    answered_ns: int
    status: int
    cpu_ns: int = 0
    """The plugin process's CPU time, user and system (0 in records written before it was kept)."""

    @property
    def ms(self) -> float:
        return (self.answered_ns - self.started_ns) / 1e6

    @property
    def cpu_ms(self) -> float:
        return self.cpu_ns / 1e6


def build(plugin: Path, records: Path, out: Path) -> str | None:
    """Links the wrapper of `plugin` at `out`, appending to `records`: None once done, else why not
    (gcc absent, or no static libc)."""
    for path in (plugin, records):
        if '"' in str(path) or "\\" in str(path):
            raise ValueError(f"{path} cannot be a C string literal as it is")
    return link_static(SOURCE, out, f'PLUGIN="{plugin}"', f'RECORDS="{records}"')


def read(records: Path) -> list[Span]:
    """Every run recorded so far, in the order they ended."""
    if not records.exists():
        return []
    return [Span(**json.loads(line)) for line in records.read_text().splitlines() if line]
