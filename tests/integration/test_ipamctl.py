"""`ipamctl` as an operator meets it, a process against `ipamd run --embedded` as a process: what it
says when it cannot reach ipamd (nothing there, not a socket, not running, permission denied,
another service's socket), in text and in JSON."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ipamd.wire import DEFAULT_SOCKET
from tests.support.embedded_daemon import BIN, NETWORK, EmbeddedDaemon, clean_env, start_daemon

IPAMCTL = str(BIN / "ipamctl")
NOBODY = 65534


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short directory anyone may search: a socket path must fit in 107 bytes, and the
    permission test runs ipamctl as another user."""
    path = Path(tempfile.mkdtemp(prefix="ipamctl-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def ipamctl(
    *args: str, cwd: Path | None = None, as_nobody: bool = False
) -> subprocess.CompletedProcess[str]:
    command = [IPAMCTL, *args]
    if as_nobody:
        command = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *command]
    return subprocess.run(
        command, env=clean_env(), cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def error_of(*args: str, cwd: Path | None = None, as_nobody: bool = False) -> dict[str, str]:
    """ipamctl's `--json` error: exit 2, the error on stdout, nothing on stderr."""
    done = ipamctl("--json", *args, cwd=cwd, as_nobody=as_nobody)
    assert done.returncode == 2 and done.stderr == "", (done.returncode, done.stdout, done.stderr)
    error = json.loads(done.stdout)["error"]
    assert isinstance(error, dict)
    return error


def test_each_connection_failure_is_named_for_what_it_is(
    short_dir: Path, started: list[EmbeddedDaemon]
) -> None:
    if os.path.exists(DEFAULT_SOCKET):
        pytest.skip(f"{DEFAULT_SOCKET} exists on this machine")
    daemon = start_daemon(short_dir, socket_name=".run/ipamd.sock")
    started.append(daemon)
    daemon.wait_for("/readyz")

    # No socket at the default path, and `make run`'s in this directory: ipamctl names it.
    missing = ipamctl("status", cwd=short_dir)
    assert missing.returncode == 2 and missing.stdout == ""
    assert f"ipamctl: no such file: nothing at {DEFAULT_SOCKET}" in missing.stderr
    assert "is ipamd running?" in missing.stderr
    assert "permission" not in missing.stderr
    suggested = "ipamctl --socket ./.run/ipamd.sock status"
    assert suggested in missing.stderr, missing.stderr
    pasted = ipamctl(*suggested.split()[1:], cwd=short_dir)
    assert pasted.returncode == 0 and "total" in pasted.stdout, pasted.stderr
    assert error_of("status", cwd=short_dir)["reason"] == "no_such_file"

    # The daemon's socket (0660, root's) for a user outside its group: permission denied.
    sock = str(daemon.socket_path)
    if os.geteuid() == 0 and shutil.which("setpriv"):
        denied = ipamctl("--socket", sock, "status", as_nobody=True)
        assert denied.returncode == 2
        assert f"ipamctl: permission denied on {sock} (owner root:root, mode 0660" in denied.stderr
        assert f"uid {NOBODY}" in denied.stderr
        error = error_of("--socket", sock, "status", as_nobody=True)
        assert error["code"] == "unreachable" and error["reason"] == "permission_denied"
    elif os.geteuid() != 0:
        daemon.socket_path.chmod(0)
        denied = ipamctl("--socket", sock, "status")
        daemon.socket_path.chmod(0o660)
        assert denied.returncode == 2 and "permission denied on" in denied.stderr

    # Killed with SIGKILL, the daemon leaves its socket behind: not running, not a permission.
    daemon.kill9()
    assert daemon.socket_path.is_socket()
    stale = ipamctl("--socket", sock, "status")
    assert stale.returncode == 2 and stale.stdout == ""
    assert stale.stderr.startswith(f"ipamctl: ipamd is not running: nothing listens on {sock}")
    assert "permission" not in stale.stderr
    assert error_of("--socket", sock, "repair", "--apply")["reason"] == "not_running"

    # A regular file or a directory at the path: not a socket.
    regular = short_dir / "regular"
    regular.write_text("")
    (short_dir / "directory").mkdir()
    for name, kind in (("regular", "a regular file"), ("directory", "a directory")):
        path = str(short_dir / name)
        done = ipamctl("--socket", path, "allocations")
        assert done.returncode == 2
        assert done.stderr.startswith(f"ipamctl: {path} is {kind}, not a socket"), done.stderr
        assert "permission" not in done.stderr
        assert error_of("--socket", path, "status")["reason"] == "not_a_socket"


class OtherService:
    """Another service's unix socket: each connection gets `answer` once the request's head
    arrived, then the connection closes."""

    def __init__(self, path: Path, answer: bytes) -> None:
        self.path = path
        self._answer = answer
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        self._listener.listen()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed: the test is over
            with conn:
                head = b""
                while b"\r\n\r\n" not in head and (chunk := conn.recv(4096)):
                    head += chunk
                conn.sendall(self._answer)

    def close(self) -> None:
        self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._thread.join(timeout=10)


HTML = b"<html><body>Not Found</body></html>"
OTHER_SERVICES = {
    "an HTTP server's 404 page": (
        b"HTTP/1.1 404 Not Found\r\nContent-Type: text/html\r\n"
        b"Content-Length: %d\r\n\r\n" % len(HTML) + HTML
    ),
    "an HTTP server's JSON of its own": (
        b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n{"status":"ok"}'
    ),
    "a server that does not speak HTTP": b"-ERR unknown command 'GET'\r\n",
}


@pytest.mark.parametrize("answer", OTHER_SERVICES.values(), ids=OTHER_SERVICES.keys())
def test_another_services_socket_answers_but_is_not_ipamd(short_dir: Path, answer: bytes) -> None:
    other = OtherService(short_dir / "other.sock", answer)
    try:
        done = ipamctl("--socket", str(other.path), "status")
        assert done.returncode == 2 and done.stdout == ""
        assert f"at {other.path}" in done.stderr and "not ipamd" in done.stderr, done.stderr
        assert "permission" not in done.stderr and "Traceback" not in done.stderr
        error = error_of("--socket", str(other.path), "allocations")
        assert error["code"] == "unreachable" and error["reason"] == "not_ipamd"
        assert "not ipamd" in error["message"]
    finally:
        other.close()


def _log_events(daemon: EmbeddedDaemon, event: str) -> list[dict[str, object]]:
    """The daemon's JSON log records of `event` so far."""
    records = [json.loads(line) for line in daemon.lines if line.startswith("{")]
    return [r for r in records if str(r["msg"]).split(" ", 1)[0] == event]


def test_repair_apply_is_logged_with_who_asked_and_an_idle_apply_is_no_dry_run(
    short_dir: Path, started: list[EmbeddedDaemon]
) -> None:
    daemon = start_daemon(short_dir)
    started.append(daemon)
    daemon.wait_for("/readyz")
    daemon.add("pod-stays")
    daemon.add("pod-gone")
    with (daemon.state_dir / "embedded-cri-gone").open("a") as gone:
        gone.write("pod-gone\n")
    sock = str(daemon.socket_path)
    release = "release pod-gone (k8s-pod-network/eth0): no live sandbox"

    dry = ipamctl("--socket", sock, "repair")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines() == [
        "dry run (use --apply to make these changes):",
        f"  {release}",
    ]
    assert _log_events(daemon, "api.repair") == [], "a dry run changes nothing: no line"

    applying = subprocess.Popen(
        [IPAMCTL, "--socket", sock, "repair", "--apply"],
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = applying.communicate(timeout=60)
    assert applying.returncode == 0, err
    assert out.splitlines() == ["applied:", f"  {release}"]
    daemon.wait_for_line(r'"msg": ?"api\.repair ')
    (logged,) = _log_events(daemon, "api.repair")
    assert logged["applied"] is True and logged["actions"] == [release], logged
    assert logged["uid"] == os.getuid() and logged["pid"] == applying.pid, logged

    idle = ipamctl("--socket", sock, "repair", "--apply")
    assert idle.returncode == 0, idle.stderr
    assert idle.stdout == "nothing to repair; nothing changed\n"
    assert "dry run" not in idle.stdout
    answer = json.loads(ipamctl("--socket", sock, "--json", "repair", "--apply").stdout)
    assert answer == {"applied": False, "actions": ["nothing to repair"]}
    daemon.wait_for_line(r'"msg": ?"api\.repair applied=False')
    assert [r["applied"] for r in _log_events(daemon, "api.repair")][:2] == [True, False]
    assert daemon.stop() == 0


ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"
EPOCH_FLOAT = re.compile(r"\b\d{9,}\.\d+\b")


def _plugin(daemon: EmbeddedDaemon, command: str, container: str) -> dict[str, object]:
    """`ipamd-cni` as the runtime runs it for `container` (its pod: shop/<container>); its answer."""
    conf = {
        "cniVersion": "1.1.0",
        "name": NETWORK,
        "ipam": {"type": "ipamd-cni", "socket": str(daemon.socket_path)},
    }
    env = clean_env(
        CNI_COMMAND=command,
        CNI_CONTAINERID=container,
        CNI_NETNS=f"/var/run/netns/{container}",
        CNI_IFNAME="eth0",
        CNI_PATH="/opt/cni/bin",
        CNI_ARGS=f"IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME={container};K8S_POD_UID=u1",
    )
    done = subprocess.run(
        [str(BIN / "ipamd-cni")],
        input=json.dumps(conf),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    answer = json.loads(done.stdout) if done.stdout.strip() else {}
    assert isinstance(answer, dict), done.stdout
    assert done.returncode == (1 if "code" in answer else 0), (done.stdout, done.stderr)
    return answer


def test_allocations_columns_come_from_every_row_and_times_read_as_iso_8601(
    short_dir: Path, started: list[EmbeddedDaemon]
) -> None:
    daemon = start_daemon(short_dir)
    started.append(daemon)
    daemon.wait_for("/readyz")
    sock = str(daemon.socket_path)
    daemon.add("c-no-pod")  # through the API without a pod: the first row has no POD
    assert "ips" in _plugin(daemon, "ADD", "web-0")

    shown = ipamctl("--socket", sock, "allocations")
    assert shown.returncode == 0, shown.stderr
    header, first, second = shown.stdout.splitlines()
    assert header.split()[-1] == "POD" and "CREATED_AT" in header.split(), header
    assert "c-no-pod" in first and "shop/" not in first
    assert "web-0" in second and second.split()[-1] == "shop/web-0", second
    assert re.search(ISO, first) and re.search(ISO, second)
    assert not EPOCH_FLOAT.search(shown.stdout), shown.stdout

    assert _plugin(daemon, "DEL", "web-0") == {}
    refused = _plugin(daemon, "ADD", "web-0")
    details = str(refused["details"])
    deleted = re.search(rf"was deleted at ({ISO}); ADD for it is refused until ({ISO})$", details)
    assert deleted is not None and "409 delete_intent" in details, refused
    assert not EPOCH_FLOAT.search(json.dumps(refused)), refused

    intents = ipamctl("--socket", sock, "intents")
    assert intents.returncode == 0, intents.stderr
    header, row = intents.stdout.splitlines()
    assert header.split() == ["CONTAINER_ID", "FIRST_DEL_AT", "EXPIRES_AT"], header
    assert row.split() == ["web-0", deleted.group(1), deleted.group(2)], (row, details)
    listed = json.loads(ipamctl("--socket", sock, "--json", "intents").stdout)["intents"]
    assert isinstance(listed[0]["first_del_at"], float), "the API's times stay numbers"
    assert daemon.stop() == 0
