"""docs/operations.md's runbook "ipamd never becomes ready: the state file is unusable", rehearsed on
`ipamd run --embedded` as its "Rehearse it on a laptop" says: a pod ADDed through the plugin as the
banner prints it, ipamd stopped (Ctrl-C), `truncate -s 0` on the state file, ipamd started again;
then what the runbook says ipamd shows, and its steps as written, `ipamctl` as a process. The
embedded runtime keeps its own record of its pods, so the rebuild from EC2 and the runtime gives the
pod its address back, and a new ADD works."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
from pathlib import Path

from datastore.store import STATE_FILE_NAME
from ipamd.runtime.cri import GrpcCriRuntime
from tests.support.embedded_daemon import BIN, EmbeddedDaemon, clean_env, start_daemon

EXIT_RESTART = 75


def _sh(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", "-c", command],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _ipamctl(daemon: EmbeddedDaemon, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "ipamctl"), "--socket", str(daemon.socket_path), *args],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _printed_add(daemon: EmbeddedDaemon) -> tuple[str, str]:
    """The banner's plugin ADD, as printed, and its container ID."""
    line = daemon.wait_for_line(r"^\s*(echo .*CNI_COMMAND=ADD .*ipamd-cni)$").group(1)
    container = re.search(r"CNI_CONTAINERID=(\S+)", line)
    assert container is not None, line
    return line, container.group(1)


def _for_container(command: str, old: str, new: str) -> str:
    """The printed command for another container ID (its netns named after it, as printed)."""
    return command.replace(old, new)


def _cni_add(command: str) -> str:
    """Run a plugin ADD, again while the warm pool fills (code 11, as a runtime retries); returns
    the pod's address."""
    done = _sh(command)
    for _ in range(200):
        if done.returncode == 0 or json.loads(done.stdout).get("code") != 11:
            break
        done = _sh(command)
    assert done.returncode == 0, done.stdout + done.stderr
    return str(json.loads(done.stdout)["ips"][0]["address"]).split("/")[0]


def _listed(endpoint: str) -> dict[str, tuple[str, ...]]:
    """The runtime's sandboxes over CRI, with the addresses PodSandboxStatus gives each."""

    async def listing() -> dict[str, tuple[str, ...]]:
        async with GrpcCriRuntime(endpoint, timeout_s=10.0) as runtime:
            return {
                s.sandbox_id: await runtime.sandbox_addresses(s.sandbox_id)
                for s in await runtime.list_sandboxes()
            }

    return asyncio.run(listing())


def _events(daemon: EmbeddedDaemon, name: str) -> list[str]:
    """The `msg` of each JSON log line whose event is `name`."""
    found = []
    for line in list(daemon.lines):
        if line.startswith("{"):
            msg = str(json.loads(line)["msg"])
            if msg.split(" ", 1)[0] == name:
                found.append(msg)
    return found


