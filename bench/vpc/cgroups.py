"""A node's CPU cgroups as the kubelet and systemd lay them out, for the benches whose figures
depend on who gets the CPU when it is short (a burst of pods on a small node).

On a node the processes of a pod start do not share the CPU as equals. systemd runs the container
runtime in a slice of its own (`system.slice`; the runtime's CNI plugins and shims are its
children and stay there), and the kubelet puts every pod in a cgroup under `kubepods`, weighted by
the pods' CPU requests. With every process in one cgroup instead, ipamd's one serving thread would
be one task among the dozens a burst makes runnable, which no node does to a DaemonSet.

The layout (kubernetes/kubernetes, read at 00ac878e; unchanged in later releases:
`pkg/kubelet/cm/helpers_linux.go` `MilliCPUToShares` and
`MinShares`, `qos_container_manager_linux.go` `setCPUCgroupConfig`,
`node_container_manager_linux.go`, kubepods weighted by the node's allocatable CPU):

    <root>/system.slice                        1024 shares (systemd's default): containerd
    <root>/kubepods                            shares of the allocatable CPU
    <root>/kubepods/burstable                  shares of the burstable pods' requests
    <root>/kubepods/burstable/pod-ipamd        shares of ipamd's request, quota of its limit
    <root>/kubepods/besteffort                 2 shares
    <root>/kubepods/besteffort/pod<uid>        2 shares: a pod without requests, as the bench's are

The allocatable CPU is the node's less the EKS AMI's kube-reserved share (awslabs/amazon-eks-ami,
`files/bootstrap.sh` `get_cpu_millicores_to_reserve`: 6 % of the first core, 1 % of the second,
0.5 % of the next two, 0.25 % of the rest); ipamd's request and limit are the DaemonSet's
(deploy/daemonset.yaml). A sandbox's cgroup is made by runc under the parent RunPodSandbox names
(`linux.cgroup_parent`, as the kubelet passes it with the cgroupfs driver).

cgroup v1 (the `cpu` controller's `cpu.shares`) and v2 (`cpu.weight`, converted from shares as
runc converts them) are both handled. `close` removes every directory the node made or runc made
under its root, in every hierarchy mounted; it runs once the node's processes are gone.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml  # type: ignore[import-untyped]

CGROUP_FS = Path("/sys/fs/cgroup")
MIN_SHARES = 2
SHARES_PER_CPU = 1024
DEFAULT_SHARES = 1024
QUOTA_PERIOD_US = 100_000
KUBE_RESERVED_PER_MILLE = ((1000, 60), (1000, 10), (2000, 5))
"""(millicores of the range, per mille of it reserved); the rest at 2.5 per mille."""
KUBE_RESERVED_REST = 2.5


def millicores(quantity: str | int | float) -> int:
    """A Kubernetes CPU quantity ("50m", "1", 0.5) in millicores."""
    text = str(quantity)
    return int(text[:-1]) if text.endswith("m") else round(float(text) * 1000)


def pod_cpu(daemonset: Path, name: str) -> tuple[int, int | None]:
    """The CPU request and limit (millicores; no limit: None) of the pod of the DaemonSet in the
    manifest at `daemonset` named `name`, as the kubelet sums them: its containers' requests,
    and a limit only when every container declares one."""
    for doc in yaml.safe_load_all(daemonset.read_text()):
        if doc and doc.get("kind") == "DaemonSet" and doc["metadata"]["name"] == name:
            containers = doc["spec"]["template"]["spec"]["containers"]
            resources = [c.get("resources", {}) for c in containers]
            request = sum(millicores(r.get("requests", {}).get("cpu", 0)) for r in resources)
            limits = [r.get("limits", {}).get("cpu") for r in resources]
            limit = None if None in limits else sum(millicores(q) for q in limits)
            return request, limit
    raise ValueError(f"{daemonset}: no DaemonSet named {name}")


def shares(milli: int) -> int:
    """The kubelet's cpu.shares for a CPU request of `milli` millicores."""
    return max(MIN_SHARES, milli * SHARES_PER_CPU // 1000)


def weight(cpu_shares: int) -> int:
    """cgroup v2's cpu.weight for `cpu_shares`, as runc converts them."""
    return 1 + ((cpu_shares - 2) * 9999) // 262142


def kube_reserved(cpus: int) -> int:
    """The EKS AMI's kube-reserved CPU for a node of `cpus` CPUs, in millicores."""
    left, reserved = cpus * 1000, 0.0
    for span, per_mille in KUBE_RESERVED_PER_MILLE:
        taken = min(left, span)
        reserved, left = reserved + taken * per_mille / 1000, left - taken
    return int(reserved + left * KUBE_RESERVED_REST / 1000)


@dataclass(frozen=True)
class NodeCgroups:
    """The layout under `root` (a directory name) in the cgroup file system at `fs`; `v2` for
    the unified hierarchy."""

    fs: Path
    root: str
    v2: bool

    @property
    def mount(self) -> Path:
        """The hierarchy with the CPU controller."""
        return self.fs if self.v2 else self.fs / "cpu"

    @classmethod
    def open(
        cls,
        root: str,
        cpus: int,
        ipamd_request_m: int,
        ipamd_limit_m: int | None,
        fs: Path = CGROUP_FS,
    ) -> NodeCgroups | str:
        """The layout made for a node of `cpus` CPUs, or why it cannot be (no writable CPU
        controller here)."""
        node = cls(fs, root, (fs / "cgroup.controllers").exists())
        mount = node.mount
        if not (mount / "cgroup.procs").exists() or not os.access(mount, os.W_OK):
            return f"no writable cgroup CPU controller at {mount}"
        if node.v2 and "cpu" not in (mount / "cgroup.controllers").read_text().split():
            return f"the cpu controller is not available at {mount}"
        node._make("", DEFAULT_SHARES)
        node._make("system.slice", DEFAULT_SHARES)
        node._make("kubepods", shares(cpus * 1000 - kube_reserved(cpus)))
        node._make("kubepods/burstable", shares(ipamd_request_m))
        node._make("kubepods/burstable/pod-ipamd", shares(ipamd_request_m), ipamd_limit_m)
        node._make("kubepods/besteffort", MIN_SHARES)
        return node

    def _path(self, group: str) -> Path:
        return self.mount / self.root / group if group else self.mount / self.root

    def _make(self, group: str, cpu_shares: int, limit_m: int | None = None) -> None:
        path = self._path(group)
        path.mkdir(exist_ok=True)
        if self.v2:
            (path.parent / "cgroup.subtree_control").write_text("+cpu")
            (path / "cpu.weight").write_text(str(weight(cpu_shares)))
            if limit_m is not None:
                quota = limit_m * QUOTA_PERIOD_US // 1000
                (path / "cpu.max").write_text(f"{quota} {QUOTA_PERIOD_US}")
        else:
            (path / "cpu.shares").write_text(str(cpu_shares))
            if limit_m is not None:
                (path / "cpu.cfs_period_us").write_text(str(QUOTA_PERIOD_US))
                (path / "cpu.cfs_quota_us").write_text(str(limit_m * QUOTA_PERIOD_US // 1000))

    def cpu_shares(self, group: str) -> int:
        """What `group` was given, in shares (v2: its weight)."""
        name = "cpu.weight" if self.v2 else "cpu.shares"
        return int((self._path(group) / name).read_text())

    def enter(self, group: str, argv: Sequence[str]) -> list[str]:
        """`argv` started in `group`: a shell that moves itself there, then execs it (so that the
        process and all it starts are in the group from their first instruction)."""
        procs = shlex.quote(str(self._path(group) / "cgroup.procs"))
        return ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh", *argv]

    def pod_parent(self, uid: str) -> str:
        """A best-effort pod's cgroup, made as the kubelet makes it before RunPodSandbox: the
        `cgroup_parent` to pass, a path in the hierarchy."""
        group = f"kubepods/besteffort/pod{uid}"
        self._make(group, MIN_SHARES)
        return f"/{self.root}/{group}"

    def close(self) -> list[str]:
        """Every directory under the root removed, deepest first, in every hierarchy (runc makes
        a sandbox's in each v1 controller); what could not be removed, and why."""
        left: list[str] = []
        mounts = [self.mount] if self.v2 else [p for p in self.fs.iterdir() if p.is_dir()]
        for mount in mounts:
            top = mount / self.root
            if not top.is_dir():
                continue
            dirs = [top, *(p for p in top.rglob("*") if p.is_dir())]
            for path in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
                try:
                    path.rmdir()
                except OSError as err:
                    left.append(f"{path}: {err.strerror}")
        return left
