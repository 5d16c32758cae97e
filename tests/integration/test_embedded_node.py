"""`ipamd run --embedded` is a node: killed and started again on its state directory it is the same
instance with the same ENIs and addresses, its acknowledged allocations intact and nothing
quarantined; its own container runtime lists the pods it holds and lets one vanish; the hints it
prints work on every run."""

from __future__ import annotations

import asyncio
import json
import re
import stat
import subprocess
import urllib.request
from pathlib import Path

from datastore.store import STATE_FILE_NAME
from ipamd.runtime.cri import GrpcCriRuntime
from tests.support.embedded_daemon import BIN, EmbeddedDaemon, clean_env, start_daemon

INSTANCE = r"instance (i-[0-9a-f]+) \("


def _enis(daemon: EmbeddedDaemon) -> dict[str, tuple[str, str, int, frozenset[str]]]:
    """ENI ID → (MAC, primary address, device index, units)."""
    status, body = daemon.call("GET", "/v1/enis")
    assert status == 200, body
    return {
        str(e["eni_id"]): (
            str(e["mac"]),
            str(e["primary_ip"]),
            int(e["device_index"]),
            frozenset(str(u["cidr"]) for u in e["units"]),
        )
        for e in body["enis"]
    }


def test_kill_9_then_restart_is_the_same_node(
    tmp_path: Path, started: list[EmbeddedDaemon]
) -> None:
    first = start_daemon(tmp_path)
    started.append(first)
    first.wait_for("/readyz")
    instance = first.wait_for_line(INSTANCE).group(1)
    address = first.add("c-acked")
    enis = _enis(first)
    first.kill9()  # no clean stop: nothing gets a chance to save on the way out
    assert (tmp_path / "ipamd.sock").exists(), "a killed daemon leaves its socket behind"

    second = start_daemon(tmp_path)
    started.append(second)
    second.wait_for("/readyz")
    assert second.wait_for_line(r"embedded cloud \(restored from ").group(0)
    assert second.wait_for_line(INSTANCE).group(1) == instance
    assert second.add("c-acked") == address, "a repeated ADD of an acknowledged container"
    status, allocations = second.call("GET", "/v1/allocations")
    assert status == 200
    assert allocations["quarantined"] == []
    assert [a["container_id"] for a in allocations["allocations"]] == ["c-acked"]
    status, pool = second.call("GET", "/v1/pool")
    assert status == 200, pool
    assert pool["counts"]["assigned"] == 1 and pool["counts"]["lost"] == 0, pool
    assert pool["quarantined"] == 0 and pool["allocations"] == 1
    restored = _enis(second)
    assert set(enis) <= set(restored), "every ENI the first run had is this node's"
    for eni_id, (mac, primary, index, units) in enis.items():
        assert restored[eni_id][:3] == (mac, primary, index), eni_id
        assert units <= restored[eni_id][3], eni_id
    for private in (STATE_FILE_NAME, "embedded-cloud.json", "ipamd.lock"):
        assert stat.S_IMODE((second.state_dir / private).stat().st_mode) == 0o600, private
    assert second.stop() == 0


def _sandbox_ids(endpoint: str) -> set[str]:
    async def listing() -> set[str]:
        runtime = GrpcCriRuntime(endpoint)
        try:
            return {s.sandbox_id for s in await runtime.list_sandboxes()}
        finally:
            await runtime.close()

    return asyncio.run(listing())


def test_embedded_runtime_lists_the_pods_and_leak_gc_releases_a_vanished_one(
    tmp_path: Path, started: list[EmbeddedDaemon]
) -> None:
    daemon = start_daemon(tmp_path, IPAMD_LEAK_GRACE="0", IPAMD_LEAK_GC_INTERVAL="0.2")
    started.append(daemon)
    daemon.wait_for("/readyz")
    endpoint = daemon.wait_for_line(r"The embedded runtime \(CRI\) is at (\S+)\.").group(1)
    assert endpoint == f"unix://{tmp_path / 'ipamd-cri.sock'}"
    daemon.add("pod-stays")
    daemon.add("pod-vanishes")
    assert _sandbox_ids(endpoint) == {"pod-stays", "pod-vanishes"}

    gone_file = daemon.state_dir / "embedded-cri-gone"
    gone_file.write_text("pod-vanishes\n")
    assert _sandbox_ids(endpoint) == {"pod-stays"}
    deadline = 30.0
    _poll_until(daemon, lambda: _holders(daemon) == {"pod-stays"}, deadline)
    status, intents = daemon.call("GET", "/v1/intents")
    assert status == 200
    assert [i["container_id"] for i in intents["intents"]] == ["pod-vanishes"]
    key = {"container_id": "pod-vanishes", "ifname": "eth0", "network": "k8s-pod-network"}
    status, refused = daemon.call("POST", "/v1/allocations", key)
    assert status == 409 and refused["code"] == "delete_intent"
    assert daemon.stop() == 0


