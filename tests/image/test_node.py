"""The DaemonSet's containers, from the built image, on a node the test stands in for.

The node: a directory for its `/` (the hostPath volumes live under it), the network namespace of the
run for its network, the reference plugin `loopback` in its CNI bin directory, and, served
from that namespace by a process of its own (tests/image/cloud.py), EC2, IMDS and the container
runtime's socket. `install-cni` runs as the init container runs (its user, no capability, read-only
root, the node's CNI bin directory mounted); the plugin it installs is then run on the node as the
runtime runs it; then the `ipamd` container, with the DaemonSet's mounts and environment on that host
network, must become ready by its own readiness probe, write its conflist, serve an ADD made through
the installed plugin, leave its JSON log lines in the node's /var/log/aws-routed-eni/ipamd.log and
the plugin's in plugin.log beside it (where aws-node's are), and remove the conflist when stopped.
Host networking is off in it (IPAMD_HOST_NETWORK=off, as the chaos runner runs the daemon): a node's
routing is the end-to-end tests' business (tests/e2e), and the namespace has no ENIs to route
anyway.

The one departure from a node: the conflist's socket path is on the node's `/`, which here is a
directory, so the test rewrites that path under it before running the plugin (the path itself is
checked to be the one the container serves).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import Any

import grpc.aio
import pytest

from datastore.store import STATE_FILE_NAME
from ipamd.runtime._generated import cri_v1_pb2 as cri
from ipamd.wire import SUPPORTED_CNI_VERSIONS
from tests.deploy.repo import REPO, env_of, pod_spec
from tests.image.conftest import FIGURES, Builds, ImageRun
from tests.image.pod import (
    Node,
    container_spec,
    entrypoint,
    environment,
    host_path,
    probe,
    run_args,
)
from tests.image.podman import LABEL
from tests.support.cri_server import runtime_stub

REFERENCE_PLUGINS = ("loopback",)
SYSTEM_PLUGIN_DIRS = (Path("/usr/lib/cni"), Path("/opt/cni/bin"))
READY_DEADLINE_S = 120.0
START_DEADLINE_S = 60.0


@dataclass(frozen=True)
class SmokeNode:
    run: ImageRun
    node: Node
    image: str

    @property
    def bin_dir(self) -> Path:
        return host_path(self.node, "cni-bin")

    @property
    def conf_dir(self) -> Path:
        return host_path(self.node, "cni-conf")

    def on_node(self, path: str) -> Path:
        """A node path (as the container and the conflist name it) on the test's node."""
        return self.node.host_root / path.lstrip("/")


@pytest.fixture(scope="module")
def node(image_run: ImageRun, builds: Builds) -> SmokeNode:
    tested = SmokeNode(
        image_run,
        Node(image_run.workdir / "node", image_run.netns, host_ip="127.0.0.1"),
        builds.cached.image,
    )
    for plugin in REFERENCE_PLUGINS:
        found = [d / plugin for d in SYSTEM_PLUGIN_DIRS if (d / plugin).is_file()]
        assert found, (
            f"the CNI reference plugin {plugin} is missing: tests/image/run.sh installs it"
        )
        shutil.copy2(found[0], tested.bin_dir / plugin)
    return tested


