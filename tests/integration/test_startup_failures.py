"""A start the machine refuses is one line on stderr and an exit code, never a traceback: a second
daemon on a state directory already in use, a metrics port in use, a socket or state directory that
cannot be created, an ENIConfig file without the node's zone; a bad ENIConfig file or address
family is reported as invalid configuration, one line per problem."""

from __future__ import annotations

import hashlib
import json
import signal
import socket
from pathlib import Path

import pytest

from datastore.store import STATE_FILE_NAME
from tests.support.embedded_daemon import EmbeddedDaemon, start_daemon

EXIT_CONFIG = 2
EXIT_STATE = 3


def _refused(daemon: EmbeddedDaemon) -> tuple[int, str]:
    """The exit code and the one line a refused start printed."""
    code = daemon.wait()
    text = "\n".join(daemon.lines)
    assert "Traceback" not in text, text
    printed = daemon.plain_lines
    assert len(printed) == 1, printed
    return code, printed[0]


def _digests(directory: Path) -> dict[str, tuple[str, int]]:
    return {
        p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(directory.iterdir())
    }


def test_a_second_daemon_on_the_same_state_directory_exits_and_touches_nothing(
    tmp_path: Path, started: list[EmbeddedDaemon]
) -> None:
    first = start_daemon(tmp_path)
    started.append(first)
    first.wait_for("/readyz")
    address = first.add("c1")
    # Frozen, the first daemon writes nothing (its pool may still be filling): any change to the
    # directory while it is stopped is the second's. Its lock stays held.
    first.process.send_signal(signal.SIGSTOP)
    try:
        state_dir = first.state_dir
        before = _digests(state_dir)
        assert {STATE_FILE_NAME, "ipamd.lock", "embedded-cloud.json"} <= set(before)
        second = start_daemon(tmp_path, socket_name="second.sock")
        started.append(second)
        code, line = _refused(second)
        after = _digests(state_dir)
    finally:
        first.process.send_signal(signal.SIGCONT)

    assert code == EXIT_STATE
    assert str(state_dir) in line and f"pid {first.process.pid}" in line, line
    assert after == before, "the second daemon wrote nothing in the directory"
    assert not (tmp_path / "second.sock").exists()
    assert first.process.poll() is None
    first.wait_for("/readyz")
    assert first.add("c1") == address, "the first daemon serves on"
    assert first.call("GET", "/v1/pool")[0] == 200
    assert first.stop() == 0


