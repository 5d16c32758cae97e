"""A burst of pods as VPC CNI measures one: 30 pods created at once through containerd, each pod's
CNI ADD timed as ipamd's plugin process lives it.

The node is the emulated VPC's (`bench.vpc.node`: the world process playing EC2, IMDS and the
fabric, a real containerd, `ipamd run` with its datapath on, the conflist ipamd writes), and its
`ipamd-cni` is the shipped one: the static launcher and the runtime bundled from this interpreter,
installed by `install-cni.sh` as the DaemonSet's init container installs it
(`bench.shipped_plugin`). The bench calls CRI's RunPodSandbox 30 times at once from 30 threads
released together, as a kubelet does when a deployment scales; for each sandbox containerd runs
`loopback`, `ipamd-cni` and the chained `portmap`, and only `ipamd-cni` is timed.

The node's processes share its CPUs as on a node (`bench.vpc.cgroups`): containerd, and so its
shims and the CNI plugins it runs, in `system.slice`; ipamd in its pod's cgroup under
`kubepods/burstable`, weighted by the DaemonSet's CPU request; each pod under
`kubepods/besteffort`, where runc makes its sandbox's cgroup. In one flat group instead, ipamd's
serving thread would get one share among the dozens of processes a burst makes runnable, and each
ADD would queue behind it. Without a writable cgroup CPU controller the family prints no figure.

- `cni_burst_30_pods_p50_ms`, `cni_burst_30_pods_p99_ms`: each burst pod's ADD, from before the
  plugin process exists to after it has exited with its answer. VPC CNI's figure for the same
  burst is the p50 of its plugin's ADD: 5 s, and 0.75 s since aws/amazon-vpc-cni-k8s#3764 (its
  plugin creates the host veth straight in the host's namespace, as ipamd-cni always has). Target:
  p50 at most 250 ms.
- `cni_burst_30_over_cpu_floor`: the burst's wall time (first ADD started to last ADD answered)
  over what 30 lone ADDs take spread over every CPU the bench may use (30 times the lone ADD,
  divided by the CPUs). Target: at most 1.5, an ADD in a burst costing little more than its share
  of the machine. containerd's own work for each sandbox (its shim, runc, the pause process) and
  the kernel's share those CPUs too and are not in the lone ADD.
- `cni_burst_lone_add_ms`: the lone ADD, the floor's unit: a single pod through containerd on the
  same node in the same run, `LONE_RUNS` times one after the other, the median.
- `cni_burst_30_wall_ms`: the burst's wall time itself.
- `cni_burst_30_bare_python_p50_ms`, `cni_burst_bare_python_lone_ms`: the floor of any plugin in
  Python. On the same node, once the burst's pods are gone, the timed plugin is replaced by the
  plugin's own runtime (its interpreter, with the launcher's flags) running nothing but a canned
  answer, and the lone runs and the burst are repeated: the p50 of that burst's ADDs and the
  median lone one. What ipamd-cni adds to an ADD (its imports, the call to ipamd, the interface)
  is the difference; what contention does to an interpreter's start is the floor itself.
- `cni_burst_30_add_cpu_p50_ms`, `cni_burst_lone_add_cpu_ms`: the CPU time (user and system) the
  plugin process itself used in a burst ADD (the p50) and in a lone one (the median). A burst ADD
  whose wall time is many times its CPU time spent the rest waiting for a CPU that the other
  sandboxes' processes held, not for ipamd.

How each ADD is timed (`bench.cni_timing`): the node's CNI bin dir holds, under the name
`ipamd-cni`, a static C wrapper that reads the monotonic clock, forks and execs the installed
plugin with the runtime's arguments, environment and standard streams, waits for it, reads the
clock again and appends a line to a file. ipamd-cni neither logs nor reports its own duration and
ipamd's log sees only its part of an ADD; a timing setting in the plugin would be product code for
benches only and would still miss the interpreter's start; a shell script would add a shell's start
to every ADD. The wrapper costs one fork of a static program, which the figures include.

The pool is not what is measured: `ENABLE_PREFIX_DELEGATION=true` and `MINIMUM_IP_TARGET` = the
burst's pods with no `WARM_IP_TARGET`, so ipamd holds two /28s on the primary ENI (32 addresses)
before the burst and asks EC2 for nothing during it (an m5.large's secondary IPs give pods 27
addresses on 3 ENIs: too few for 30). The burst starts once `/v1/pool` shows the 30 addresses free.
The e2e harness's shortened intervals (chaos' `TUNING`) are cleared so that ipamd's background jobs
run at their defaults, as on a node; the cooldown stays at 1 s so that the lone pods' addresses are
free again before the burst.

The figures are of the whole machine: the emulated cloud, containerd and anything else running on
it share its CPUs with the burst; the load average before the burst goes to stderr. Without root,
gcc or a tool the node needs (containerd, runc, Debian's CNI plugins, nft; what
`tests/e2e/install-packages.sh` installs), the family says so on stderr and prints no figure.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench import cni_timing, shipped_plugin
from bench.cni_timing import Span
from bench.timing import median, p50, p99
from bench.vpc import cgroups
from bench.vpc.cgroups import NodeCgroups
from bench.vpc.node import VpcNode, missing, vpc_node
from bench.vpc.pause.image import PAUSE_IMAGE, build_pause_image
from bench.vpc.processes import wait_until
from chaos.daemon import TUNING

PODS = 30
"""VPC CNI's burst (aws/amazon-vpc-cni-k8s#3764)."""
LONE_RUNS = 5
NAMESPACE = "bench"
KEPT_PACE = ("IP_COOLDOWN_PERIOD", "IPAMD_LOG_FORMAT", "IPAMD_LOG_LEVEL", "IPAMD_HOST_NETWORK")
"""Of chaos' `TUNING` (which the node's environment starts from), what stays; the rest is cleared
(an empty value is the default)."""
RPC_DEADLINE_S = 120.0
DAEMONSET = Path(__file__).resolve().parents[1] / "deploy" / "daemonset.yaml"
BARE_ENTRY = """import os
os.read(0, 1 << 20)
if os.environ.get("CNI_COMMAND") == "ADD":
    n = int(os.environ["CNI_CONTAINERID"][:4], 16)
    print('{"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "sandbox": "%s"}], '
          '"ips": [{"address": "198.18.%d.%d/32", "interface": 0}]}'
          % (os.environ["CNI_NETNS"], n >> 8, n & 255))
"""
"""The bare plugin's program: the config read, and for an ADD an answer with one address of the
benchmarking range (198.18.0.0/15) that containerd records for the sandbox and nothing uses."""


