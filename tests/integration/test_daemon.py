"""`ipamd run --embedded` as a user meets it: a real process on the embedded cloud, its API on a real
unix socket, SIGTERM to stop."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.vpc.processes import free_port, unix_call
from datastore.store import STATE_FILE_NAME

BIN = Path(sys.executable).parent


@dataclass
class Running:
    process: subprocess.Popen[str]
    socket_path: Path
    state_dir: Path
    metrics_port: int
    introspection_port: int

    def call(self, method: str, path: str, body: object = None) -> tuple[int, dict[str, object]]:
        return unix_call(self.socket_path, method, path, body)

    def wait_for(self, path: str, status: int = 200, deadline_s: float = 60.0) -> int:
        """Poll until the daemon answers `path` with `status` (it is a separate process: there is no
        event to await). Returns the status."""
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            assert self.process.poll() is None, self.process.communicate()[1][-3000:]
            if self.socket_path.exists():
                try:
                    if self.call("GET", path)[0] == status:
                        return status
                except OSError:
                    pass
            time.sleep(0.1)
        raise AssertionError(f"the daemon did not answer {path} with {status} in {deadline_s} s")


REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "deploy" / "cni" / "10-ipamd.conflist"


def _start(tmp_path: Path, **extra: str) -> Running:
    state_dir = tmp_path / "state"
    socket_path = tmp_path / "ipamd.sock"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IPAMD_", "WARM_", "AWS_"))}
    metrics_port = free_port()
    introspection_port = free_port()
    env.update(
        IPAMD_STATE_DIR=str(state_dir),
        IPAMD_SOCKET=str(socket_path),
        IPAMD_CRI_SOCKET=str(tmp_path / "no-runtime.sock"),
        IPAMD_LOG_FORMAT="json",
        IPAMD_METRICS_ADDR=f"127.0.0.1:{metrics_port}",
        INTROSPECTION_BIND_ADDRESS=f"127.0.0.1:{introspection_port}",
    )
    env.update(extra)
    process = subprocess.Popen(
        [str(BIN / "ipamd"), "run", "--embedded"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    return Running(process, socket_path, state_dir, metrics_port, introspection_port)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Running]:
    running = _start(tmp_path)
    try:
        yield running
    finally:
        if running.process.poll() is None:
            running.process.kill()
        running.process.communicate()


def _ipamctl(socket_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "ipamctl"), "--socket", str(socket_path), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _stop(running: Running) -> tuple[int, str]:
    running.process.send_signal(signal.SIGTERM)
    _, stderr = running.process.communicate(timeout=30)
    return running.process.returncode, stderr


def test_embedded_daemon_serves_add_and_del_and_stops_cleanly(daemon: Running) -> None:
    assert daemon.wait_for("/readyz") == 200
    assert oct(daemon.socket_path.stat().st_mode & 0o777) == "0o660"
    assert daemon.call("GET", "/v1/pool")[0] == 200
    key = {"container_id": "c1", "ifname": "eth0", "network": "k8s-pod-network"}
    # Ready means restored and reconciled; the warm pool may still be filling. An ADD that finds it
    # empty is told to retry (503 no_address) and makes the pool grow at once, as the runtime retries.
    deadline = time.monotonic() + 30
    status, added = daemon.call("POST", "/v1/allocations", key)
    adds = 1
    while status == 503 and added.get("code") == "no_address" and time.monotonic() < deadline:
        time.sleep(0.1)
        status, added = daemon.call("POST", "/v1/allocations", key)
        adds += 1
    assert status == 200, added
    assert daemon.call("POST", "/v1/allocations", key)[1]["ips"] == added["ips"]
    assert daemon.call("DELETE", "/v1/allocations/c1/eth0?network=k8s-pod-network")[0] == 200
    assert daemon.call("POST", "/v1/allocations", key)[1]["code"] == "delete_intent"
    adds += 2
    metrics = http.client.HTTPConnection("127.0.0.1", daemon.metrics_port, timeout=10)
    try:
        metrics.request("GET", "/metrics")
        text = metrics.getresponse().read().decode()
    finally:
        metrics.close()
    assert "awscni_assigned_ip_addresses 0" in text and "awscni_eni_allocated 1" in text
    assert 'ipamd_ec2_calls_total{api="AssignPrivateIpAddresses",outcome="ok"}' in text
    assert f"ipamd_add_latency_seconds_count {float(adds)}\n" in text, "every ADD answered is timed"
    status_out = _ipamctl(daemon.socket_path, "status")
    assert status_out.returncode == 0, status_out.stderr
    assert "ASSIGNED" in status_out.stdout and "total" in status_out.stdout
    assert "(primary)" in status_out.stdout
    assert "WARM_ENI_TARGET=1" in status_out.stdout and "max_enis=3" in status_out.stdout
    repair = _ipamctl(daemon.socket_path, "repair")
    assert repair.returncode == 1 and "runtime" in repair.stderr, "no runtime: nothing judged dead"
    code, stderr = _stop(daemon)
    assert code == 0, stderr[-3000:]
    assert not daemon.socket_path.exists(), "the socket is removed on a clean stop"
    gone = _ipamctl(daemon.socket_path, "status")
    assert gone.returncode == 2 and "is ipamd running?" in gone.stderr


def test_corrupt_state_file_keeps_the_daemon_up_but_refuses_add(tmp_path: Path) -> None:
    state = tmp_path / "state" / STATE_FILE_NAME
    state.parent.mkdir(parents=True)
    state.write_bytes(b"not a database" * 100)
    running = _start(tmp_path)
    try:
        assert running.wait_for("/healthz") == 200
        assert running.wait_for("/readyz", status=503) == 503
        status, body = running.call(
            "POST", "/v1/allocations", {"container_id": "c", "ifname": "eth0", "network": "n"}
        )
        assert status == 503 and body["code"] == "state_unavailable"
        assert str(state) in str(body["message"]) and "ipamctl repair" in str(body["message"])
        code, stderr = _stop(running)
        assert code == 0
        assert str(state) in stderr and "ipamctl repair" in stderr
        assert state.read_bytes() == b"not a database" * 100
    finally:
        if running.process.poll() is None:
            running.process.kill()
            running.process.communicate()


def test_conflist_appears_once_ready_and_goes_on_a_clean_stop(tmp_path: Path) -> None:
    conf_dir = tmp_path / "net.d"
    running = _start(
        tmp_path,
        IPAMD_CNI_CONF_DIR=str(conf_dir),
        IPAMD_CNI_CONFLIST_TEMPLATE=str(TEMPLATE),
        AWS_VPC_ENI_MTU="8500",
    )
    try:
        assert running.wait_for("/readyz") == 200
        written = conf_dir / TEMPLATE.name
        deadline = time.monotonic() + 30
        while not written.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        conf = json.loads(written.read_text())
        assert conf["plugins"][0]["ipam"] == {
            "type": "ipamd-cni",
            "socket": str(running.socket_path),
        }
        assert conf["plugins"][0]["mtu"] == 8500, "POD_MTU defaults to AWS_VPC_ENI_MTU"
        assert conf["plugins"][0]["pluginLogFile"] == str(
            tmp_path / ".run" / "aws-routed-eni" / "plugin.log"
        ), "AWS_VPC_K8S_PLUGIN_LOG_FILE (embedded: under ./.run), made absolute"
        assert conf["plugins"][0]["pluginLogLevel"] == "info"
        assert "v4Egress" not in conf["plugins"][0], "IPv4 pods need no IPv4 egress of their own"
        assert [p.name for p in conf_dir.iterdir()] == [TEMPLATE.name], "no temp file left"
        code, _ = _stop(running)
        assert code == 0
        assert not written.exists(), "removed on a clean stop: the node's network is not ready"
    finally:
        if running.process.poll() is None:
            running.process.kill()
            running.process.communicate()


def test_no_conflist_while_the_state_file_is_unusable(tmp_path: Path) -> None:
    conf_dir = tmp_path / "net.d"
    conf_dir.mkdir()
    (conf_dir / TEMPLATE.name).write_text("{}")  # left by an earlier run
    state = tmp_path / "state" / STATE_FILE_NAME
    state.parent.mkdir()
    state.write_bytes(b"garbage" * 100)
    running = _start(
        tmp_path,
        IPAMD_CNI_CONF_DIR=str(conf_dir),
        IPAMD_CNI_CONFLIST_TEMPLATE=str(TEMPLATE),
        AWS_VPC_ENI_MTU="8500",
    )
    try:
        assert running.wait_for("/readyz", status=503) == 503
        deadline = time.monotonic() + 30
        while (conf_dir / TEMPLATE.name).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not (conf_dir / TEMPLATE.name).exists()
        assert _stop(running)[0] == 0
    finally:
        if running.process.poll() is None:
            running.process.kill()
            running.process.communicate()


def test_the_log_file_holds_the_lines_of_standard_error(tmp_path: Path) -> None:
    log_file = tmp_path / "aws-routed-eni" / "ipamd.log"
    running = _start(
        tmp_path,
        AWS_VPC_K8S_CNI_LOG_FILE=str(log_file),
        AWS_VPC_K8S_CNI_LOGLEVEL="Warn",
        AWS_VPC_K8S_PLUGIN_LOG_LEVEL="error",
    )
    try:
        assert running.wait_for("/readyz") == 200
        code, stderr = _stop(running)
        assert code == 0
    finally:
        if running.process.poll() is None:
            running.process.kill()
            running.process.communicate()
    on_stderr = [line for line in stderr.splitlines() if line.startswith("{")]
    assert log_file.read_text().splitlines() == on_stderr
    assert {json.loads(line)["level"] for line in on_stderr} <= {"warn", "error", "fatal"}
    assert "daemon.ready" not in log_file.read_text(), "info is below warn"


def test_at_info_an_events_pairs_are_fields_of_their_own(tmp_path: Path) -> None:
    running = _start(tmp_path, AWS_VPC_K8S_CNI_LOGLEVEL="INFO")
    try:
        assert running.wait_for("/readyz") == 200
        assert _stop(running)[0] == 0
    finally:
        if running.process.poll() is None:
            running.process.kill()
            running.process.communicate()
    log_file = tmp_path / ".run" / "aws-routed-eni" / "ipamd.log"  # the embedded default
    lines = [json.loads(line) for line in log_file.read_text().splitlines()]
    (ready,) = [x for x in lines if x["msg"].startswith("daemon.ready ")]
    assert ready["level"] == "info" and ready["instance_id"].startswith("i-")
    assert re.fullmatch(r"\w+/\w+\.py:\d+", ready["caller"]), ready["caller"]
    (effective,) = [x for x in lines if x["msg"].startswith("config.effective ")]
    assert "AWS_VPC_K8S_CNI_LOG_FILE=./.run/aws-routed-eni/ipamd.log " in effective["msg"]


def test_a_log_file_that_cannot_be_opened_is_said_once_and_ipamd_serves(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    running = _start(tmp_path, AWS_VPC_K8S_CNI_LOG_FILE=str(blocker / "ipamd.log"))
    try:
        assert running.wait_for("/readyz") == 200
        code, stderr = _stop(running)
        assert code == 0
    finally:
        if running.process.poll() is None:
            running.process.kill()
            running.process.communicate()
    said = [json.loads(x) for x in stderr.splitlines() if "log.file_" in x]
    assert [(x["level"], x["msg"].split()[0], x["path"]) for x in said] == [
        ("warn", "log.file_unavailable", str(blocker / "ipamd.log"))
    ]
    assert "daemon.ready" in stderr