@pytest.mark.parametrize("setting", ["IPAMD_METRICS_ADDR", "INTROSPECTION_BIND_ADDRESS"])
def test_a_port_set_explicitly_and_in_use_is_one_line(
    tmp_path: Path, started: list[EmbeddedDaemon], setting: str
) -> None:
    """Even embedded, where a default port that is taken gives way to a free one
    (`test_embedded_node`): an address someone chose is served on, or refused."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        daemon = start_daemon(tmp_path, **{setting: f"127.0.0.1:{port}"})
        started.append(daemon)
        code, line = _refused_after_banner(daemon)
    assert code == EXIT_CONFIG
    assert f"127.0.0.1:{port}" in line and setting in line, line


def _refused_after_banner(daemon: EmbeddedDaemon) -> tuple[int, str]:
    """As `_refused`, for a step after the embedded cloud announced itself."""
    code = daemon.wait()
    assert "Traceback" not in "\n".join(daemon.lines)
    printed = [line for line in daemon.plain_lines if not line.startswith("ipamd: embedded cloud")]
    assert len(printed) == 1, daemon.plain_lines
    return code, printed[0]


@pytest.mark.parametrize("own_runtime", [True, False], ids=["embedded-runtime", "outside-runtime"])
def test_a_socket_directory_that_cannot_be_made_is_one_line(
    tmp_path: Path, started: list[EmbeddedDaemon], own_runtime: bool
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("in the way")
    extra = {} if own_runtime else {"IPAMD_CRI_SOCKET": str(tmp_path / "no-runtime.sock")}
    daemon = start_daemon(tmp_path, socket_name="a-file/ipamd.sock", **extra)
    started.append(daemon)
    code, line = _refused_after_banner(daemon)
    assert code == EXIT_CONFIG
    assert "IPAMD_SOCKET" in line and str(blocker) in line, line
    assert "not a directory" in line.lower(), line


def test_a_state_directory_that_cannot_be_made_is_one_line(
    tmp_path: Path, started: list[EmbeddedDaemon]
) -> None:
    (tmp_path / "a-file").write_text("in the way")
    # No log file either (./.run/aws-routed-eni/ipamd.log embedded): the log is on stderr.
    daemon = start_daemon(tmp_path, state="a-file/state", AWS_VPC_K8S_CNI_LOG_FILE="stdout")
    started.append(daemon)
    code, line = _refused(daemon)
    assert code == EXIT_CONFIG
    assert "IPAMD_STATE_DIR" in line and str(tmp_path / "a-file" / "state") in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"], "nothing else was made"


def _eniconfig_file(tmp_path: Path, zones: dict[str, object]) -> Path:
    path = tmp_path / "eniconfigs.json"
    path.write_text(json.dumps(zones), encoding="utf-8")
    return path


def test_a_bad_eniconfig_file_is_one_clear_start_up_error(
    tmp_path: Path, started: list[EmbeddedDaemon]
) -> None:
    path = _eniconfig_file(tmp_path, {"us-west-2a": {"subnet": "subnet-nope"}})
    daemon = start_daemon(
        tmp_path, AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG="true", IPAMD_ENI_CONFIG_FILE=str(path)
    )
    started.append(daemon)

    code = daemon.wait()

    assert code == EXIT_CONFIG
    assert "Traceback" not in "\n".join(daemon.lines)
    assert daemon.plain_lines == [
        "ipamd: invalid configuration:",
        f"IPAMD_ENI_CONFIG_FILE={str(path)!r}: entry 'us-west-2a': subnet 'subnet-nope' must be a "
        "subnet ID: subnet- and 8 or 17 hex digits, like subnet-0123456789abcdef0",
    ]
    assert not daemon.state_dir.exists(), "refused before anything was made"


def test_an_eniconfig_file_without_the_nodes_zone_is_one_line(
    tmp_path: Path, started: list[EmbeddedDaemon]
) -> None:
    path = _eniconfig_file(tmp_path, {"eu-west-1a": {"subnet": "subnet-0123456789abcdef0"}})
    daemon = start_daemon(
        tmp_path, AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG="true", IPAMD_ENI_CONFIG_FILE=str(path)
    )
    started.append(daemon)

    code, line = _refused_after_banner(daemon)

    assert code == EXIT_CONFIG
    assert line.startswith(f"ipamd: IPAMD_ENI_CONFIG_FILE={str(path)!r} has no ENIConfig for "), (
        line
    )
    assert "this node's zone 'us-west-2a' (it has eu-west-1a)" in line, line
    assert not (daemon.state_dir / STATE_FILE_NAME).exists(), "the state file was never opened"


def test_a_broken_address_family_rule_is_invalid_configuration(
    tmp_path: Path, started: list[EmbeddedDaemon]
) -> None:
    daemon = start_daemon(tmp_path, ENABLE_IPv6="true", ENABLE_PREFIX_DELEGATION="false")
    started.append(daemon)

    code = daemon.wait()

    assert code == EXIT_CONFIG
    assert "Traceback" not in "\n".join(daemon.lines)
    assert daemon.plain_lines == [
        "ipamd: invalid configuration:",
        "ENABLE_IPv4='true', ENABLE_IPv6='true': exactly one address family may be on (there is "
        "no dual stack)",
        "ENABLE_IPv6='true': needs ENABLE_PREFIX_DELEGATION=true (is 'false'): IPv6 pods' "
        "addresses come from a /80 prefix",
    ]
    assert not daemon.state_dir.exists(), "refused before anything was made"
