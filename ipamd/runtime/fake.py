"""A fake of the runtime port (`ipamd.runtime.ports`), with state, for tests of everything above it.

`FakeRuntime` is the set of live pod sandboxes, and may be unreachable (`reachable = False`: every
call raises `RuntimeUnavailable`, as the CRI client does when the socket does not answer).
`NoSandboxAddresses` is repair's evidence source for daemons that never repair.
"""

from __future__ import annotations

from ipamd.clock import Clock
from ipamd.runtime.ports import RuntimeUnavailable, Sandbox


class FakeRuntime:
    """`ipamd.runtime.ports.RuntimeApi`: the live pod sandboxes, by ID."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self.sandboxes: dict[str, Sandbox] = {}
        self.reachable = True
        self.listings = 0

    def start(self, sandbox_id: str) -> None:
        self.sandboxes[sandbox_id] = Sandbox(sandbox_id, "ready", self._clock.now())

    def stop(self, sandbox_id: str) -> None:
        """The sandbox is gone (removed by the runtime, with or without a DEL to ipamd)."""
        self.sandboxes.pop(sandbox_id, None)

    async def list_sandboxes(self) -> tuple[Sandbox, ...]:
        if not self.reachable:
            raise RuntimeUnavailable("injected: the runtime's socket does not answer")
        self.listings += 1
        return tuple(self.sandboxes.values())

    async def version(self) -> str:
        if not self.reachable:
            raise RuntimeUnavailable("injected: the runtime's socket does not answer")
        return "fake-runtime 1.0"


class NoSandboxAddresses:
    """Repair's evidence source for daemons that never repair: asking is an unreachable runtime."""

    async def sandbox_addresses(self, sandbox_id: str) -> tuple[str, ...]:
        raise RuntimeUnavailable("this test's runtime records no sandbox addresses")
