"""A private containerd for the end-to-end tests and the benches, and a CRI v1 client to drive it as
the kubelet does.

`Containerd.start` runs the `containerd` binary with a config of its own: root, state, socket, the
`opt` dir and runc's state all under one work dir; the CRI plugin's CNI bin and conf dirs from the
caller; the locally built pause image as `sandbox_image`; `restrict_oom_score_adj` (a machine that
refuses a negative oom_score_adj fails RunPodSandbox without it); network namespaces mounted under the
state dir. Nothing is shared with a system containerd except the shim socket dir that containerd
1.6 hard-codes (`/run/containerd/s`, one socket per task, named by a hash of our socket's path).

With `netns` (a network namespace's path), containerd starts under `nsenter --net=<netns>`: the
CNI plugins it runs, and so the host ends of its pods' veths, live in that namespace (a node of an
emulated VPC) instead of the machine's own. Only the network namespace changes: mounts, sockets and
`ctr` work as without it.

`Containerd.cleanup` leaves nothing behind: sandboxes stopped and removed over CRI, tasks killed with
`ctr`, containerd stopped, its shims killed by PID, its mounts unmounted, the work dir deleted.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import (  # type: ignore[import-untyped]
    descriptor_pb2,
    descriptor_pool,
    message_factory,
)

from bench.vpc.processes import terminate, wait_until
from ipamd.runtime._generated import cri_v1_pb2 as cri
from ipamd.runtime._generated import cri_v1_pb2_grpc as cri_grpc

K8S_NAMESPACE = "k8s.io"
"""The containerd namespace of the CRI plugin's containers and images."""
SHIM_SOCKET_DIR = Path("/run/containerd/s")
"""Where containerd 1.6 puts its shims' sockets, whatever its state dir."""
_RPC_TIMEOUT_S = 60.0
# The generated gRPC module carries no annotations (the messages do): a typed name for the stub.
_runtime_stub: Callable[[grpc.Channel], Any] = cri_grpc.RuntimeServiceStub


def _config(workdir: Path, socket: Path, cni_bin: Path, cni_conf: Path, sandbox_image: str) -> str:
    root, state = workdir / "root", workdir / "state"
    cri_plugin = '[plugins."io.containerd.grpc.v1.cri"]'
    return f"""\
version = 2
root = "{root}"
state = "{state}"

[grpc]
  address = "{socket}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{root}/opt"

{cri_plugin}
  sandbox_image = "{sandbox_image}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{cni_conf}"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      Root = "{state}/runc"
"""


