"""What a pod's ADD costs in the CNI plugin, measured from outside as the node's runtime pays it:
whole processes, from spawn to exit.

- `cni_plugin_add_p50_ms`: the shipped plugin (the static launcher and bundled runtime built from
  this interpreter as the image's build stage builds them, installed by the init container's
  `install-cni.sh` into a bin dir in the workdir) as an IPAM plugin (ptp's conf: no interface),
  ADD against `ipamd run --embedded` in its own process, socket and state dir; DEL after, untimed.
- `cni_pod_add_p50_ms`: the same plugin as the interface plugin, given the shipped conflist's
  plugin conf (`type` `ipamd-cni`) as a runtime hands it: the allocation and the pod's veth, into
  a pod namespace made before and deleted after (its DEL between, all untimed), the host end in
  a namespace for the node's (`bench.netns`) which the bench's thread is in during the loop, so
  every process of it starts there with no `nsenter` in any span. Root only.
- `cni_pod_add_over_ipam_add`: the interface-mode p50 over the IPAM-mode p50 of the same loop;
  the target is at most 1.5. Both pay the same Python start and daemon call; the interface mode
  adds what ptp does after its IPAM plugin returns (a veth pair, an address, routes, neighbours:
  about ten netlink round trips, a few ms). Half again the IPAM ADD leaves room for that on a
  loaded node; an interface mode costing more than a second plugin process would not beat ptp.
- `cni_plugin_version_p50_ms`: the same plugin answering VERSION: start-up only, no daemon.
- `python_bare_start_p50_ms`: the bundle's interpreter started as the launcher starts it (its own
  loader and libraries) running `-I -S -c pass`: the floor of any Python plugin.
- `cni_plugin_start_ratio`: VERSION over the bare start; the target is at most 2.0.
- `host_local_add_p50_ms`: Debian's Go `host-local` IPAM plugin doing an ADD (then DEL, untimed)
  with its data dir in the workdir: the reference.

The daemon keeps `WARM_IP_TARGET` addresses free with no cooldown, so no ADD waits for the pool;
timing starts once the pool holds them, after one untimed ADD in each mode, the first retried
while the daemon answers "try again later" (CNI code 11). Every figure's runs alternate in one
loop, so each sees the same machine at the same moments.

Without gcc (the launcher is linked statically) the plugin's figures are skipped, without
`/usr/lib/cni/host-local` the reference is, and without root (or `ip`) the interface mode's are;
each is said on stderr. Nothing here touches the machine's network namespace: IPAM plugins never
enter CNI_NETNS (a path that does not exist), the interface plugin works only in namespaces the
bench makes and deletes even on failure, ipamd runs embedded with host networking off, writes no
conflist and listens on no port.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

from bench import netns, shipped_plugin
from bench.timing import p50
from bench.vpc.processes import terminate
from ipamd.cni.client import BadAnswer, DaemonError, Unreachable, call
from ipamd.wire import PATH_POOL, PATH_READYZ

RUNS = 50
WARM_IPS = 20
"""The daemon's WARM_IP_TARGET: an embedded m5.large holds 27 pod addresses."""
CONFLIST = Path(__file__).resolve().parents[1] / "deploy" / "cni" / "10-ipamd.conflist"
HOST_LOCAL = Path("/usr/lib/cni/host-local")
"""Debian's reference IPAM plugin (package containernetworking-plugins)."""
NETNS = "/var/run/netns/ipamd-bench-absent"
"""CNI_NETNS of every ADD: required by the spec, never opened by an IPAM plugin."""
CNI_VERSION = "1.0.0"
"""The shipped conflist's, which containerd 1.6 uses."""
TRY_AGAIN = 11