def test_the_runtime_keeps_its_pods_in_its_own_record_across_restarts(
    tmp_path: Path, started: list[EmbeddedDaemon]
) -> None:
    first = start_daemon(tmp_path)
    started.append(first)
    first.wait_for("/readyz")
    first.add("pod-kept")
    first.add("pod-deleted")
    status, _ = first.call("DELETE", "/v1/allocations/pod-deleted/eth0?network=k8s-pod-network")
    assert status == 200
    record = tmp_path / "ipamd-cri" / "sandboxes.json"
    kept = json.loads(record.read_text())
    assert [s["id"] for s in kept["sandboxes"]] == ["pod-kept"]
    assert first.stop() == 0

    # A node made before the runtime kept a record: it adopts the pods ipamd holds, once.
    record.unlink()
    second = start_daemon(tmp_path)
    started.append(second)
    second.wait_for("/readyz")
    assert _sandbox_ids(f"unix://{tmp_path / 'ipamd-cri.sock'}") == {"pod-kept"}
    assert json.loads(record.read_text()) == kept
    assert second.stop() == 0


def test_a_runtime_record_that_cannot_be_read_stops_the_start_naming_it(
    tmp_path: Path, started: list[EmbeddedDaemon]
) -> None:
    record = tmp_path / "ipamd-cri" / "sandboxes.json"
    record.parent.mkdir()
    record.write_text("not json")
    daemon = start_daemon(tmp_path)
    started.append(daemon)
    assert daemon.wait() == 3
    assert "Traceback" not in "\n".join(daemon.lines)
    [line] = [s for s in daemon.plain_lines if not s.startswith("ipamd: embedded cloud")]
    assert line.startswith(f"ipamd: the embedded runtime's record {record} is unusable: "), line
    assert line.endswith("; move it aside to start the runtime without its pods"), line
    assert record.read_text() == "not json", "left as it was"
    assert not (tmp_path / "ipamd-cri.sock").exists()


def _holders(daemon: EmbeddedDaemon) -> set[str]:
    status, body = daemon.call("GET", "/v1/allocations")
    assert status == 200
    return {str(a["container_id"]) for a in body["allocations"]}


def _poll_until(daemon: EmbeddedDaemon, done: object, deadline_s: float) -> None:
    import time

    assert callable(done)
    end = time.monotonic() + deadline_s
    while not done():
        assert daemon.process.poll() is None, daemon.lines[-20:]
        assert time.monotonic() < end, f"not done in {deadline_s} s"
        time.sleep(0.05)


def _hint(daemon: EmbeddedDaemon, command: str) -> str:
    """The printed hint line running ipamd-cni with CNI_COMMAND=`command`."""
    line = daemon.wait_for_line(rf"^  echo .*CNI_COMMAND={command} .*ipamd-cni$").group(0)
    return line.strip()


