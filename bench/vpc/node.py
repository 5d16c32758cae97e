"""A node in the emulated VPC: one `VpcNode` is a whole node in its own namespaces, for the
end-to-end tests (`tests/e2e/vpc/harness.py` adds the probes they read it by) and the benches that
run pods through containerd.

`vpc_node()` creates the four network namespaces (`fabric.Namespaces`), starts the world process
(`bench.vpc.world`) in the node's namespace and waits for its ready file, starts containerd there
(the pause image imported, a CNI bin dir with loopback, host-local, portmap and ipamd-cni), then
`ipamd run` there too, pointed at the world's EC2 and IMDS, with `IPAMD_HOST_NETWORK` as the caller
asks. ipamd writes the conflist into containerd's conf dir once ready. With `ipv6=True` the world's
VPC is dual-stack (`fabric_ipv6`) and ipamd runs in IPv6 mode (`IPV6_ENV`). On the way out,
whatever happened: the pods are removed over CRI (their DELs reach ipamd), containerd, ipamd and the
world are stopped, the namespaces deleted and the work dir removed. A failure prints the logs' tails
and the node's rules.

It checks nothing of the machine itself: `missing` says what a node needs that is not there (the
tests skip or fail on it, a bench reports it). Nothing here runs a command in the caller's own
network namespace: every one names its namespace (`ip -n`, `nsenter --net=`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import grpc

from bench.vpc.cgroups import NodeCgroups
from bench.vpc.containerd import Containerd
from bench.vpc.fabric import Namespaces, in_netns, netns_path, run
from bench.vpc.pause.image import PAUSE_IMAGE
from bench.vpc.processes import (
    BIN,
    SYSTEM_CNI_DIR,
    Ipamd,
    add_netns,
    delete_netns,
    free_port,
    make_workdir,
    plugin_dir,
    terminate,
    wait_until,
)
from bench.vpc.ready import Ready
from chaos.daemon import Endpoints, daemon_environment

REPO = Path(__file__).resolve().parents[2]
DEPLOYED_CONFLIST = REPO / "deploy" / "cni" / "10-ipamd.conflist"
TOOLS = ("containerd", "runc", "ctr", "ip", "nsenter", "nft", "ping")
"""What a node needs on PATH (Debian: containerd, runc, iproute2, util-linux, nftables,
iputils-ping)."""
PLUGINS = ("loopback", "host-local", "portmap")
"""What a node's CNI bin dir takes from Debian's (`SYSTEM_CNI_DIR`, containernetworking-plugins)."""

IPV6_ENV = {"ENABLE_IPv6": "true", "ENABLE_IPv4": "false", "ENABLE_PREFIX_DELEGATION": "true"}
"""VPC CNI's settings of an IPv6 node."""
LEAK_GRACE_S = 10
"""ipamd's leak grace: longer than any RunPodSandbox here (whose allocation exists before the sandbox
is listed), short enough that an allocation orphaned by a killed ipamd goes within a test."""


