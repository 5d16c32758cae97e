"""The S8 crash scenario's processes: the forkserver its children come from (with the worker modules
preloaded) and a gauge of the requests the embedded EC2 server is still serving.

What each scenario replays, and which tests prove it: docs/failure-scenarios.md."""

from __future__ import annotations

import multiprocessing.forkserver
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from cloud.embedded.world import EmbeddedEc2
from tests.crash.test_s08_crash import (
    CTX,
)

_OUR_FORKSERVER: list[int] = []
"""The PID of the forkserver this module started, once it has."""


def use_forkserver_with(modules: list[str]) -> None:
    """Make sure the forkserver preloaded `modules`. A forkserver preloads only when it starts, and
    the churn test may have started one that lacks the worker here (moto and EC2's service model: 2 s
    per child otherwise). So one not started here is stopped (no child of it is alive between tests)
    and started again, with the churn test's modules too; `_stop` is private, the hook CPython's own
    tests use for this."""
    server: Any = multiprocessing.forkserver._forkserver
    if _OUR_FORKSERVER and server._forkserver_pid == _OUR_FORKSERVER[0]:
        return
    server._stop()
    CTX.set_forkserver_preload(modules)
    server.ensure_running()
    _OUR_FORKSERVER[:] = [server._forkserver_pid]


# -- the EC2 server ------------------------------------------------------------------------------


class RequestGauge:
    """Wraps the embedded EC2 server's WSGI app and counts the requests inside it."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self._app = app
        self._lock = threading.Lock()
        self.active = 0
        self.served = 0
        self.last_done = time.monotonic()

    @classmethod
    def install(cls, host: EmbeddedEc2) -> RequestGauge:
        # The werkzeug server behind `EmbeddedEc2("server")`; its handler reads `.app` per request.
        server = getattr(getattr(host, "_server", None), "_server", None)
        assert server is not None and callable(getattr(server, "app", None)), (
            "EmbeddedEc2's loopback server changed shape: update RequestGauge.install"
        )
        gauge = cls(server.app)
        server.app = gauge
        return gauge

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        with self._lock:
            self.active += 1
        try:
            return list(self._app(environ, start_response))
        finally:
            with self._lock:
                self.active -= 1
                self.served += 1
                self.last_done = time.monotonic()

    def wait_quiet(self, quiet_s: float, timeout_s: float) -> bool:
        """Block until no request has been inside the app for `quiet_s`, counted from now at the
        earliest; False after `timeout_s`."""
        start = time.monotonic()
        while (now := time.monotonic()) < start + timeout_s:
            with self._lock:
                since = None if self.active else max(self.last_done, start)
            if since is not None and now - since >= quiet_s:
                return True
            time.sleep(quiet_s / 4)
        return False