def _note(text: str) -> None:
    print(f"bench: plugin: {text}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Ran:
    elapsed_ms: float
    returncode: int
    stdout: bytes
    stderr: bytes


def _run(argv: list[str], env: dict[str, str], stdin: bytes = b"") -> Ran:
    start = time.perf_counter()
    done = subprocess.run(argv, input=stdin, env=env, capture_output=True, timeout=60, check=False)
    elapsed = (time.perf_counter() - start) * 1000.0
    return Ran(elapsed, done.returncode, done.stdout, done.stderr)


def _cni_error_code(ran: Ran) -> object:
    try:
        answer = json.loads(ran.stdout)
    except ValueError:
        return None
    return answer.get("code") if isinstance(answer, dict) else None


# -- the shipped plugin ----------------------------------------------------------------------------


def _bare_python(bundle: Path) -> list[str]:
    """The runtime's interpreter as `cni-launcher.c` starts it, with nothing to import."""
    lib = bundle / "lib"
    python = bundle / "bin" / "python3"
    return [str(lib / "ld.so"), "--library-path", str(lib), str(python), "-I", "-S", "-c", "pass"]


# -- the daemon ------------------------------------------------------------------------------------


class Daemon:
    """`ipamd run --embedded` in its own process: socket, state and log in `workdir`."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.socket = workdir / "ipamd.sock"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("IPAMD_", "WARM_", "AWS_"))}
        env.update(
            IPAMD_STATE_DIR=str(workdir / "state"),
            IPAMD_SOCKET=str(self.socket),
            IPAMD_CRI_SOCKET=str(workdir / "no-runtime.sock"),
            IPAMD_LOG_FORMAT="json",
            IPAMD_HOST_NETWORK="off",
            # No listening ports: a run next to another daemon (a test's) must not collide.
            DISABLE_METRICS="true",
            DISABLE_INTROSPECTION="true",
            WARM_IP_TARGET=str(WARM_IPS),
            # A DEL's address is free again at once: the next ADD never waits for the pool.
            IP_COOLDOWN_PERIOD="0",
        )
        env.pop("IPAMD_MAX_PODS", None)
        self._log = (workdir / "ipamd.log").open("ab")
        self.process = subprocess.Popen(
            [str(Path(sys.executable).parent / "ipamd"), "run", "--embedded"],
            env=env,
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )

    def _alive(self) -> None:
        if self.process.poll() is not None:
            tail = (self.workdir / "ipamd.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"ipamd exited with {self.process.returncode}:\n{tail}")

    async def wait_ready(self, deadline_s: float = 90.0) -> None:
        """Until `/readyz` answers 200 and the pool holds `WARM_IPS` free addresses."""
        end = time.monotonic() + deadline_s
        while True:
            self._alive()
            try:
                call(str(self.socket), "GET", PATH_READYZ, timeout=5)
                pool = call(str(self.socket), "GET", PATH_POOL, timeout=5)
            except (Unreachable, DaemonError, BadAnswer):
                pool = None
            counts = pool.get("counts") if isinstance(pool, dict) else None
            if isinstance(counts, dict) and counts.get("free", 0) >= WARM_IPS:
                return
            if time.monotonic() > end:
                raise RuntimeError(f"ipamd not ready with {WARM_IPS} free addresses in time")
            await asyncio.sleep(0.1)

    def stop(self) -> None:
        terminate(self.process)
        self._log.close()


# -- one CNI call ----------------------------------------------------------------------------------


def _cni_env(
    command: str, container_id: str, extra: dict[str, str] | None = None
) -> dict[str, str]:
    """What a runtime sets for one attachment, as containerd does for a pod's eth0."""
    return {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": container_id,
        "CNI_NETNS": NETNS,
        "CNI_IFNAME": "eth0",
        "CNI_PATH": str(HOST_LOCAL.parent),
        "CNI_ARGS": (
            f"IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME={container_id};"
            f"K8S_POD_INFRA_CONTAINER_ID={container_id};K8S_POD_UID=uid-{container_id}"
        ),
        **(extra or {}),
    }


def _conf(ipam: dict[str, object]) -> bytes:
    """The network config an interface plugin (ptp) hands its IPAM plugin: its own, whole."""
    conf = {"cniVersion": CNI_VERSION, "name": "ipamd-bench", "type": "ptp", "ipam": ipam}
    return json.dumps(conf).encode()


def _pod_conf(socket: Path) -> bytes:
    """The shipped conflist's `ipamd-cni` as a runtime hands it its conf (the list's cniVersion and
    name added), its socket this bench's daemon's. The plugins chained after it (portmap) are the
    runtime's to run, not this bench's."""
    whole = json.loads(CONFLIST.read_text())
    (plugin,) = [p for p in whole["plugins"] if p["type"] == "ipamd-cni"]
    plugin["ipam"] = {**plugin["ipam"], "socket": str(socket)}
    conf = {"cniVersion": whole["cniVersion"], "name": whole["name"], **plugin}
    return json.dumps(conf).encode()


def _add_then_del(plugin: Path, conf: bytes, container_id: str, netns_path: str = NETNS) -> Ran:
    """A timed ADD, then its untimed DEL; fails on any error."""
    extra = {"CNI_NETNS": netns_path}
    added = _run([str(plugin)], _cni_env("ADD", container_id, extra), conf)
    if added.returncode != 0:
        raise RuntimeError(f"{plugin.name} ADD failed: {added.stdout!r} {added.stderr!r}")
    deleted = _run([str(plugin)], _cni_env("DEL", container_id, extra), conf)
    if deleted.returncode != 0:
        raise RuntimeError(f"{plugin.name} DEL failed: {deleted.stdout!r} {deleted.stderr!r}")
    return added


def _pod_add(plugin: Path, conf: bytes, pods: netns.Pods, container_id: str) -> Ran:
    """An interface-mode ADD (timed) into a pod namespace made for it, then its DEL and the
    namespace's removal (untimed)."""
    with pods.pod() as pod_path:
        return _add_then_del(plugin, conf, container_id, pod_path)


async def _first_add(plugin: Path, conf: bytes, deadline_s: float = 60.0) -> None:
    """One untimed ADD and DEL, the ADD retried while ipamd says "try again later"."""
    end = time.monotonic() + deadline_s
    while True:
        added = _run([str(plugin)], _cni_env("ADD", "bench-warmup"), conf)
        if added.returncode == 0:
            break
        if _cni_error_code(added) != TRY_AGAIN or time.monotonic() > end:
            raise RuntimeError(f"the first ADD failed: {added.stdout!r} {added.stderr!r}")
        await asyncio.sleep(0.1)
    _run([str(plugin)], _cni_env("DEL", "bench-warmup"), conf)


# -- the family ------------------------------------------------------------------------------------

Probe = Callable[[int], float]
"""One run of one figure: its elapsed ms, given the run's number."""


async def run(workdir: Path) -> dict[str, float]:
    bundle = shipped_plugin.build_bundle(workdir)
    installed = shipped_plugin.install(workdir, bundle)
    plugin = installed if isinstance(installed, Path) else None
    if isinstance(installed, str):
        _note(f"{installed} (the launcher is linked statically): cni_plugin_* figures skipped")
    host_local = HOST_LOCAL if os.access(HOST_LOCAL, os.X_OK) else None
    if host_local is None:
        _note(f"{HOST_LOCAL} absent (package containernetworking-plugins): host_local skipped")
    daemon = None if plugin is None else Daemon(workdir)
    try:
        if daemon is not None and plugin is not None:
            await daemon.wait_ready()
            ours = _conf({"type": "ipamd-cni", "socket": str(daemon.socket)})
            await _first_add(plugin, ours)
        why = "the plugin is not built" if plugin is None else netns.unavailable()
        if why is not None:
            _note(f"{why}: cni_pod_add_* figures skipped")
        node: AbstractContextManager[netns.Pods | None] = (
            nullcontext() if why is not None else netns.node_namespace("ipamd-bench")
        )
        with node as pods:
            if pods is not None and plugin is not None and daemon is not None:
                # Untimed, as the IPAM mode's first: it also turns on the node's ip_forward once.
                _pod_add(plugin, _pod_conf(daemon.socket), pods, "bench-pod-warmup")
            probes = _probes(workdir, bundle, plugin, daemon, host_local, pods)
            return _measure(probes)
    finally:
        if daemon is not None:
            daemon.stop()


def _version(plugin: Path) -> float:
    version = _run([str(plugin)], {"CNI_COMMAND": "VERSION"})
    if version.returncode != 0:
        raise RuntimeError(f"VERSION failed: {version.stdout!r} {version.stderr!r}")
    return version.elapsed_ms


def _probes(
    workdir: Path,
    bundle: Path,
    plugin: Path | None,
    daemon: Daemon | None,
    host_local: Path | None,
    pods: netns.Pods | None,
) -> dict[str, Probe]:
    """Each figure's run, in the order the loop alternates them."""
    bare = _bare_python(bundle)
    probes: dict[str, Probe] = {"python_bare_start_p50_ms": lambda n: _run(bare, {}).elapsed_ms}
    if plugin is not None and daemon is not None:
        ours = _conf({"type": "ipamd-cni", "socket": str(daemon.socket)})
        probes["cni_plugin_version_p50_ms"] = lambda n: _version(plugin)
        probes["cni_plugin_add_p50_ms"] = lambda n: (
            _add_then_del(plugin, ours, f"bench-ipamd-{n}").elapsed_ms
        )
        if pods is not None:
            pod_conf = _pod_conf(daemon.socket)
            probes["cni_pod_add_p50_ms"] = lambda n: (
                _pod_add(plugin, pod_conf, pods, f"bench-pod-{n}").elapsed_ms
            )
    if host_local is not None:
        reference = _conf(
            {
                "type": "host-local",
                "ranges": [[{"subnet": "10.255.0.0/16"}]],
                "dataDir": str(workdir / "host-local"),
            }
        )
        probes["host_local_add_p50_ms"] = lambda n: (
            _add_then_del(host_local, reference, f"bench-host-local-{n}").elapsed_ms
        )
    return probes


def _measure(probes: dict[str, Probe]) -> dict[str, float]:
    samples: dict[str, list[float]] = {name: [] for name in probes}
    for n in range(RUNS):
        for name, probe in probes.items():
            samples[name].append(probe(n))
    figures = {name: p50(values) for name, values in samples.items()}
    if "cni_plugin_version_p50_ms" in figures:
        ratio = figures["cni_plugin_version_p50_ms"] / figures["python_bare_start_p50_ms"]
        figures["cni_plugin_start_ratio"] = ratio
    if "cni_pod_add_p50_ms" in figures:
        ratio = figures["cni_pod_add_p50_ms"] / figures["cni_plugin_add_p50_ms"]
        figures["cni_pod_add_over_ipam_add"] = ratio
    order = (
        "cni_plugin_add_p50_ms",
        "cni_pod_add_p50_ms",
        "cni_pod_add_over_ipam_add",
        "cni_plugin_version_p50_ms",
        "python_bare_start_p50_ms",
        "cni_plugin_start_ratio",
        "host_local_add_p50_ms",
    )
    return {name: figures[name] for name in order if name in figures}