def _note(text: str) -> None:
    print(f"bench: cni_burst: {text}", file=sys.stderr, flush=True)


def unavailable() -> str | None:
    """Why a node cannot be run here, or None when it can."""
    lacking = missing() + ([] if shutil.which("gcc") else ["gcc"])
    if not lacking:
        return None
    return f"lacking {', '.join(lacking)} (tests/e2e/install-packages.sh installs them, as root)"


def node_env(pods: int) -> dict[str, str]:
    """ipamd's settings on the bench's node: `pods` addresses held before the burst, nothing asked
    of EC2 during it, background jobs at their defaults."""
    env = {name: "" for name in TUNING if name not in KEPT_PACE}
    env.update(ENABLE_PREFIX_DELEGATION="true", MINIMUM_IP_TARGET=str(pods), WARM_IP_TARGET="")
    return env


async def run(workdir: Path) -> dict[str, float]:
    return await asyncio.to_thread(measure, workdir, PODS)


def measure(workdir: Path, pods: int, lone_runs: int = LONE_RUNS) -> dict[str, float]:
    """The figures of one burst of `pods` and `lone_runs` lone pods on a node of its own; {} (and
    a line on stderr) when no node can be run here."""
    why = unavailable()
    if why is not None:
        _note(f"skipped: {why}")
        return {}
    records, bare_records = workdir / "cni-runs.jsonl", workdir / "bare-runs.jsonl"
    wrapper = _timed_plugin(workdir, records)
    if isinstance(wrapper, str):
        _note(f"skipped: {wrapper}")
        return {}
    bare = _bare_plugin(workdir, shipped_plugin.bin_dir_of(workdir), bare_records)
    if isinstance(bare, str):
        _note(f"skipped: {bare}")
        return {}
    cgroups = node_cgroups(f"ipamd-bench-{os.getpid()}")
    if isinstance(cgroups, str):
        _note(f"skipped: {cgroups}")
        return {}
    (workdir / "pause").mkdir()
    pause_image = build_pause_image(workdir / "pause", PAUSE_IMAGE)
    try:
        with vpc_node(pause_image, "on", node_env(pods), cgroups=cgroups) as node:
            _install(node, wrapper)
            node.remove_pod(node.run_pod("warm-up"))  # the node's first ADD and DEL, untimed
            lone = _lone(node, "lone", lone_runs)
            _wait_free(node, pods)
            _note(f"load average {os.getloadavg()[0]:.2f} before the burst of {pods}")
            burst = _burst(node, pods, "burst")
            for sandbox_id in burst:
                node.remove_pod(sandbox_id)
            _install(node, bare)
            bare_lone = _lone(node, "bare-lone", lone_runs)
            bare_burst = _burst(node, pods, "bare-burst")
    finally:
        for left in cgroups.close():
            _note(f"cgroup left behind: {left}")
    spans, bare_spans = cni_timing.read(records), cni_timing.read(bare_records)
    cpus = len(os.sched_getaffinity(0))
    return figures(_adds(spans, burst), _adds(spans, lone), cpus) | bare_figures(
        _adds(bare_spans, bare_burst), _adds(bare_spans, bare_lone)
    )


