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


def _sh(command: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", "-c", command],
        env=clean_env(),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _banner_steps(daemon: EmbeddedDaemon) -> list[tuple[str, list[str]]]:
    """The ready banner's steps in the order printed: each one's words (a line indented by two)
    and the commands under them (indented by four), the steps without a command left out."""
    daemon.wait_for_line(r"^  Ctrl-C stops ipamd; ")
    plain = daemon.plain_lines
    first = next(i for i, line in enumerate(plain) if line.startswith("ipamd: ready. "))
    steps: list[tuple[str, list[str]]] = []
    for line in plain[first + 1 :]:
        if line.startswith("    "):
            steps[-1][1].append(line[4:])
        else:
            steps.append((line[2:], []))
        if line.startswith("  Ctrl-C stops ipamd; "):
            break
    return [(words, commands) for words, commands in steps if commands]


def _cni_answer(done: subprocess.CompletedProcess[str]) -> dict[str, object]:
    answer = json.loads(done.stdout)
    assert isinstance(answer, dict), done.stdout
    return answer


def _pasted_add(command: str, cwd: Path) -> str:
    """The printed ADD, run again while it answers code 11 (the warm pool is filling), as the
    banner says; the address it gave."""
    done = _sh(command, cwd)
    for _ in range(200):
        if done.returncode == 0 or _cni_answer(done).get("code") != 11:
            break
        done = _sh(command, cwd)
    assert done.returncode == 0, done.stdout + done.stderr
    ips = _cni_answer(done)["ips"]
    assert isinstance(ips, list)
    return str(ips[0]["address"]).split("/")[0]


def _intents(daemon: EmbeddedDaemon) -> set[str]:
    status, body = daemon.call("GET", "/v1/intents")
    assert status == 200
    return {str(i["container_id"]) for i in body["intents"]}


def _follow_the_banner(daemon: EmbeddedDaemon, cwd: Path) -> tuple[str, str]:
    """Every printed command exactly as printed, one after the other, in a shell in the daemon's
    working directory; after each, what the banner said it does. Returns the two container IDs."""
    ipamctl = f"{BIN}/ipamctl --socket {daemon.socket_path}"
    steps = _banner_steps(daemon)
    assert [len(commands) for _, commands in steps] == [1, 2, 2, 2, 2], steps
    (_, [status]), (said_add, [add, listed]), (said_del, [delete, intents]) = steps[:3]
    (said_vanish, [add_vanishing, vanish]), (said_repair, [repair, apply]) = steps[3:]
    pod = re.search(r"CNI_CONTAINERID=(\S+) ", add)
    vanishing = re.search(r"CNI_CONTAINERID=(\S+) ", add_vanishing)
    assert pod is not None and vanishing is not None
    pod_id, vanishing_id = pod.group(1), vanishing.group(1)
    assert pod_id != vanishing_id
    assert status == f"{ipamctl} status"
    assert add.endswith(
        f"CNI_COMMAND=ADD CNI_CONTAINERID={pod_id} CNI_NETNS=/var/run/netns/"
        f"{pod_id} CNI_IFNAME=eth0 CNI_PATH=/opt/cni/bin {BIN}/ipamd-cni"
    )
    assert delete == add.replace("CNI_COMMAND=ADD", "CNI_COMMAND=DEL")
    assert add_vanishing == add.replace(pod_id, vanishing_id)
    assert (listed, intents) == (f"{ipamctl} allocations", f"{ipamctl} intents")
    assert vanish == f"echo {vanishing_id} >> {daemon.state_dir / 'embedded-cri-gone'}"
    assert (repair, apply) == (f"{ipamctl} repair", f"{ipamctl} repair --apply")
    endpoint = daemon.wait_for_line(r"The embedded runtime \(CRI\) is at (\S+)\.").group(1)

    # The node: ready, its ENIs and addresses.
    shown = _sh(status, cwd)
    assert shown.returncode == 0 and shown.stdout.startswith("ipamd: ready\n"), shown
    assert "ENI" in shown.stdout and "total" in shown.stdout, shown.stdout

    # A pod's ADD: an address, which the pod then holds.
    assert "its address is in the answer" in said_add and "code 11" in said_add
    address = _pasted_add(add, cwd)
    shown = _sh(listed, cwd)
    assert shown.returncode == 0, shown
    assert any(pod_id in line and address in line for line in shown.stdout.splitlines()), shown

    # Its DEL: the address back to the pool, a delete intent that refuses a late ADD.
    assert "the address goes back to the pool" in said_del and "refuses a late ADD" in said_del
    done = _sh(delete, cwd)
    assert done.returncode == 0, done.stdout + done.stderr
    assert pod_id not in _holders(daemon)
    shown = _sh(intents, cwd)
    assert shown.returncode == 0 and pod_id in shown.stdout, shown
    late = _sh(add, cwd)
    assert late.returncode != 0 and "delete_intent" in str(_cni_answer(late)["details"]), late

    # Another pod, made to vanish: the runtime forgets it, ipamd still holds its address.
    assert "made to vanish behind ipamd's back" in said_vanish
    _pasted_add(add_vanishing, cwd)
    done = _sh(vanish, cwd)
    assert done.returncode == 0, done
    assert vanishing_id not in _sandbox_ids(endpoint)
    assert vanishing_id in _holders(daemon)

    # Repair shows its release, then --apply does it.
    assert "Repair shows its release, then --apply does it" in said_repair
    shown = _sh(repair, cwd)
    assert shown.returncode == 0 and "dry run" in shown.stdout, shown
    assert f"release {vanishing_id} " in shown.stdout, shown.stdout
    assert vanishing_id in _holders(daemon), "a dry run changes nothing"
    shown = _sh(apply, cwd)
    assert shown.returncode == 0 and shown.stdout.startswith("applied:"), shown
    assert f"release {vanishing_id} " in shown.stdout, shown.stdout
    assert _holders(daemon) == set()
    assert {pod_id, vanishing_id} <= _intents(daemon)
    return pod_id, vanishing_id


def test_the_printed_steps_work_pasted_in_order_on_two_runs_of_one_node(
    tmp_path: Path, started: list[EmbeddedDaemon]
) -> None:
    first = start_daemon(tmp_path)
    started.append(first)
    first.wait_for("/readyz")
    first_pods = _follow_the_banner(first, tmp_path)
    assert first.stop() == 0

    second = start_daemon(tmp_path)
    started.append(second)
    second.wait_for("/readyz")
    second_pods = _follow_the_banner(second, tmp_path)
    assert not set(first_pods) & set(second_pods), "each run's steps name containers of their own"
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
