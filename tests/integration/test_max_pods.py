"""`ipamd run --embedded` on an m5.large (2 vCPUs): `GET /v1/pool` and `ipamctl status` say the
node's max pods and the rule that set it, from the embedded EC2's DescribeInstanceTypes answer."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.embedded_daemon import BIN, EmbeddedDaemon, clean_env, start_daemon


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[EmbeddedDaemon]]:
    daemons: list[EmbeddedDaemon] = []
    yield daemons
    for daemon in daemons:
        daemon.ensure_gone()


@pytest.mark.parametrize(
    ("prefix_delegation", "max_pods", "rule", "line"),
    [
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
    daemon = start_daemon(
        tmp_path,
        IPAMD_EMBEDDED_INSTANCE_TYPE="m5.large",
        ENABLE_PREFIX_DELEGATION=prefix_delegation,
        IPAMD_HOST_NETWORK="off",
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
    assert daemon.stop() == 0