@dataclass
class Containerd:
    workdir: Path
    socket: Path
    config: Path
    netns: str | None = None
    """The network namespace (path) containerd runs in; None = this process's."""
    launcher: tuple[str, ...] = ()
    """What containerd's command is started under (a cgroup's `NodeCgroups.enter`), if anything."""
    process: subprocess.Popen[bytes] | None = None
    cri: CriClient | None = None
    made_shim_socket_dir: bool = field(default_factory=lambda: not SHIM_SOCKET_DIR.parent.exists())
    """Whether the shim socket dir is ours to remove afterwards (no system containerd made it)."""

    @classmethod
    def create(
        cls,
        workdir: Path,
        *,
        cni_bin: Path,
        cni_conf: Path,
        sandbox_image: str,
        netns: str | None = None,
        launcher: Sequence[str] = (),
    ) -> Containerd:
        socket = workdir / "containerd.sock"
        config = workdir / "containerd.toml"
        config.write_text(_config(workdir, socket, cni_bin, cni_conf, sandbox_image))
        return cls(workdir, socket, config, netns, tuple(launcher))

    @property
    def log(self) -> Path:
        return self.workdir / "containerd.log"

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def start(self) -> None:
        """Starts containerd and waits until its CRI plugin answers Version."""
        assert self.process is None or self.process.poll() is not None, "already running"
        command = ["containerd", "--config", str(self.config)]
        if self.netns is not None:
            # nsenter execs containerd (no fork for a network namespace): the PID is containerd's.
            command = ["nsenter", f"--net={self.netns}", *command]
        # The launcher execs what it starts too: the PID stays containerd's.
        command = [*self.launcher, *command]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        process = self.process
        self.cri = CriClient(self.socket)

        def answers() -> str | None:
            assert process.poll() is None, f"containerd exited:\n{self.log_tail()}"
            try:
                return self.client.version()
            except grpc.RpcError:
                return None

        wait_until(answers, "containerd's CRI plugin answering Version", 30.0)

    @property
    def client(self) -> CriClient:
        assert self.cri is not None, "containerd was not started"
        return self.cri

    def stop(self) -> None:
        """Stops containerd (SIGTERM, as systemd would); its shims and their pods keep running."""
        if self.cri is not None:
            self.cri.close()
            self.cri = None
        if self.process is not None:
            terminate(self.process)

    def restart(self) -> None:
        self.stop()
        self.start()

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ctr", "--address", str(self.socket), "--namespace", K8S_NAMESPACE, *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=check,
        )

    def import_image(self, archive: Path) -> None:
        self.ctr("images", "import", str(archive))

    def netns_path(self, sandbox_id: str) -> str:
        """The network namespace of a sandbox, from its container's OCI spec (`ctr containers info`)."""
        info = json.loads(self.ctr("containers", "info", sandbox_id).stdout)
        for namespace in info["Spec"]["linux"]["namespaces"]:
            if namespace["type"] == "network":
                return str(namespace["path"])
        raise AssertionError(f"sandbox {sandbox_id} has no network namespace path")

    def forget_sandbox(self, sandbox_id: str) -> None:
        """Deletes a sandbox behind the CRI plugin's back, as a crash or a hand cleanup does: its
        pause task killed and deleted, its container metadata deleted, with `ctr`. No CNI DEL runs.
        The CRI plugin keeps listing the sandbox from memory until containerd restarts."""
        self.ctr("tasks", "kill", "--signal", "SIGKILL", sandbox_id, check=False)

        def gone() -> bool | None:
            listed = self.ctr("tasks", "ls", "--quiet").stdout.split()
            if sandbox_id not in listed:
                return True
            self.ctr("tasks", "delete", "--force", sandbox_id, check=False)
            return None

        wait_until(gone, f"the task of sandbox {sandbox_id} deleted", 30.0, every_s=0.2)
        self.ctr("containers", "delete", sandbox_id)

    def cleanup(self) -> None:
        """Leaves nothing running or mounted and deletes the work dir. Safe after any failure."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(grpc.RpcError):
                sandboxes = self.client.list_sandboxes()
                for sandbox in sandboxes:
                    with contextlib.suppress(grpc.RpcError):
                        self.client.remove_sandbox(sandbox.id)  # stops it first
            for task in self.ctr("tasks", "ls", "--quiet", check=False).stdout.split():
                self.ctr("tasks", "delete", "--force", task, check=False)
        self.stop()
        for pid in self._shim_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _unmount_under(self.workdir)
        shutil.rmtree(self.workdir, ignore_errors=True)
        if self.made_shim_socket_dir:
            with contextlib.suppress(OSError):  # not empty: another containerd uses it now
                SHIM_SOCKET_DIR.rmdir()
                SHIM_SOCKET_DIR.parent.rmdir()

    def _shim_pids(self) -> list[int]:
        """The shims this containerd started: they outlive it, and name its socket on their command
        line (`containerd-shim-runc-v2 -namespace k8s.io -id ... -address <socket>`)."""
        pids = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and b"containerd-shim" in argv[0] and str(self.socket).encode() in argv:
                pids.append(int(proc.name))
        return pids


def _unmount_under(path: Path) -> None:
    """Unmounts every mount point under `path`, deepest first (rootfs overlays, /dev/shm of the
    sandboxes, network namespace bind mounts)."""
    prefix = f"{path}/"
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point.startswith(prefix):
            points.append(point)
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "--lazy", point], check=False, capture_output=True)


# PodSandboxStatus is not in ipamd's CRI subset (ipamd never calls it). Its request and the fields
# read here are declared at runtime with upstream's field numbers (kubernetes/cri-api
# pkg/apis/runtime/v1/api.proto), in a private descriptor pool.
def _status_messages() -> tuple[Any, Any]:
    string, int32, message = 9, 5, 11  # FieldDescriptorProto.Type
    optional, repeated = 1, 3  # FieldDescriptorProto.Label
    proto = descriptor_pb2.FileDescriptorProto(
        name="ipamd_e2e/pod_sandbox_status.proto", package="ipamd_e2e.runtime.v1", syntax="proto3"
    )

    def declare(name: str, *fields: tuple[str, int, int, str, int]) -> None:
        declared = proto.message_type.add(name=name)
        for field_name, number, kind, type_name, label in fields:
            added = declared.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                added.type_name = type_name

    pkg = ".ipamd_e2e.runtime.v1"
    declare("PodSandboxStatusRequest", ("pod_sandbox_id", 1, string, "", optional))
    declare("PodIP", ("ip", 1, string, "", optional))
    declare(
        "PodSandboxNetworkStatus",
        ("ip", 1, string, "", optional),
        ("additional_ips", 2, message, f"{pkg}.PodIP", repeated),
    )
    declare(
        "PodSandboxStatus",
        ("id", 1, string, "", optional),
        ("state", 3, int32, "", optional),
        ("network", 5, message, f"{pkg}.PodSandboxNetworkStatus", optional),
    )
    declare("PodSandboxStatusResponse", ("status", 1, message, f"{pkg}.PodSandboxStatus", optional))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    request = message_factory.GetMessageClass(
        pool.FindMessageTypeByName("ipamd_e2e.runtime.v1.PodSandboxStatusRequest")
    )
    response = message_factory.GetMessageClass(
        pool.FindMessageTypeByName("ipamd_e2e.runtime.v1.PodSandboxStatusResponse")
    )
    return request, response


_StatusRequest, _StatusResponse = _status_messages()


@dataclass(frozen=True)
class SandboxStatus:
    sandbox_id: str
    ready: bool
    ips: tuple[str, ...]
    """The pod's IPs as the runtime reports them (`network.ip`, then `additional_ips`)."""


