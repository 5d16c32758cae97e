"""Stopping ipamd at its edges, as a process: Ctrl-C (SIGINT) or SIGTERM while it still imports its
modules is one line and exit 0, never a traceback; SIGTERM while start-up waits out a failing EC2
is an orderly stop, `daemon.stopped` and exit 0, as a stop after ready is."""

from __future__ import annotations

import asyncio
import io
import json
import re
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from bench.vpc.processes import free_port
from chaos.daemon import Endpoints, daemon_environment
from chaos.proxy import ec2_error_body
from cloud.embedded.imds_sim import ImdsSimulator
from cloud.embedded.world import EmbeddedEc2
from tests.support.embedded_daemon import (
    EmbeddedDaemon,
    clean_env,
    spawn,
    start_daemon,
)

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def _signals_caught(pid: int) -> int:
    """The process's caught-signal mask (`SigCgt` of /proc/<pid>/status)."""
    status = Path(f"/proc/{pid}/status").read_text()
    found = re.search(r"^SigCgt:\s*([0-9a-f]+)$", status, re.MULTILINE)
    assert found is not None, status
    return int(found.group(1), 16)


def _wait_until_it_handles(daemon: EmbeddedDaemon, signum: int, deadline_s: float = 30.0) -> None:
    """Poll until the process catches `signum`: the first thing ipamd's console script does (the
    interpreter catches SIGINT itself, never SIGTERM). Before that instant the interpreter is still
    starting up and no program of it runs yet."""
    end = time.monotonic() + deadline_s
    while not _signals_caught(daemon.process.pid) & (1 << (signal.SIGTERM - 1)):
        assert daemon.process.poll() is None, daemon.lines
        assert time.monotonic() < end, "the process never caught SIGTERM"
        time.sleep(0.001)
    assert _signals_caught(daemon.process.pid) & (1 << (signum - 1))


def _log_events(daemon: EmbeddedDaemon) -> list[str]:
    return [str(json.loads(line)["msg"]) for line in daemon.lines if line.startswith("{")]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_ipamd_imports_is_one_line_and_exit_0(
    tmp_path: Path, started: list[EmbeddedDaemon], signum: signal.Signals
) -> None:
    daemon = start_daemon(tmp_path)
    started.append(daemon)
    _wait_until_it_handles(daemon, signum)
    daemon.process.send_signal(signum)  # the imports take about a second: it lands in them

    code = daemon.wait()

    assert code == 0, daemon.lines
    assert not any("Traceback" in line for line in daemon.lines), daemon.lines
    if daemon.lines != [f"ipamd: stopped by {signum.name} while starting"]:
        # Later than the imports (a slow machine): then it is a stop in order.
        assert "daemon.stopped reason=signal while=starting" in _log_events(daemon), daemon.lines


def _refusing(action: str) -> Callable[[WsgiApp], WsgiApp]:
    """moto's app, but every `action` answered with EC2's 500 InternalError."""
    error = ec2_error_body("InternalError", "An internal error has occurred.").encode()

    def wrap(app: WsgiApp) -> WsgiApp:
        def serve(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
            environ["wsgi.input"] = io.BytesIO(body)
            if f"Action={action}&".encode() in body + b"&":
                start_response("500 Internal Server Error", [("Content-Type", "text/xml")])
                return [error]
            return app(environ, start_response)

        return serve

    return wrap


@pytest.mark.parametrize(
    ("ec2", "retrying"),
    [
        ("closed-port", "daemon.instance_unread"),
        ("describe-network-interfaces-fails", "daemon.start_failed"),
    ],
)
async def test_sigterm_while_start_up_retries_ec2_is_an_orderly_stop(
    tmp_path: Path, started: list[EmbeddedDaemon], ec2: str, retrying: str
) -> None:
    """`ipamd run` on an EC2 of this process's (moto) and its IMDS simulator: EC2 unreachable (its
    endpoint a closed port), or answering everything but DescribeNetworkInterfaces, which the first
    reconcile of start-up needs; SIGTERM once the daemon logged that it will try again."""
    host = EmbeddedEc2("server", wrap_app=_refusing("DescribeNetworkInterfaces")).start()
    try:
        world = host.world("m5.large", region="us-west-2", seed=5)
        imds = ImdsSimulator(world)
        imds_url = await imds.start()
        try:
            assert world.endpoint_url is not None
            ec2_url = (
                f"http://127.0.0.1:{free_port()}" if ec2 == "closed-port" else world.endpoint_url
            )
            ends = Endpoints(
                ec2_url=ec2_url,
                imds_url=imds_url,
                region=world.region,
                cri_socket=tmp_path / "no-runtime.sock",
                state_dir=tmp_path / "state",
                socket_path=tmp_path / "ipamd.sock",
                metrics_port=free_port(),
            )
            env = daemon_environment(ends, clean_env())
            daemon = spawn(["run"], env, tmp_path, ends.socket_path, ends.state_dir)
            started.append(daemon)
            await asyncio.to_thread(daemon.wait_for_line, rf'"msg":"{re.escape(retrying)} ')
            assert daemon.process.poll() is None

            daemon.process.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(daemon.wait)
        finally:
            await imds.close()
    finally:
        host.close()

    assert code == 0, daemon.lines[-10:]
    assert not any("Traceback" in line for line in daemon.lines), daemon.lines
    events = _log_events(daemon)
    assert events[-1] == "daemon.stopped reason=signal while=starting", events[-5:]
    assert not any(e.startswith("daemon.ready") for e in events)
    assert not ends.socket_path.exists(), "the API's socket went with the stop"