def install_cni(tested: SmokeNode) -> subprocess.CompletedProcess[str]:
    args = run_args("install-cni", tested.node, {}, {})
    return tested.run.podman(
        "run", "--rm", "--label", f"{LABEL}={tested.run.name}", *args,
        "--entrypoint", entrypoint("install-cni"), tested.image,
        check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def installed(node: SmokeNode) -> subprocess.CompletedProcess[str]:
    return install_cni(node)


def run_plugin(tested: SmokeNode, command: str, conf: dict[str, Any], pod: str = "") -> Any:
    """The installed `ipamd-cni` as the node's runtime runs it: CNI_* variables, nothing else."""
    env = {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": pod or "0" * 64,
        "CNI_NETNS": f"/var/run/netns/cni-{(pod or '0')[:12]}",
        "CNI_IFNAME": "eth0",
        "CNI_PATH": str(tested.bin_dir),
        "CNI_ARGS": (
            f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=smoke;"
            f"K8S_POD_INFRA_CONTAINER_ID={pod or '0' * 64};K8S_POD_UID=uid-smoke"
        ),
    }
    return subprocess.run(
        [str(tested.bin_dir / "ipamd-cni")],
        input=json.dumps(conf),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def plugin_conf(
    conflist: dict[str, Any], socket: Path, log_file: Path | None = None
) -> dict[str, Any]:
    """The shipped plugin's network config as an interface plugin (`ptp`) hands it to its IPAM
    plugin, its socket (and, when the conflist names one, its log file) on the test's node. The
    plugin runs in this process's network namespace, the machine's, so it runs as the IPAM plugin:
    making a pod's veth is tests/e2e's, in namespaces of their own."""
    (plugin,) = [p for p in conflist["plugins"] if p["type"] == "ipamd-cni"]
    ipam = dict(plugin["ipam"], socket=str(socket))
    conf = {
        "cniVersion": conflist["cniVersion"],
        "name": conflist["name"],
        "type": "ptp",
        "ipam": ipam,
    }
    if log_file is not None:
        conf |= {"pluginLogFile": str(log_file), "pluginLogLevel": plugin["pluginLogLevel"]}
    return conf


def json_lines(path: Path) -> list[dict[str, Any]]:
    """A log file's lines, each one JSON object with VPC CNI's fields."""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for line in lines:
        assert list(line)[:5] == ["level", "ts", "logger", "caller", "msg"], line
    return lines


def test_install_cni_runs_as_the_init_container(node: SmokeNode, installed: Any) -> None:
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert "ipamd-cni installed in /host/opt/cni/bin" in installed.stderr
    # The node has loopback but no portmap (the conflist chains it for hostPorts): the image's goes.
    assert "portmap installed from the image" in installed.stderr
    version = subprocess.run(
        [str(node.bin_dir / "portmap")],
        env={"CNI_COMMAND": "VERSION"},
        input="",
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert version.returncode == 0 and "supportedVersions" in version.stdout, version
    store = node.bin_dir / "ipamd-cni.d"
    bundle_id = node.run.podman(
        "run", "--rm", "--network", f"ns:{node.node.netns}", "--label",
        f"{LABEL}={node.run.name}", "--entrypoint", "cat", node.image, "/opt/ipamd/cni/bundle/ID",
    ).stdout.strip()  # fmt: skip
    assert os.readlink(store / "current") == bundle_id
    launcher = node.bin_dir / "ipamd-cni"
    assert launcher.stat().st_uid == 0 and launcher.stat().st_mode & 0o777 == 0o755
    before = sorted(p.relative_to(node.bin_dir) for p in node.bin_dir.rglob("*"))
    again = install_cni(node)
    assert again.returncode == 0, "the pod's next start installs again, idempotently"
    assert sorted(p.relative_to(node.bin_dir) for p in node.bin_dir.rglob("*")) == before


def test_the_installed_plugin_follows_the_cni_rules_without_ipamd(
    node: SmokeNode, installed: Any
) -> None:
    assert installed.returncode == 0
    version = run_plugin(node, "VERSION", {"cniVersion": "1.0.0"})
    assert version.returncode == 0, version.stderr
    assert json.loads(version.stdout)["supportedVersions"] == list(SUPPORTED_CNI_VERSIONS)
    conflist = json.loads((REPO / "deploy" / "cni" / "10-ipamd.conflist").read_text())
    conf = plugin_conf(conflist, node.on_node("/run/ipamd/ipamd.sock"))
    added = run_plugin(node, "ADD", conf)
    assert added.returncode != 0 and json.loads(added.stdout)["code"] == 11, added.stdout
    deleted = run_plugin(node, "DEL", conf)
    assert deleted.returncode == 0, deleted.stdout + deleted.stderr


def netns_exec(tested: SmokeNode) -> list[str]:
    """This interpreter, run in the node's network namespace."""
    return ["ip", "netns", "exec", tested.run.netns_name, sys.executable]


@pytest.fixture(scope="module")
def world(node: SmokeNode) -> Iterator[dict[str, str]]:
    """EC2, IMDS and the runtime's socket, served from the node's network namespace."""
    ready = node.run.workdir / "cloud.json"
    log_path = node.run.workdir / "cloud.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [*netns_exec(node), "-m", "tests.image.cloud", str(node.node.host_root), str(ready)],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        end = time.monotonic() + START_DEADLINE_S
        while not ready.exists():
            assert process.poll() is None, f"the cloud exited:\n{log_path.read_text()[-4000:]}"
            assert time.monotonic() < end, f"the cloud did not start:\n{log_path.read_text()}"
            time.sleep(0.1)
        yield json.loads(ready.read_text())
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


@pytest.fixture(scope="module")
def ipamd(node: SmokeNode, world: dict[str, str], installed: Any) -> Iterator[str]:
    """The ipamd container, started as the DaemonSet starts it; its name."""
    name = f"ipamd-{node.run.name}"
    config = {
        "AWS_EC2_ENDPOINT": world["ec2_url"],
        "AWS_REGION": world["region"],
        "IPAMD_HOST_NETWORK": "off",
    }
    extra = {
        "AWS_EC2_METADATA_SERVICE_ENDPOINT": world["imds_url"],
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_EC2_METADATA_DISABLED": "true",  # botocore's own credential lookup stays off IMDS
    }
    node.run.podman(
        "run", "--detach", "--name", name, "--label", f"{LABEL}={node.run.name}",
        *run_args("ipamd", node.node, config, extra),
        "--entrypoint", entrypoint("ipamd"), node.image,
    )  # fmt: skip
    try:
        yield name
    finally:
        node.run.podman("rm", "--force", "--time", "5", name, check=False)


def logs(tested: SmokeNode, name: str) -> str:
    answer = tested.run.podman("logs", "--tail", "40", name, check=False)
    return answer.stdout + answer.stderr


def wait_ready(tested: SmokeNode, name: str) -> float:
    """Seconds until the readiness probe, exec'd in the container as kubelet does, passed."""
    started = time.monotonic()
    command = probe("ipamd", "readinessProbe")
    while True:
        answer = tested.run.podman("exec", name, *command, check=False)
        if answer.returncode == 0:
            return time.monotonic() - started
        running = tested.run.podman("inspect", "--format", "{{.State.Running}}", name).stdout
        assert running.strip() == "true", f"ipamd exited:\n{logs(tested, name)}"
        elapsed = time.monotonic() - started
        assert elapsed < READY_DEADLINE_S, f"not ready: {answer.stdout}\n{logs(tested, name)}"
        time.sleep(0.5)


def written_conflist(tested: SmokeNode) -> dict[str, Any]:
    (written,) = tested.conf_dir.glob("*.conflist")
    loaded: dict[str, Any] = json.loads(written.read_text())
    return loaded


async def run_sandbox(socket: Path) -> str:
    """A pod sandbox made the way kubelet makes one, on the runtime the container is mounted to."""
    async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
        metadata = cri.PodSandboxMetadata(name="smoke", namespace="default", uid="uid-smoke")
        request = cri.RunPodSandboxRequest(config=cri.PodSandboxConfig(metadata=metadata))
        reply = await runtime_stub(channel).RunPodSandbox(request, timeout=10)
        return str(reply.pod_sandbox_id)


def ipamctl(tested: SmokeNode, name: str, what: str) -> Any:
    answer = tested.run.podman("exec", name, "ipamctl", "--json", what)
    return json.loads(answer.stdout)


def metrics(tested: SmokeNode, address: str) -> str:
    """`GET /metrics` on the node's network, where Prometheus would scrape it."""
    url = f"http://{address}/metrics"
    fetch = f"import urllib.request as u; print(u.urlopen({url!r}, timeout=10).read().decode())"
    answer = subprocess.run(
        [*netns_exec(tested), "-c", fetch],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return answer.stdout


async def test_the_ipamd_container_serves_an_add_through_the_installed_plugin(
    node: SmokeNode, world: dict[str, str], ipamd: str
) -> None:
    ready_s = wait_ready(node, ipamd)
    liveness = node.run.podman("exec", ipamd, *probe("ipamd", "livenessProbe"), check=False)
    assert liveness.returncode == 0, liveness.stdout
    conflist = written_conflist(node)
    socket = env_of(container_spec("ipamd"))["IPAMD_SOCKET"]["value"]
    assert conflist["plugins"][0]["ipam"]["socket"] == socket, "the node's path of the socket"
    sandbox = await run_sandbox(node.on_node("/run/containerd/containerd.sock"))
    # The plugin's log where aws-node's is: the conflist names the node's path, as VPC CNI's does.
    plugin_log = conflist["plugins"][0]["pluginLogFile"]
    assert plugin_log == "/var/log/aws-routed-eni/plugin.log"
    conf = plugin_conf(conflist, node.on_node(socket), node.on_node(plugin_log))
    added = run_plugin(node, "ADD", conf, sandbox)
    assert added.returncode == 0, f"{added.stdout}{added.stderr}\n{logs(node, ipamd)}"
    address = json.loads(added.stdout)["ips"][0]["address"].partition("/")[0]
    assert IPv4Address(address) in IPv4Network(world["subnet_cidr"])
    held = json.dumps(ipamctl(node, ipamd, "allocations"))
    assert sandbox in held and address in held, held
    scraped = metrics(
        node, environment(container_spec("ipamd"), node.node, {})["IPAMD_METRICS_ADDR"]
    )
    assert "awscni_assigned_ip_addresses 1.0" in scraped, scraped[:2000]
    deleted = run_plugin(node, "DEL", conf, sandbox)
    assert deleted.returncode == 0 and "reported as done" not in deleted.stderr, deleted.stderr
    assert sandbox not in json.dumps(ipamctl(node, ipamd, "allocations"))
    add, delete = json_lines(node.on_node(plugin_log))
    assert (add["msg"].split()[0], add["container_id"], add["addresses"]) == (
        "cni.add",
        sandbox,
        [json.loads(added.stdout)["ips"][0]["address"]],
    )
    assert (delete["msg"].split()[0], delete["container_id"]) == ("cni.del", sandbox)
    # ipamd's own, written through the DaemonSet's mount: what it said, with each event's fields.
    logged = json_lines(node.on_node("/var/log/aws-routed-eni/ipamd.log"))
    (ready,) = [x for x in logged if x["msg"].startswith("daemon.ready ")]
    assert ready["level"] == "info" and ready["instance_id"].startswith("i-"), ready
    assert any(x["msg"].startswith("cni.conflist_written ") for x in logged)
    FIGURES["ipamd_ready_s"] = round(ready_s, 1)


def test_ipamd_stops_cleanly_on_sigterm_and_removes_its_conflist(
    node: SmokeNode, ipamd: str
) -> None:
    wait_ready(node, ipamd)
    assert written_conflist(node)
    grace = pod_spec()["terminationGracePeriodSeconds"]
    node.run.podman("stop", "--time", str(grace), ipamd, timeout=grace + 30)
    code = node.run.podman("inspect", "--format", "{{.State.ExitCode}}", ipamd).stdout.strip()
    assert code == "0", logs(node, ipamd)
    assert list(node.conf_dir.glob("*.conflist")) == [], "kubelet must not see a ready network"
    assert (host_path(node.node, "state") / STATE_FILE_NAME).is_file(), "the state survives the pod"