def _sh(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", "-c", command],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _run_hints(daemon: EmbeddedDaemon) -> tuple[str, str]:
    """Paste the printed ADD (retried while the pool fills, as a runtime would), ADD again, DEL;
    returns (container ID, address)."""
    add, delete = _hint(daemon, "ADD"), _hint(daemon, "DEL")
    container = re.search(r"CNI_CONTAINERID=(\S+)", add)
    assert container is not None
    status = _ipamctl(daemon, "status")
    assert status.returncode == 0 and "total" in status.stdout, status.stderr
    first = _sh(add)
    for _ in range(100):
        if first.returncode == 0 or json.loads(first.stdout).get("code") != 11:
            break
        first = _sh(add)  # 11: try again later (the warm pool is filling)
    assert first.returncode == 0, first.stdout + first.stderr
    address = json.loads(first.stdout)["ips"][0]["address"]
    again = _sh(add)
    assert again.returncode == 0 and json.loads(again.stdout)["ips"][0]["address"] == address
    done = _sh(delete)
    assert done.returncode == 0, done.stdout + done.stderr
    assert container.group(1) not in _holders(daemon)
    return container.group(1), address


def _ipamctl(daemon: EmbeddedDaemon, *args: str) -> subprocess.CompletedProcess[str]:
    line = daemon.wait_for_line(r"^  (\S+/ipamctl) --socket (\S+) status$")
    assert line.group(1) == str(BIN / "ipamctl") and line.group(2) == str(daemon.socket_path)
    return subprocess.run(
        [line.group(1), "--socket", line.group(2), *args],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_printed_hints_work_on_two_runs_of_one_node(
    tmp_path: Path, started: list[EmbeddedDaemon]
) -> None:
    first = start_daemon(tmp_path)
    started.append(first)
    first.wait_for("/readyz")
    first_container, _ = _run_hints(first)
    assert first.stop() == 0

    second = start_daemon(tmp_path)
    started.append(second)
    second.wait_for("/readyz")
    second_container, _ = _run_hints(second)
    assert second_container != first_container, "each run's hints name a container of their own"
    gone = second.wait_for_line(r"^    echo (\S+) >> (\S+)$")
    assert gone.group(1) == second_container
    assert gone.group(2) == str(second.state_dir / "embedded-cri-gone")
    assert second.stop() == 0


def test_an_unusable_state_file_prints_no_ready_hints_but_the_repair_command(
    tmp_path: Path, started: list[EmbeddedDaemon]
) -> None:
    state = tmp_path / "state" / STATE_FILE_NAME
    state.parent.mkdir()
    state.write_bytes(b"not a database" * 100)
    daemon = start_daemon(tmp_path)
    started.append(daemon)
    daemon.wait_for("/readyz", status=503)
    repair = daemon.wait_for_line(r"^ipamd: not ready\. `(\S+ --socket \S+ repair)` shows").group(1)
    assert str(state) in "\n".join(daemon.plain_lines)
    shown = _sh(repair)
    assert shown.returncode == 0 and "dry run" in shown.stdout, shown.stdout + shown.stderr
    assert daemon.stop() == 0
    assert not any(line.startswith("ipamd: ready") for line in daemon.plain_lines)
    assert state.read_bytes() == b"not a database" * 100


def _endpoint(daemon: EmbeddedDaemon, name: str) -> tuple[int, str]:
    """The port of the banner's `name` line (Metrics, Introspection), and the line."""
    found = daemon.wait_for_line(rf"^  {name}: http://127\.0\.0\.1:(\d+)/\S+( .*)?$")
    return int(found.group(1)), found.group(0)


def _http_get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
        assert answer.status == 200
        return str(answer.read().decode())


def _assigned(metrics: str) -> float:
    found = re.search(r"^awscni_assigned_ip_addresses (\S+)$", metrics, re.MULTILINE)
    assert found is not None, metrics[:2000]
    return float(found.group(1))


def test_a_second_embedded_node_on_the_machine_serves_on_free_ports(
    tmp_path: Path, started: list[EmbeddedDaemon]
) -> None:
    """Two clones' `make run`: neither sets the metrics or introspection address (61678, 61679).
    The second finds them taken (by the first, or by anyone), listens on free ports instead and
    says so in its banner; each serves its own node's metrics on its port."""
    daemons = []
    for clone in ("one", "two"):
        (tmp_path / clone).mkdir()
        daemon = start_daemon(
            tmp_path / clone, IPAMD_METRICS_ADDR="", INTROSPECTION_BIND_ADDRESS=""
        )
        started.append(daemon)
        daemon.wait_for("/readyz")
        daemons.append(daemon)
    first, second = daemons

    metrics, line = _endpoint(second, "Metrics")
    assert metrics != 61678
    assert line.endswith(" (port 61678 was taken; IPAMD_METRICS_ADDR sets it)"), line
    introspection, line = _endpoint(second, "Introspection")
    assert introspection != 61679
    assert line.endswith(" (port 61679 was taken; INTROSPECTION_BIND_ADDRESS sets it)"), line
    ports = {
        "first metrics": _endpoint(first, "Metrics")[0],
        "first introspection": _endpoint(first, "Introspection")[0],
        "second metrics": metrics,
        "second introspection": introspection,
    }
    assert len(set(ports.values())) == 4, ports

    second.add("pod-on-two")  # only the second node has a pod: each endpoint is its own node's
    assert _assigned(_http_get(ports["second metrics"], "/metrics")) == 1
    assert _assigned(_http_get(ports["first metrics"], "/metrics")) == 0
    enis = json.loads(_http_get(ports["second introspection"], "/v1/enis"))
    assert enis["AssignedIPs"] == 1, enis
    assert json.loads(_http_get(ports["first introspection"], "/v1/enis"))["AssignedIPs"] == 0
    assert first.stop() == 0 and second.stop() == 0
