"""`FakeCriServer`: the CRI server of ipamd's embedded runtime, the benches and the chaos runner
(`ipamd.runtime.embedded_cri.CriServer`), with what only tests need.

It serves the sandboxes the test controls directly (`add`, `stop`, `remove`) or over gRPC, like
kubelet would, and misbehaves as the server can (`unavailable`, `delay_s`; `calls` counts the calls)
and in one more way: `hide(id, listings)` leaves a sandbox out of the next listings (a sandbox the
runtime does not list yet, S14).

Without a socket path it serves on one in a private temp directory with a short path (unix socket
paths are limited to 107 bytes, pytest's tmp_path can be longer), removed on `async with`'s exit.
`close()` and `start()` restart it on the same path with its sandboxes kept, like a runtime restart.

What each scenario replays, and which tests prove it: docs/failure-scenarios.md.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
import grpc.aio

from ipamd.runtime._generated import cri_v1_pb2_grpc as cri_grpc
from ipamd.runtime.embedded_cri import CriSandbox, CriServer

# The generated gRPC module carries no annotations (the messages do): a typed name for the stub.
runtime_stub: Callable[[grpc.aio.Channel], Any] = cri_grpc.RuntimeServiceStub
"""A CRI client stub on a channel, for tests that drive the server the way kubelet or crictl would."""


class FakeCriServer(CriServer):
    """A CRI runtime double serving a test-controlled list of sandboxes over a unix socket."""

    def __init__(
        self,
        socket_path: str | Path | None = None,
        *,
        runtime_name: str = "fakecri",
        runtime_version: str = "1.0.0",
    ) -> None:
        self._owned_dir: Path | None = None
        if socket_path is None:
            self._owned_dir = Path(tempfile.mkdtemp(prefix="ipamd-cri-"))
            socket_path = self._owned_dir / "cri.sock"
        super().__init__(
            Path(socket_path), runtime_name=runtime_name, runtime_version=runtime_version
        )
        self._hidden: dict[str, int] = {}

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await super().__aexit__(exc_type, exc, tb)
        if self._owned_dir is not None:
            shutil.rmtree(self._owned_dir, ignore_errors=True)

    def remove(self, sandbox_id: str) -> None:
        super().remove(sandbox_id)
        self._hidden.pop(sandbox_id, None)

    def hide(self, sandbox_id: str, listings: int = 1) -> None:
        """Leaves the sandbox out of the next `listings` answered ListPodSandbox calls."""
        if listings > 0:
            self._hidden[sandbox_id] = listings

    def listing(self) -> list[CriSandbox]:
        items = [s for s in self.sandboxes.values() if s.sandbox_id not in self._hidden]
        for sandbox_id, left in list(self._hidden.items()):
            if left <= 1:
                del self._hidden[sandbox_id]
            else:
                self._hidden[sandbox_id] = left - 1
        return items
