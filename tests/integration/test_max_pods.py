"""`ipamd run --embedded` on an m5.large (2 vCPUs): `GET /v1/pool` and `ipamctl status` say the
node's max pods and the rule that set it, from the kubelet's config when it has maxPods, else from
the embedded EC2's DescribeInstanceTypes answer; a malformed kubelet config stops the start."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.embedded_daemon import BIN, EmbeddedDaemon, clean_env, start_daemon


@pytest.mark.parametrize(
    ("prefix_delegation", "max_pods", "rule", "line"),
    [
        (
            "true",
            58,
            "kubelet",
            "max pods: 58, the kubelet's maxPods=58"
            " (the prefix formula gives 3 ENIs x 144 addresses + 2 = 434)",
        ),
        (
            "false",
            29,
            "secondary-ip-formula",
            "max pods: 29, secondary-IP formula: 3 ENIs x 9 addresses + 2 = 29,"
            " within the 110 cap for 2 vCPUs",
        ),
        (
            "true",
            110,
            "cap-110-vcpus-30-or-fewer",
            "max pods: 110, the 110 cap for 2 vCPUs;"
            " the prefix formula gives 3 ENIs x 144 addresses + 2 = 434",
        ),
    ],
)
def test_pool_and_status_say_which_rule_set_max_pods(
    tmp_path: Path,
    started: list[EmbeddedDaemon],
    prefix_delegation: str,
    max_pods: int,
    rule: str,
    line: str,
) -> None:
    kubelet = tmp_path / "kubelet" / "config.json"
    if rule == "kubelet":
        kubelet.parent.mkdir()
        kubelet.write_text(json.dumps({"kind": "KubeletConfiguration", "maxPods": 58}))
    daemon = start_daemon(
        tmp_path,
        IPAMD_EMBEDDED_INSTANCE_TYPE="m5.large",
        ENABLE_PREFIX_DELEGATION=prefix_delegation,
        IPAMD_HOST_NETWORK="off",
        IPAMD_KUBELET_CONFIG=str(kubelet),
    )
    started.append(daemon)
    daemon.wait_for("/readyz")
    status, pool = daemon.call("GET", "/v1/pool")
    assert status == 200, pool
    assert (pool["limits"]["max_pods"], pool["limits"]["max_pods_rule"]) == (max_pods, rule)
    shown = subprocess.run(
        [str(BIN / "ipamctl"), "--socket", str(daemon.socket_path), "status"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert line in shown.stdout.splitlines(), shown.stdout
    assert f"max_pods_rule={rule}" in shown.stdout
    said = f"maxPods=58 in {kubelet}" if rule == "kubelet" else f"no file at {kubelet}"
    assert f"kubelet config: {said}" in shown.stdout.splitlines(), shown.stdout
    assert daemon.wait_for_line(rf"pool\.max_pods max_pods={max_pods} max_pods_rule='{rule}'")
    assert daemon.stop() == 0


def test_a_malformed_kubelet_config_stops_the_start_in_one_line(tmp_path: Path) -> None:
    kubelet = tmp_path / "config.json"
    kubelet.write_text('{"kind": "KubeletConfiguration", "maxPods": "lots"}')
    state = tmp_path / "state"
    result = subprocess.run(
        [str(BIN / "ipamd"), "run", "--embedded"],
        env=clean_env(IPAMD_KUBELET_CONFIG=str(kubelet), IPAMD_STATE_DIR=str(state)),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert f"IPAMD_KUBELET_CONFIG='{kubelet}': {kubelet}: maxPods 'lots'" in result.stderr
    assert not state.exists(), "a bad configuration touches nothing"