def _install(node: VpcNode, plugin: Path) -> None:
    """`plugin` as the node's `ipamd-cni`, replaced by rename as install-cni.sh replaces it: each
    run from then on runs the new file."""
    staged = node.cni_bin / ".ipamd-cni.timed"
    shutil.copy2(plugin, staged)
    staged.replace(node.cni_bin / "ipamd-cni")


def _lone(node: VpcNode, name: str, runs: int) -> list[str]:
    """`runs` pods one after the other, then removed: their sandboxes' IDs."""
    sandbox_ids = [node.run_pod(f"{name}-{n}") for n in range(runs)]
    for sandbox_id in sandbox_ids:
        node.remove_pod(sandbox_id)
    return sandbox_ids


def _bare_plugin(workdir: Path, cni_bin: Path, records: Path) -> Path | str:
    """The bare plugin behind its own timing wrapper: the runtime installed in `cni_bin` started as
    the launcher starts it (`ld.so --library-path lib bin/python3 -I -S -B`) on `BARE_ENTRY`, from
    a shell script that execs it (the shell's start stands for the launcher's)."""
    runtime = (cni_bin / "ipamd-cni.d" / "current").resolve()
    script = workdir / "bare" / "ipamd-cni-bare"
    script.parent.mkdir()
    argv = [
        str(runtime / "lib" / "ld.so"),
        "--library-path",
        str(runtime / "lib"),
        str(runtime / "bin" / "python3"),
        *("-I", "-S", "-B", "-c", BARE_ENTRY),
    ]
    script.write_text(f"#!/bin/sh\nexec {shlex.join(argv)}\n")
    script.chmod(0o755)
    wrapper = workdir / "bare" / "ipamd-cni"
    why = cni_timing.build(script, records, wrapper)
    return wrapper if why is None else why