def test_the_unusable_state_runbook_rebuilds_every_pod_on_the_embedded_node(
    tmp_path: Path, started: list[EmbeddedDaemon]
) -> None:
    first = start_daemon(tmp_path)
    started.append(first)
    first.wait_for("/readyz")
    add, pod = _printed_add(first)
    address = _cni_add(add)
    gone_pod = f"{pod}-deleted"
    _cni_add(_for_container(add, pod, gone_pod))
    delete = _for_container(add, "CNI_COMMAND=ADD", "CNI_COMMAND=DEL")
    assert _sh(_for_container(delete, pod, gone_pod)).returncode == 0
    endpoint = f"unix://{tmp_path / 'ipamd-cri.sock'}"
    assert _listed(endpoint) == {pod: (address,)}

    # The file goes bad while ipamd is stopped (a running ipamd reads it only at its start).
    first.process.send_signal(signal.SIGINT)  # Ctrl-C
    assert first.wait() == 0
    state = tmp_path / "state" / STATE_FILE_NAME
    subprocess.run(["truncate", "-s", "0", str(state)], check=True, timeout=30)

    second = start_daemon(tmp_path)
    started.append(second)
    second.wait_for("/readyz", status=503)

    # What ipamd shows.
    status, ready = second.call("GET", "/readyz")
    assert status == 503 and ready["code"] == "not_ready", ready
    assert f"the state is unavailable: state file {state} is unusable: " in ready["message"]
    [unusable] = _events(second, "store.unusable")
    assert unusable.startswith(f"store.unusable path={state} reason=")
    assert _events(second, "daemon.not_ready")
    shown = _ipamctl(second, "status")
    assert shown.returncode == 1 and shown.stdout == "", shown
    assert shown.stderr.startswith(f"ipamctl: ipamd serves no pool: state file {state} is unusable")
    refused = _sh(_for_container(add, pod, f"{pod}-new"))
    assert refused.returncode != 0
    error = json.loads(refused.stdout)
    assert error["code"] == 102, error
    assert error["msg"] == "ipamd's state file is unusable; see ipamctl repair", error
    assert _sh(_for_container(delete, pod, f"{pod}-new")).returncode == 0, "DEL succeeds"
    assert _listed(endpoint) == {pod: (address,)}, "the runtime's pod outlived ipamd's state"

    # 1. `ipamctl repair` (dry run) lists the rebuild.
    dry = _ipamctl(second, "repair")
    assert dry.returncode == 0, dry
    assert dry.stdout.splitlines()[0] == "dry run (use --apply to make these changes):"
    assert (
        f"  move the unusable {state} aside and build a new one from EC2 and the runtime"
        in dry.stdout.splitlines()
    )
    assert f"  allocate {address} to sandbox {pod}" in dry.stdout.splitlines()
    assert gone_pod not in dry.stdout
    assert state.stat().st_size == 0, "a dry run changes nothing"

    # 2. `ipamctl repair --apply`: the file moved aside, a new one built, ipamd exits with 75.
    applied = _ipamctl(second, "repair", "--apply")
    assert applied.returncode == 0, applied
    lines = applied.stdout.splitlines()
    assert lines[0] == "applied:" and f"  allocate {address} to sandbox {pod}" in lines
    kept = re.search(r"^  the unusable file was kept as (\S+)$", applied.stdout, re.MULTILINE)
    assert kept is not None, applied.stdout
    aside = Path(kept.group(1))
    assert re.fullmatch(rf"{STATE_FILE_NAME}\.unusable-\d+", aside.name)
    assert aside.parent == state.parent and aside.stat().st_size == 0, "kept for inspection"
    assert not any(line.startswith("  cannot fix:") for line in lines), lines
    assert second.wait() == EXIT_RESTART
    assert any("reason=state_rebuilt" in m for m in _events(second, "daemon.stopped"))

    # 3. Started again (kubelet does it; on a laptop, `make run`): ready, the pod back with its
    # address, and a new ADD works.
    third = start_daemon(tmp_path)
    started.append(third)
    third.wait_for("/readyz")
    assert _ipamctl(third, "status").returncode == 0
    listed = _ipamctl(third, "--json", "allocations")
    assert listed.returncode == 0, listed
    holders = {
        a["container_id"]: [ip["address"].split("/")[0] for ip in a["ips"]]
        for a in json.loads(listed.stdout)["allocations"]
    }
    assert holders == {pod: [address]}, holders
    assert _listed(endpoint) == {pod: (address,)}
    new_add, new_pod = _printed_add(third)
    new_address = _cni_add(new_add)
    assert new_pod != pod and new_address != address
    assert _ipamctl(third, "repair").stdout.splitlines()[-1] == "  nothing to repair"
    # The rebuilt pod's DEL releases it as any other's.
    assert _sh(delete).returncode == 0
    assert pod not in _listed(endpoint)
    after = json.loads(_ipamctl(third, "--json", "allocations").stdout)["allocations"]
    assert [a["container_id"] for a in after] == [new_pod]
    assert third.stop() == 0
