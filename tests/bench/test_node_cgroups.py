"""The bench node's CPU cgroups (`bench.vpc.cgroups`): the kubelet's and the EKS AMI's numbers, the
layout written into a cgroup file system (a directory standing in for one), and a process started
in its group."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench import cni_burst
from bench.vpc import cgroups
from bench.vpc.cgroups import NodeCgroups


@pytest.mark.parametrize(
    ("cpus", "reserved"),
    # awslabs/amazon-eks-ami files/bootstrap.sh: 6 % of the first core, 1 % of the second,
    # 0.5 % of the third and fourth, 0.25 % of each one after.
    [(1, 60), (2, 70), (4, 80), (8, 90), (96, 310)],
)
def test_kube_reserved_is_the_eks_amis(cpus: int, reserved: int) -> None:
    assert cgroups.kube_reserved(cpus) == reserved


def test_shares_and_weights_are_the_kubelets_and_runcs() -> None:
    assert cgroups.shares(0) == 2, "no request: the kubelet's MinShares"
    assert cgroups.shares(1) == 2
    assert cgroups.shares(50) == 51
    assert cgroups.shares(1930) == 1976
    assert cgroups.weight(2) == 1
    assert cgroups.weight(1024) == 39
    assert cgroups.weight(262144) == 10000


def test_cpu_quantities_read_as_the_api_writes_them() -> None:
    assert [cgroups.millicores(q) for q in ("50m", "1", "0.5", 2, "1500m")] == [
        50,
        1000,
        500,
        2000,
        1500,
    ]


def test_ipamds_request_and_limit_come_from_the_shipped_daemonset() -> None:
    assert cgroups.pod_cpu(cni_burst.DAEMONSET, "ipamd") == (50, 1000)
    with pytest.raises(ValueError, match="no DaemonSet named nothing"):
        cgroups.pod_cpu(cni_burst.DAEMONSET, "nothing")


def _fs(tmp_path: Path, v2: bool) -> Path:
    """A directory laid out as a cgroup file system's top: v1 with a cpu hierarchy, or v2."""
    mount = tmp_path if v2 else tmp_path / "cpu"
    mount.mkdir(exist_ok=True)
    (mount / "cgroup.procs").write_text("")
    if v2:
        (mount / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    return tmp_path


def test_v1_layout_weighs_the_runtime_the_pods_and_ipamd_as_a_two_cpu_node(
    tmp_path: Path,
) -> None:
    node = NodeCgroups.open("bench", 2, 50, 1000, fs=_fs(tmp_path, v2=False))
    assert isinstance(node, NodeCgroups)
    top = tmp_path / "cpu" / "bench"
    read = {
        group: int((top / group / "cpu.shares").read_text())
        for group in (
            "system.slice",
            "kubepods",
            "kubepods/burstable",
            "kubepods/burstable/pod-ipamd",
            "kubepods/besteffort",
        )
    }
    assert read == {
        "system.slice": 1024,
        "kubepods": 1976,  # 2000m less 70m kube-reserved
        "kubepods/burstable": 51,
        "kubepods/burstable/pod-ipamd": 51,
        "kubepods/besteffort": 2,
    }
    pod_ipamd = top / "kubepods/burstable/pod-ipamd"
    assert (pod_ipamd / "cpu.cfs_quota_us").read_text() == "100000"
    assert (pod_ipamd / "cpu.cfs_period_us").read_text() == "100000"
    assert node.pod_parent("u1") == "/bench/kubepods/besteffort/podu1"
    assert (top / "kubepods/besteffort/podu1/cpu.shares").read_text() == "2"


def test_v2_layout_writes_weights_and_enables_the_controller_down_the_tree(
    tmp_path: Path,
) -> None:
    node = NodeCgroups.open("bench", 2, 50, None, fs=_fs(tmp_path, v2=True))
    assert isinstance(node, NodeCgroups)
    top = tmp_path / "bench"
    assert (top / "kubepods" / "cpu.weight").read_text() == str(cgroups.weight(1976))
    assert (top / "kubepods/besteffort/cpu.weight").read_text() == "1"
    assert (top / "kubepods/cgroup.subtree_control").read_text() == "+cpu"
    assert not (top / "kubepods/burstable/pod-ipamd/cpu.max").exists(), "no limit, no quota"
    assert node.cpu_shares("system.slice") == cgroups.weight(1024)


def test_without_a_cpu_controller_it_says_why(tmp_path: Path) -> None:
    assert NodeCgroups.open("bench", 2, 50, None, fs=tmp_path) == (
        f"no writable cgroup CPU controller at {tmp_path / 'cpu'}"
    )
    fs = _fs(tmp_path, v2=True)
    (fs / "cgroup.controllers").write_text("memory pids\n")
    assert NodeCgroups.open("bench", 2, 50, None, fs=fs) == (
        f"the cpu controller is not available at {fs}"
    )


def test_a_process_entered_in_a_group_writes_its_own_pid_there_then_runs(
    tmp_path: Path,
) -> None:
    node = NodeCgroups.open("bench", 2, 50, None, fs=_fs(tmp_path, v2=False))
    assert isinstance(node, NodeCgroups)
    argv = node.enter("system.slice", ["sh", "-c", 'echo "ran $$"'])
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    procs = tmp_path / "cpu" / "bench" / "system.slice" / "cgroup.procs"
    # exec keeps the PID: the one written to the group is the one that ran.
    assert done.stdout == f"ran {procs.read_text().strip()}\n"
