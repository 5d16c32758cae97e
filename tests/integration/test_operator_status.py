"""What an operator sees when the pool is wrong, through the processes they run: `ipamd run --embedded`
and `ipamctl`, asserted on the text and JSON fields they print.

- Custom networking whose ENIConfig names a subnet that does not exist: the ADD's CNI error names
  EC2's code and the subnet, `ipamctl status` says ready but degraded with the pool's last failure
  (blocking, when it is tried again), `/readyz` lists it, and `ipamd_pool_blocked` is 1.
- The targets in force: MINIMUM_IP_TARGET wins and WARM_ENI_TARGET shows as ignored, with why; a
  MINIMUM_IP_TARGET above what the node can hold is said at start.
- A pool with spare addresses held for IPAMD_RELEASE_DELAY says what waits and when it goes.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

from bench.vpc.processes import free_port
from tests.support.embedded_daemon import (
    BIN,
    NETWORK,
    EmbeddedDaemon,
    clean_env,
    start_daemon,
)

IPAMCTL = str(BIN / "ipamctl")
MISSING = "subnet-0123456789abcdef0"


def ipamctl(daemon: EmbeddedDaemon, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [IPAMCTL, "--socket", str(daemon.socket_path), *args],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _eniconfigs(tmp_path: Path) -> Path:
    path = tmp_path / "eniconfigs.json"
    zones = [f"us-west-2{z}" for z in "abcd"]
    path.write_text(json.dumps({zone: {"subnet": MISSING} for zone in zones}))
    return path


def _until(check: object, deadline_s: float = 30.0) -> None:
    end = time.monotonic() + deadline_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < end, "not in time"
        time.sleep(0.1)


def test_a_final_refusal_reaches_the_add_status_readyz_and_metrics(
    tmp_path: Path, started: list[EmbeddedDaemon]
) -> None:
    metrics = free_port()
    daemon = start_daemon(
        tmp_path,
        AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG="true",
        IPAMD_ENI_CONFIG_FILE=str(_eniconfigs(tmp_path)),
        MINIMUM_IP_TARGET="500",
        WARM_ENI_TARGET="1",
        IPAMD_METRICS_ADDR=f"127.0.0.1:{metrics}",
    )
    started.append(daemon)
    daemon.wait_for("/readyz")
    key = {"container_id": "c" * 64, "ifname": "eth0", "network": NETWORK}

    answers: list[dict[str, object]] = []

    def refused_with_cause() -> bool:
        status, body = daemon.call("POST", "/v1/allocations", key)
        assert status == 503, (status, body)
        answers.append(body)
        return "InvalidSubnetID.NotFound" in str(body.get("message"))

    _until(refused_with_cause)
    message = str(answers[-1]["message"])
    assert MISSING in message and "next try at" in message, message

    status = ipamctl(daemon, "status")
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert lines[0] == "ipamd: ready"
    assert lines[1].startswith("degraded: ") and "InvalidSubnetID.NotFound" in lines[1]
    failure = [line for line in lines if line.startswith("last pool failure at ")]
    assert failure and "blocking" in failure[0] and MISSING in failure[0], lines
    targets = next(line for line in lines if "targets:" in line)
    assert "MINIMUM_IP_TARGET=500" in targets and "ignored: WARM_ENI_TARGET=1 (" in targets

    code, ready = daemon.call("GET", "/readyz")
    assert code == 200 and any(MISSING in reason for reason in ready["degraded"]), ready
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=10) as answer:
        exposed = answer.read().decode()
    assert "\nipamd_pool_blocked 1.0\n" in exposed

    warned = daemon.wait_for_line(r"config\.target_exceeds_capacity MINIMUM_IP_TARGET=500")
    assert "capacity=" in warned.string


def test_spare_addresses_say_when_they_go(tmp_path: Path, started: list[EmbeddedDaemon]) -> None:
    daemon = start_daemon(
        tmp_path, WARM_IP_TARGET="1", MINIMUM_IP_TARGET="1", IPAMD_RELEASE_DELAY="300"
    )
    started.append(daemon)
    daemon.wait_for("/readyz")
    ids = [f"{n:064x}" for n in range(1, 7)]
    for container_id in ids:
        daemon.add(container_id)
    for container_id in ids:
        code, _ = daemon.call("DELETE", f"/v1/allocations/{container_id}/eth0?network={NETWORK}")
        assert code == 200

    seen: list[str] = []

    def spare_shown() -> bool:
        done = ipamctl(daemon, "status")
        seen.append(done.stdout)
        return "spare: " in done.stdout

    _until(spare_shown, deadline_s=60.0)
    (line,) = [x for x in seen[-1].splitlines() if x.startswith("spare: ")]
    assert "IPAMD_RELEASE_DELAY" in line and line.split(" the first at ")[1][:4].isdigit(), line
    pool = json.loads(ipamctl(daemon, "--json", "status").stdout)
    assert pool["spare"]["waiting"] >= 1 and pool["spare"]["release_at"].endswith("Z")
    assert pool["in_force"]["targets"] == ["WARM_IP_TARGET", "MINIMUM_IP_TARGET"]


def test_the_no_ip_runbook_followed_step_by_step(
    tmp_path: Path, started: list[EmbeddedDaemon]
) -> None:
    """docs/operations.md, "A pod has no IP address", case 2, as an operator follows it."""
    eniconfigs = _eniconfigs(tmp_path)
    env = {
        "AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG": "true",
        "IPAMD_ENI_CONFIG_FILE": str(eniconfigs),
    }
    daemon = start_daemon(tmp_path, **env)
    started.append(daemon)
    daemon.wait_for("/readyz")
    key = {"container_id": "d" * 64, "ifname": "eth0", "network": NETWORK}

    def refused_with_cause() -> bool:
        status, body = daemon.call("POST", "/v1/allocations", key)
        assert status == 503 and body.get("code") == "no_address", (status, body)
        return "the pool cannot add addresses" in str(body.get("message"))

    _until(refused_with_cause)  # the pod's event: CNI code 11 with the cause

    # Start with `ipamctl status`: its first lines say which case it is.
    lines = ipamctl(daemon, "status").stdout.splitlines()
    assert lines[0] == "ipamd: ready"
    assert lines[1].startswith("degraded: the pool cannot add addresses: EC2 refused it at ")
    assert "InvalidSubnetID.NotFound" in lines[1] and "next try at " in lines[1]

    # InvalidSubnetID.NotFound: correct the ENIConfig and restart ipamd's pod.
    enis = json.loads(ipamctl(daemon, "--json", "enis").stdout)["enis"]
    subnet = next(e["subnet_id"] for e in enis if e["is_primary"])
    zones = json.loads(eniconfigs.read_text())
    eniconfigs.write_text(json.dumps({zone: {"subnet": subnet} for zone in zones}))
    assert daemon.stop() == 0
    daemon = start_daemon(tmp_path, **env)
    started.append(daemon)
    daemon.wait_for("/readyz")

    # The degraded line is gone and the pod gets its address.
    assert daemon.add(key["container_id"])
    status = ipamctl(daemon, "status")
    assert status.returncode == 0
    assert status.stdout.splitlines()[0] == "ipamd: ready"
    assert "degraded:" not in status.stdout
