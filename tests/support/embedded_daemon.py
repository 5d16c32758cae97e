"""`ipamd run --embedded` as a real process for integration tests: started with a clean environment
(no IPAMD_*, WARM_* or AWS_* of the developer's), its API called over its unix socket, its stderr read
line by line as it comes (for the printed hints), stopped with SIGTERM or killed with SIGKILL.

Everything waits by polling with a deadline; nothing sleeps to order events.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.vpc.processes import free_port, unix_call

BIN = Path(sys.executable).parent
NETWORK = "k8s-pod-network"


def clean_env(**extra: str) -> dict[str, str]:
    prefixes = ("IPAMD_", "WARM_", "AWS_", "MINIMUM_IP", "INTROSPECTION_", "DISABLE_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env.update(extra)
    return env


@dataclass
class EmbeddedDaemon:
    process: subprocess.Popen[str]
    socket_path: Path
    state_dir: Path
    lines: list[str] = field(default_factory=list)
    _seen: threading.Condition = field(default_factory=threading.Condition)
    _reader: threading.Thread | None = None

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            with self._seen:
                self.lines.append(line.rstrip("\n"))
                self._seen.notify_all()
        with self._seen:
            self._seen.notify_all()

    @property
    def plain_lines(self) -> list[str]:
        """stderr without the JSON log records: what ipamd printed for the person at the terminal."""
        with self._seen:
            return [line for line in self.lines if not line.startswith("{")]

    def wait_for_line(self, pattern: str, deadline_s: float = 60.0) -> re.Match[str]:
        """The first stderr line matching `pattern` (a regex), waiting for it until the deadline."""
        end = time.monotonic() + deadline_s
        regex = re.compile(pattern)
        with self._seen:
            while True:
                for line in self.lines:
                    if found := regex.search(line):
                        return found
                left = end - time.monotonic()
                if left <= 0 or (self.process.poll() is not None and not self._reading()):
                    raise AssertionError(f"no line matching {pattern!r}: {self.lines[-20:]}")
                self._seen.wait(min(left, 0.5))

    def _reading(self) -> bool:
        return self._reader is not None and self._reader.is_alive()

    def call(self, method: str, path: str, body: object = None) -> tuple[int, dict[str, Any]]:
        return unix_call(self.socket_path, method, path, body)

    def wait_for(self, path: str, status: int = 200, deadline_s: float = 60.0) -> None:
        """Poll until the daemon answers `path` with `status` (a separate process: there is no
        event to await)."""
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            assert self.process.poll() is None, "\n".join(self.lines[-30:])
            if self.socket_path.exists():
                try:
                    if self.call("GET", path)[0] == status:
                        return
                except OSError:
                    pass
            time.sleep(0.05)
        raise AssertionError(f"the daemon did not answer {path} with {status} in {deadline_s} s")

    def add(self, container_id: str, deadline_s: float = 30.0) -> str:
        """ADD, retried while the warm pool is still filling (503 no_address, as the runtime
        retries); returns the address."""
        key = {"container_id": container_id, "ifname": "eth0", "network": NETWORK}
        end = time.monotonic() + deadline_s
        while True:
            status, body = self.call("POST", "/v1/allocations", key)
            if status == 200:
                return str(body["ips"][0]["address"])
            assert status == 503 and body.get("code") == "no_address", (status, body)
            assert time.monotonic() < end, "the pool did not fill in time"
            time.sleep(0.05)

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.wait()

    def kill9(self) -> None:
        self.process.kill()
        self.wait()

    def wait(self, timeout_s: float = 30.0) -> int:
        code = self.process.wait(timeout=timeout_s)
        if self._reader is not None:
            self._reader.join(timeout=timeout_s)
        if self.process.stderr is not None:
            self.process.stderr.close()
        return code

    def ensure_gone(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.wait()


def start_daemon(
    tmp_path: Path, *, socket_name: str = "ipamd.sock", state: str = "state", **extra: str
) -> EmbeddedDaemon:
    """`ipamd run --embedded` on `tmp_path/state`, its API on `tmp_path/socket_name`, metrics and
    introspection on free ports, JSON logs; `extra` adds to (or overrides) the environment."""
    state_dir = tmp_path / state
    socket_path = tmp_path / socket_name
    settings = {
        "IPAMD_STATE_DIR": str(state_dir),
        "IPAMD_SOCKET": str(socket_path),
        "IPAMD_LOG_FORMAT": "json",
        "IPAMD_METRICS_ADDR": f"127.0.0.1:{free_port()}",
        "INTROSPECTION_BIND_ADDRESS": f"127.0.0.1:{free_port()}",
    }
    env = clean_env(**{**settings, **extra})
    return spawn(["run", "--embedded"], env, tmp_path, socket_path, state_dir)


def spawn(
    args: list[str], env: dict[str, str], cwd: Path, socket_path: Path, state_dir: Path
) -> EmbeddedDaemon:
    """`ipamd <args>` in `cwd` with exactly `env`, its stderr read as it comes."""
    process = subprocess.Popen(
        [str(BIN / "ipamd"), *args],
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    daemon = EmbeddedDaemon(process, socket_path, state_dir)
    daemon._reader = threading.Thread(target=daemon._read, name="ipamd-stderr", daemon=True)
    daemon._reader.start()
    return daemon