class CriClient:
    """The kubelet's side of CRI v1 over a unix socket (synchronous gRPC)."""

    def __init__(self, socket: Path) -> None:
        self._channel = grpc.insecure_channel(f"unix:{socket}")
        self._stub = _runtime_stub(self._channel)
        self._status = self._channel.unary_unary(
            "/runtime.v1.RuntimeService/PodSandboxStatus",
            request_serializer=_StatusRequest.SerializeToString,
            response_deserializer=_StatusResponse.FromString,
        )

    def close(self) -> None:
        self._channel.close()

    def version(self) -> str:
        answer = self._stub.Version(cri.VersionRequest(version="v1"), timeout=5)
        return f"{answer.runtime_name} {answer.runtime_version} (CRI {answer.runtime_api_version})"

    def run_sandbox(
        self,
        namespace: str,
        name: str,
        uid: str,
        attempt: int = 0,
        host_ports: Mapping[int, int] | None = None,
        cgroup_parent: str = "",
    ) -> str:
        """RunPodSandbox; `host_ports` maps host ports to the pod's TCP ports, as the kubelet
        passes a pod's `hostPort`s (the runtime hands them to portmap); `cgroup_parent` the pod's
        cgroup (`NodeCgroups.pod_parent`), where runc makes the sandbox's."""
        config = cri.PodSandboxConfig(
            metadata=cri.PodSandboxMetadata(
                name=name, uid=uid, namespace=namespace, attempt=attempt
            ),
            hostname=name,
            port_mappings=[
                cri.PortMapping(protocol=cri.TCP, container_port=inside, host_port=outside)
                for outside, inside in sorted((host_ports or {}).items())
            ],
            labels={"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": namespace},
        )
        if cgroup_parent:
            config.linux.cgroup_parent = cgroup_parent
        answer = self._stub.RunPodSandbox(
            cri.RunPodSandboxRequest(config=config), timeout=_RPC_TIMEOUT_S
        )
        return str(answer.pod_sandbox_id)

    def stop_sandbox(self, sandbox_id: str) -> None:
        self._stub.StopPodSandbox(
            cri.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=_RPC_TIMEOUT_S
        )

    def remove_sandbox(self, sandbox_id: str) -> None:
        self._stub.RemovePodSandbox(
            cri.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=_RPC_TIMEOUT_S
        )

    def list_sandboxes(self) -> list[cri.PodSandbox]:
        answer = self._stub.ListPodSandbox(cri.ListPodSandboxRequest(), timeout=_RPC_TIMEOUT_S)
        return list(answer.items)

    def sandbox_status(self, sandbox_id: str) -> SandboxStatus:
        answer = self._status(_StatusRequest(pod_sandbox_id=sandbox_id), timeout=_RPC_TIMEOUT_S)
        network = answer.status.network
        ips = tuple(
            ip for ip in (network.ip, *(extra.ip for extra in network.additional_ips)) if ip
        )
        return SandboxStatus(str(answer.status.id), answer.status.state == cri.SANDBOX_READY, ips)