def _timed_plugin(workdir: Path, records: Path) -> Path | str:
    """The shipped plugin installed in `workdir`, and its timing wrapper: the wrapper's path, or
    why it cannot be built."""
    bundle = shipped_plugin.build_bundle(workdir)
    installed = shipped_plugin.install(workdir, bundle)
    if isinstance(installed, str):
        return installed
    wrapper = workdir / "timing" / "ipamd-cni"
    wrapper.parent.mkdir()
    why = cni_timing.build(installed, records, wrapper)
    return wrapper if why is None else why


def node_cgroups(root: str) -> NodeCgroups | str:
    """The bench node's CPU cgroups (`bench.vpc.cgroups`) with ipamd's CPU request and limit as
    the DaemonSet declares them, or why they cannot be made here."""
    request, limit = cgroups.pod_cpu(DAEMONSET, "ipamd")
    return NodeCgroups.open(root, len(os.sched_getaffinity(0)), request, limit)


def _wait_free(node: VpcNode, pods: int) -> None:
    def free() -> bool | None:
        counts = node.daemon.get("/v1/pool")["counts"]
        assert isinstance(counts, dict)
        return True if int(counts["free"]) >= pods else None

    wait_until(free, f"{pods} free addresses", 120.0)


def _burst(node: VpcNode, pods: int, name: str) -> list[str]:
    """RunPodSandbox `pods` times at once, each pod in its cgroup; the sandboxes' IDs
    (CNI_CONTAINERID of their ADDs)."""
    client = node.runtime.client
    uids = [f"uid-{name}-{n}" for n in range(pods)]
    parents = [node.pod_cgroup(uid) for uid in uids]  # made before, as the kubelet makes them
    start = threading.Barrier(pods, timeout=RPC_DEADLINE_S)

    def one(n: int) -> str:
        start.wait()
        return client.run_sandbox(NAMESPACE, f"{name}-{n}", uids[n], cgroup_parent=parents[n])

    with ThreadPoolExecutor(max_workers=pods) as pool:
        return list(pool.map(one, range(pods)))


def _adds(spans: Sequence[Span], sandbox_ids: Sequence[str]) -> list[Span]:
    """The one ADD of each sandbox, in `sandbox_ids`' order."""
    by_id = {s.container_id: s for s in spans if s.command == "ADD"}
    lacking = [sandbox_id for sandbox_id in sandbox_ids if sandbox_id not in by_id]
    if lacking:
        raise RuntimeError(f"no ADD recorded for sandboxes {lacking}")
    failed = [by_id[s] for s in sandbox_ids if by_id[s].status != 0]
    if failed:
        raise RuntimeError(f"ADDs that failed: {failed}")
    return [by_id[sandbox_id] for sandbox_id in sandbox_ids]


def figures(burst: Sequence[Span], lone: Sequence[Span], cpus: int) -> dict[str, float]:
    """The family's figures from the burst's ADDs and the lone ones; `cpus` the CPUs the runs
    could use."""
    pods = len(burst)
    wall_ms = (max(s.answered_ns for s in burst) - min(s.started_ns for s in burst)) / 1e6
    lone_ms = median([s.ms for s in lone])
    floor_ms = pods * lone_ms / cpus
    durations = [s.ms for s in burst]
    return {
        f"cni_burst_{pods}_add_cpu_p50_ms": p50([s.cpu_ms for s in burst]),
        "cni_burst_lone_add_cpu_ms": median([s.cpu_ms for s in lone]),
        f"cni_burst_{pods}_pods_p50_ms": p50(durations),
        f"cni_burst_{pods}_pods_p99_ms": p99(durations),
        f"cni_burst_{pods}_over_cpu_floor": wall_ms / floor_ms,
        f"cni_burst_{pods}_wall_ms": wall_ms,
        "cni_burst_lone_add_ms": lone_ms,
    }


def bare_figures(burst: Sequence[Span], lone: Sequence[Span]) -> dict[str, float]:
    """The bare plugin's figures: its burst's p50 and its median lone run."""
    return {
        f"cni_burst_{len(burst)}_bare_python_p50_ms": p50([s.ms for s in burst]),
        "cni_burst_bare_python_lone_ms": median([s.ms for s in lone]),
    }
