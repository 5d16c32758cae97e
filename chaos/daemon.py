"""`DaemonProcess`: `ipamd run` as a real child process, and the chaos runner's view of it.

It owns the daemon's environment (where EC2, IMDS, the runtime, the socket and the state are; the
intervals shortened so that the daemon recovers within seconds), starting it, killing it with SIGKILL,
stopping it with SIGTERM, noticing when it exited on its own (a supervisor restarts it, as kubelet
would, and the exit is reported), and reading its local HTTP API over the unix socket.

It must not reach into the daemon: everything it learns comes from the API, the exit status and the
log file the daemon writes its stderr to.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

import aiohttp

from ipamd.wire import PATH_READYZ

BIN: Final = Path(sys.executable).parent
"""The console scripts (`ipamd`, `ipamd-cni`) next to this interpreter."""

TUNING: Final[Mapping[str, str]] = {
    # A small warm pool makes churn grow and shrink the pool, so EC2 faults meet real calls.
    "WARM_IP_TARGET": "3",
    "IP_COOLDOWN_PERIOD": "1",
    "IPAMD_POOL_INTERVAL": "0.5",
    "IPAMD_SHRINK_INTERVAL": "1",
    "IPAMD_EC2_RECONCILE_INTERVAL": "2",
    "IPAMD_IMDS_HINT_INTERVAL": "1",
    "IPAMD_RECONCILE_GRACE": "5",
    "IPAMD_LEAK_GC_INTERVAL": "1",
    "IPAMD_LEAK_GRACE": "3",
    "IPAMD_MIN_ENI_LIFETIME": "5",
    "IPAMD_RELEASE_DELAY": "5",
    "IPAMD_EC2_CALL_TIMEOUT": "2",
    "IPAMD_DELETE_INTENT_TTL": "600",
    "IPAMD_LOG_FORMAT": "json",
    "AWS_VPC_K8S_CNI_LOGLEVEL": "info",
    # The runner keeps the daemon's standard error; no file in the machine's /var/log.
    "AWS_VPC_K8S_CNI_LOG_FILE": "stdout",
    # The daemon runs in the machine's own network namespace: it must not touch its routing.
    "IPAMD_HOST_NETWORK": "off",
}
"""Settings of the daemon under chaos: intervals in seconds, not minutes (defaults in config.py)."""

_CLEARED_PREFIXES: Final = ("IPAMD_", "WARM_", "AWS_", "MINIMUM_IP", "ENABLE_PREFIX", "MAX_ENI")


@dataclass(frozen=True, slots=True)
class Endpoints:
    """Where the daemon finds the world the runner owns."""

    ec2_url: str
    imds_url: str
    region: str
    cri_socket: Path
    state_dir: Path
    socket_path: Path
    metrics_port: int


def daemon_environment(ends: Endpoints, base: Mapping[str, str]) -> dict[str, str]:
    """`base` without any setting of its own, plus the endpoints, dummy credentials and `TUNING`."""
    env = {k: v for k, v in base.items() if not k.startswith(_CLEARED_PREFIXES)}
    env.update(TUNING)
    env.update(
        AWS_EC2_ENDPOINT=ends.ec2_url,
        AWS_EC2_METADATA_SERVICE_ENDPOINT=ends.imds_url,
        AWS_REGION=ends.region,
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        AWS_EC2_METADATA_DISABLED="true",  # botocore's own credential lookup never reaches IMDS
        IPAMD_SOCKET=str(ends.socket_path),
        IPAMD_STATE_DIR=str(ends.state_dir),
        IPAMD_CRI_SOCKET=str(ends.cri_socket),
        IPAMD_METRICS_ADDR=f"127.0.0.1:{ends.metrics_port}",
        # aws-node's places, beside the state directory: never the machine's /var/run/aws-node.
        IPAMD_CONFIG_SERVER_SOCKET=str(ends.state_dir.parent / "aws-node" / "ipamd.sock"),
        IPAMD_NETWORK_POLICY_AGENT_SOCKET=str(ends.state_dir.parent / "aws-node" / "npa.sock"),
        AWS_VPC_K8S_CNI_BACKING_STORE=str(ends.state_dir.parent / "aws-node" / "ipam.json"),
        # The daemon runs in the machine's own namespace: VPC CNI's fixed introspection port may be
        # taken there (by another daemon, another run); this runner does not read it.
        DISABLE_INTROSPECTION="true",
    )
    return env


@dataclass
class DaemonProcess:
    """One daemon at a time, started again after a kill or an exit of its own."""

    ends: Endpoints
    env: dict[str, str]
    log_path: Path
    process: asyncio.subprocess.Process | None = None
    starts: int = 0
    kills: int = 0
    exits: list[int] = field(default_factory=list)
    """Exit statuses of the daemon stopping on its own (not killed or stopped by the runner)."""
    exit_logs: list[str] = field(default_factory=list)
    """The last lines the daemon logged before each of those exits."""
    _log: IO[bytes] | None = None
    _session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        if self._log is None:
            self._log = self.log_path.open("ab")
        self.process = await asyncio.create_subprocess_exec(
            str(BIN / "ipamd"),
            "run",
            env=self.env,
            cwd=str(self.log_path.parent),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=self._log,
        )
        self.starts += 1

    async def kill(self) -> None:
        """SIGKILL and reap: no clean-up of any kind happens in the daemon. `start` runs it again."""
        process, self.process = self.process, None  # not an exit of its own: no restart
        if process is not None and process.returncode is None:
            process.send_signal(signal.SIGKILL)
            await process.wait()
            self.kills += 1

    async def stop(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM, then SIGKILL past `timeout_s`; the exit status."""
        process, self.process = self.process, None
        if process is None:
            return None
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), timeout_s)
            except TimeoutError:
                process.kill()
                await process.wait()
        return process.returncode

    async def close(self) -> None:
        await self.stop()
        session, self._session = self._session, None
        if session is not None:
            await session.close()
        log, self._log = self._log, None
        if log is not None:
            log.close()

    async def supervise(self) -> int | None:
        """Restart the daemon if it exited on its own; returns that exit status (None if running)."""
        if self.process is None or self.process.returncode is None:
            return None
        code = self.process.returncode
        self.exits.append(code)
        self.exit_logs.append(self.log_tail(12))
        await self.start()
        return code

    # -- the local API ----------------------------------------------------------------------------

    async def api(self, method: str, path: str) -> tuple[int, Any]:
        """One request on the daemon's socket: (status, JSON body). Raises OSError, aiohttp's
        ClientError or TimeoutError when the daemon does not answer."""
        if self._session is None:
            connector = aiohttp.UnixConnector(path=str(self.ends.socket_path), force_close=True)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=10)
            )
        async with self._session.request(method, f"http://ipamd{path}") as response:
            body = await response.json(content_type=None)
            return response.status, body

    async def ready(self) -> bool:
        try:
            status, _ = await self.api("GET", PATH_READYZ)
        except (OSError, aiohttp.ClientError, TimeoutError, ValueError):
            return False
        return status == 200

    async def wait_ready(self, deadline_s: float) -> float | None:
        """Seconds until `/readyz` answered 200 (restarting the daemon if it exits meanwhile), or None
        if it did not within `deadline_s`."""
        start = time.monotonic()
        while time.monotonic() - start < deadline_s:
            await self.supervise()
            if await self.ready():
                return time.monotonic() - start
            await asyncio.sleep(0.05)
        return None

    def log_tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""