@dataclass
class VpcNode:
    """A node of real processes in the emulated VPC: its bring-up, its pods over CRI, its
    teardown."""

    workdir: Path
    ns: Namespaces
    ipamd_env: dict[str, str] = field(default_factory=dict)
    world: subprocess.Popen[bytes] | None = None
    ready: Ready | None = None
    containerd: Containerd | None = None
    ipamd: Ipamd | None = None
    made_namespaces: list[str] = field(default_factory=list)
    exit_log: str = ""
    """ipamd's log tail when its last stop did not exit 0."""
    cgroups: NodeCgroups | None = None
    """The node's CPU cgroups as the kubelet lays them out (containerd, ipamd and each pod in
    theirs), or None: every process in the caller's."""
    _netns_paths: dict[str, str] = field(default_factory=dict)

    # -- bring-up ---------------------------------------------------------------------------------

    def start_world(self, ipv6: bool = False) -> Ready:
        """The world process; `ipv6` makes its VPC dual-stack (`fabric_ipv6`)."""
        for name in self.ns.all():
            add_netns(name)
            self.made_namespaces.append(name)
        ready_file = self.workdir / "world.ready"
        config = self.workdir / "world.json"
        config.write_text(
            json.dumps(
                {"namespaces": self.ns.to_json(), "ready_file": str(ready_file), "ipv6": ipv6}
            )
        )
        with (self.workdir / "world.log").open("ab") as log:
            self.world = subprocess.Popen(
                in_netns(self.ns.node, sys.executable, "-m", "bench.vpc.world", str(config)),
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        world = self.world

        def written() -> bool | None:
            assert world.poll() is None, f"the world process exited:\n{self.world_log()}"
            return True if ready_file.exists() else None

        wait_until(written, "the world's ready file", 60.0)
        self.ready = Ready.read(ready_file)
        return self.ready

    @property
    def cni_bin(self) -> Path:
        """containerd's CNI bin dir, where a plugin may be replaced by rename as the DaemonSet's
        init container replaces it: the runtime executes whatever the name holds at each call."""
        return self.workdir / "bin"

    def start_containerd(self, pause_image: Path) -> Containerd:
        """containerd in the node; its CNI bin dir holds loopback, host-local (the IPAM of an IPv6
        pod's IPv4 egress interface), portmap (hostPort, chained by the conflist) and ipamd-cni."""
        cni_bin = plugin_dir(
            self.cni_bin,
            SYSTEM_CNI_DIR / "loopback",
            SYSTEM_CNI_DIR / "host-local",
            SYSTEM_CNI_DIR / "portmap",
        )
        (self.workdir / "net.d").mkdir()
        (self.workdir / "containerd").mkdir()
        self.containerd = Containerd.create(
            self.workdir / "containerd",
            cni_bin=cni_bin,
            cni_conf=self.workdir / "net.d",
            sandbox_image=PAUSE_IMAGE,
            netns=netns_path(self.ns.node),
            launcher=self.cgroups.enter("system.slice", []) if self.cgroups else (),
        )
        self.containerd.start()
        self.containerd.import_image(pause_image)
        return self.containerd

    def configure_ipamd(self, host_network: str, extra: Mapping[str, str]) -> None:
        ready, containerd = self.world_ready, self.runtime
        ends = Endpoints(
            ec2_url=ready.ec2_url,
            imds_url=ready.imds_url,
            region=ready.region,
            cri_socket=containerd.socket,
            state_dir=self.workdir / "state",
            socket_path=self.workdir / "ipamd.sock",
            metrics_port=free_port(),  # in the node's namespace; only needs to be a port
        )
        self.ipamd_env = daemon_environment(ends, os.environ)
        self.ipamd_env.update(
            IPAMD_CNI_CONF_DIR=str(self.workdir / "net.d"),
            IPAMD_CNI_CONFLIST_TEMPLATE=str(DEPLOYED_CONFLIST),
            IPAMD_HOST_NETWORK=host_network,
            IPAMD_LEAK_GRACE=str(LEAK_GRACE_S),
            # The conflist tells the plugin, which containerd runs on this machine, where to log.
            AWS_VPC_K8S_PLUGIN_LOG_FILE=str(self.workdir / "plugin.log"),
        )
        self.ipamd_env.update(extra)

    def start_ipamd(self) -> Ipamd:
        """`ipamd run` in the node's namespace (not `--embedded`: the world outlives ipamd)."""
        assert self.ipamd is None or self.ipamd.process.poll() is not None, "ipamd is running"
        env = self.ipamd_env
        command = in_netns(self.ns.node, str(BIN / "ipamd"), "run")
        if self.cgroups is not None:
            command = self.cgroups.enter("kubepods/burstable/pod-ipamd", command)
        with (self.workdir / "ipamd.log").open("ab") as log:
            process = subprocess.Popen(
                command,
                env=env,
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        metrics_port = int(env["IPAMD_METRICS_ADDR"].rpartition(":")[2])
        self.ipamd = Ipamd(process, self.workdir, Path(env["IPAMD_SOCKET"]), metrics_port)
        return self.ipamd

    def kill_ipamd(self) -> None:
        """SIGKILL: nothing of ipamd's own clean-up runs."""
        daemon = self.daemon
        if daemon.process.poll() is None:
            daemon.process.send_signal(signal.SIGKILL)
        daemon.process.wait(timeout=30)

    def wait_ipamd_ready(self, deadline_s: float = 60.0, every_s: float = 0.1) -> None:
        daemon = self.daemon

        def ready() -> bool | None:
            assert daemon.process.poll() is None, f"ipamd exited:\n{daemon.log_tail()}"
            try:
                return True if daemon.call("GET", "/readyz")[0] == 200 else None
            except OSError:
                return None

        wait_until(ready, "ipamd ready", deadline_s, every_s)

    @property
    def world_ready(self) -> Ready:
        assert self.ready is not None, "the world was not started"
        return self.ready

    @property
    def runtime(self) -> Containerd:
        assert self.containerd is not None, "containerd was not started"
        return self.containerd

    @property
    def daemon(self) -> Ipamd:
        assert self.ipamd is not None, "ipamd was not started"
        return self.ipamd

    # -- pods -------------------------------------------------------------------------------------

    def run_pod(
        self, name: str, deadline_s: float = 90.0, host_ports: Mapping[int, int] | None = None
    ) -> str:
        """RunPodSandbox, retried as the kubelet retries while ipamd answers "try again later" (the
        pool is growing: an ENI being attached, or its link not set up yet). `host_ports`: host
        port → the pod's TCP port, the pod's `hostPort`s."""
        client = self.runtime.client
        failure: list[str] = []

        parent = self.pod_cgroup(f"uid-{name}")

        def started() -> str | None:
            try:
                return client.run_sandbox(
                    "e2e", name, f"uid-{name}", host_ports=host_ports, cgroup_parent=parent
                )
            except grpc.RpcError as err:
                if "try again later" not in str(err.details()):
                    raise
                failure[:] = [str(err.details())]
                return None

        try:
            return wait_until(started, f"pod {name} running", deadline_s, every_s=0.2)
        except AssertionError as err:
            raise AssertionError(f"{err}; last error: {failure}") from None

    def pod_cgroup(self, uid: str) -> str:
        """The `cgroup_parent` of the pod `uid` ("" without the node's cgroups)."""
        return "" if self.cgroups is None else self.cgroups.pod_parent(uid)

    def run_pod_through_failures(self, name: str, deadline_s: float = 120.0) -> str:
        """RunPodSandbox retried on any error (ipamd may be dead or restarting). A failed run whose
        network teardown also failed leaves a sandbox that holds the name: the kubelet removes it
        before trying again, and so does this."""
        client = self.runtime.client
        failure: list[str] = []

        def started() -> str | None:
            try:
                return client.run_sandbox("e2e", name, f"uid-{name}")
            except grpc.RpcError as err:
                failure[:] = [str(err.details())]
            for sandbox in client.list_sandboxes():
                if sandbox.metadata.name == name:
                    with contextlib.suppress(grpc.RpcError):
                        client.remove_sandbox(sandbox.id)
            return None

        try:
            return wait_until(started, f"pod {name} running", deadline_s, every_s=0.2)
        except AssertionError as err:
            raise AssertionError(f"{err}; last error: {failure}") from None

    def remove_pod(self, sandbox_id: str, deadline_s: float = 60.0) -> None:
        """RemovePodSandbox (which stops the sandbox first, with a DEL), retried on errors."""
        client = self.runtime.client
        failure: list[str] = []

        def removed() -> bool | None:
            try:
                client.remove_sandbox(sandbox_id)
                return True
            except grpc.RpcError as err:
                failure[:] = [str(err.details())]
                return None

        try:
            wait_until(removed, f"sandbox {sandbox_id} removed", deadline_s, every_s=0.2)
        except AssertionError as err:
            raise AssertionError(f"{err}; last error: {failure}") from None
        self._netns_paths.pop(sandbox_id, None)

    def netns_of(self, sandbox_id: str) -> str:
        if sandbox_id not in self._netns_paths:
            self._netns_paths[sandbox_id] = self.runtime.netns_path(sandbox_id)
        return self._netns_paths[sandbox_id]

    # -- teardown ---------------------------------------------------------------------------------

    def world_log(self, chars: int = 4000) -> str:
        path = self.workdir / "world.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def diagnostics(self) -> str:
        """What to read when a test fails: the logs' tails and the node's kernel state."""
        parts = [f"== world log\n{self.world_log()}"]
        if self.ipamd is not None:
            parts.append(f"== ipamd log\n{self.ipamd.log_tail(8000)}")
        if self.containerd is not None:
            parts.append(f"== containerd log\n{self.containerd.log_tail(2000)}")
        for title, argv in (
            ("node rules", ["ip", "-n", self.ns.node, "rule", "show"]),
            ("node routes", ["ip", "-n", self.ns.node, "route", "show", "table", "all"]),
            ("node links", ["ip", "-n", self.ns.node, "-br", "addr"]),
            ("vpc routes", ["ip", "-n", self.ns.vpc, "route"]),
            ("vpc nft", in_netns(self.ns.vpc, "nft", "list", "ruleset")),
            ("node nft", in_netns(self.ns.node, "nft", "list", "ruleset")),
        ):
            with contextlib.suppress(Exception):
                parts.append(f"== {title}\n{run(argv)}")
        return "\n".join(parts)

    def close(self) -> int:
        """Leaves nothing behind; returns ipamd's exit code after a SIGTERM (0 when never started)."""
        code = 0
        try:
            if self.containerd is not None:
                self.containerd.cleanup()  # first: the DELs of the pods it stops go to ipamd
        finally:
            try:
                if self.ipamd is not None:
                    code = self.ipamd.stop()
                    if code != 0:
                        self.exit_log = self.ipamd.log_tail()  # the work dir goes next
            finally:
                try:
                    self._stop_world()
                finally:
                    for name in self.made_namespaces:
                        delete_netns(name)
                    shutil.rmtree(self.workdir, ignore_errors=True)
        return code

    def _stop_world(self) -> None:
        if self.world is not None:
            terminate(self.world)


def missing() -> list[str]:
    """What this machine lacks of what a node needs: root, `TOOLS`, `PLUGINS`; [] when nothing."""
    lacking = [] if os.geteuid() == 0 else ["root (network namespaces, veths, containerd)"]
    lacking += [tool for tool in TOOLS if shutil.which(tool) is None]
    return lacking + [
        f"{SYSTEM_CNI_DIR}/{p}" for p in PLUGINS if not (SYSTEM_CNI_DIR / p).is_file()
    ]


N = TypeVar("N", bound=VpcNode)


@contextlib.contextmanager
def vpc_node(
    pause_image: Path,
    host_network: str,
    env: Mapping[str, str] | None = None,
    *,
    ipv6: bool = False,
    cgroups: NodeCgroups | None = None,
) -> Iterator[VpcNode]:
    """A node in an emulated VPC with containerd and a ready ipamd (`IPAMD_HOST_NETWORK` =
    `host_network`, plus `env`), its conflist written; everything gone afterwards. `ipv6`: a
    dual-stack VPC and ipamd in IPv6 mode (`IPV6_ENV`, which `env` may still override);
    `cgroups`: the CPU cgroups its processes and pods go in (the caller closes them once the node
    is gone). Needs root, `TOOLS` and `PLUGINS` (`missing` says which are not there)."""
    node = VpcNode(make_workdir("vpc"), Namespaces.unique(), cgroups=cgroups)
    with running(node, pause_image, host_network, env, ipv6=ipv6) as made:
        yield made


@contextlib.contextmanager
def running(
    node: N,
    pause_image: Path,
    host_network: str,
    env: Mapping[str, str] | None = None,
    *,
    ipv6: bool = False,
) -> Iterator[N]:
    """`node` brought up as `vpc_node` brings one up (the tests' node adds their probes), and
    everything of it gone afterwards."""
    try:
        node.start_world(ipv6)
        node.start_containerd(pause_image)
        node.configure_ipamd(host_network, {**(IPV6_ENV if ipv6 else {}), **(env or {})})
        node.start_ipamd()
        node.wait_ipamd_ready()
        conflist = node.workdir / "net.d" / DEPLOYED_CONFLIST.name
        wait_until(lambda: True if conflist.exists() else None, "ipamd's conflist", 30.0)
        yield node
    except BaseException:
        print(node.diagnostics(), file=sys.stderr)
        raise
    finally:
        code = node.close()
    assert code == 0, f"ipamd exited {code} on SIGTERM:\n{node.exit_log}"
