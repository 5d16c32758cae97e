"""The fault kinds and their seeded schedule.

Each fault is injected into the world the runner owns (never into the daemon's code), and knows when it
took effect — the daemon met it at least once: a request answered with the fault, a process killed,
a disk full. `occurrence` (the how-many-th of its kind) varies the fault between occurrences so a run
covers its variants: IMDS staleness by time lag with addresses kept or hidden, or frozen wholesale;
IMDS errors as 500 or 503 with or without its tokens revoked; a runtime that refuses every call
(UNAVAILABLE) or that hangs past the daemon's deadline.

Kinds: `kill` (SIGKILL, restarted when cleared), `imds_stale`, `imds_errors`, `ec2_throttle`,
`ec2_5xx`, `ec2_timeout`, `disk_full` (needs the tmpfs state directory), `runtime_down`.
"""

from __future__ import annotations

import errno
import os
import random
from typing import Final, Protocol

from chaos.node import ChaosNode
from chaos.proxy import Mode

RUNTIME_HANG_S: Final = 7.0
"""Past the daemon's 5 s deadline on a CRI call."""


class Fault(Protocol):
    kind: str

    def unavailable(self, node: ChaosNode) -> str | None:
        """Why this kind cannot be injected here (then it is skipped, never counted survived)."""
        ...

    async def inject(self, node: ChaosNode, occurrence: int) -> None: ...

    def took_effect(self, node: ChaosNode) -> bool: ...

    async def clear(self, node: ChaosNode) -> None: ...


class _Always:
    def unavailable(self, node: ChaosNode) -> str | None:
        return None


class Kill(_Always):
    kind = "kill"

    async def inject(self, node: ChaosNode, occurrence: int) -> None:
        await node.daemon.kill()

    def took_effect(self, node: ChaosNode) -> bool:
        return True

    async def clear(self, node: ChaosNode) -> None:
        await node.daemon.start()


class ImdsStale(_Always):
    """IMDS trails EC2 both ways: new addresses shown late or hidden, released ones kept."""

    kind = "imds_stale"

    def __init__(self) -> None:
        self._served = 0

    async def inject(self, node: ChaosNode, occurrence: int) -> None:
        self._served = node.imds.count("GET", 200)
        lag = node.imds.lag
        if occurrence % 2:
            lag.freeze()
            return
        lag.add_lag_s = lag.remove_lag_s = 30.0
        secondaries = sorted(a for eni in node.imds.view() for a in eni.local_ipv4s[1:])
        rng = random.Random(occurrence)
        rng.shuffle(secondaries)
        half = len(secondaries) // 2
        lag.keep(*secondaries[:half])
        lag.hide(*secondaries[half:])

    def took_effect(self, node: ChaosNode) -> bool:
        return node.imds.count("GET", 200) > self._served

    async def clear(self, node: ChaosNode) -> None:
        node.imds.lag.clear()


class ImdsErrors(_Always):
    kind = "imds_errors"

    def __init__(self) -> None:
        self._status = 503
        self._failed = 0

    async def inject(self, node: ChaosNode, occurrence: int) -> None:
        self._status = (503, 500)[occurrence % 2]
        self._failed = node.imds.count(status=self._status)
        if occurrence % 3 == 2:
            node.imds.revoke_tokens()  # as an IMDS restart: 401 once it answers again
        node.imds.faults.fail_fraction(1.0, self._status)

    def took_effect(self, node: ChaosNode) -> bool:
        return node.imds.count(status=self._status) > self._failed

    async def clear(self, node: ChaosNode) -> None:
        node.imds.faults.clear()


class Ec2Fault(_Always):
    def __init__(self, kind: str, mode: Mode) -> None:
        self.kind = kind
        self._mode: Mode = mode
        self._before = 0

    async def inject(self, node: ChaosNode, occurrence: int) -> None:
        self._before = node.proxy.faulted[self._mode]
        node.proxy.mode = self._mode

    def took_effect(self, node: ChaosNode) -> bool:
        return node.proxy.faulted[self._mode] > self._before

    async def clear(self, node: ChaosNode) -> None:
        node.proxy.mode = "pass"


class DiskFull:
    """A ballast file fills the state directory's tmpfs to the last byte; removed when cleared."""

    kind = "disk_full"

    def __init__(self) -> None:
        self._full = False

    def unavailable(self, node: ChaosNode) -> str | None:
        return None if node.disk.mounted else node.disk.why_not or "no tmpfs"

    async def inject(self, node: ChaosNode, occurrence: int) -> None:
        self._full = fill(node.disk.ballast)

    def took_effect(self, node: ChaosNode) -> bool:
        return self._full

    async def clear(self, node: ChaosNode) -> None:
        node.disk.ballast.unlink(missing_ok=True)
        self._full = False


def fill(path: os.PathLike[str]) -> bool:
    """Write `path` until its file system has no byte left; True when ENOSPC was reached."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for chunk in (1 << 20, 1 << 12, 1):
            block = b"\0" * chunk
            try:
                while True:
                    os.write(fd, block)
            except OSError as err:
                if err.errno != errno.ENOSPC:
                    raise
        return True
    finally:
        os.close(fd)


class RuntimeDown(_Always):
    """The runtime refuses every call, or hangs past the daemon's deadline."""

    kind = "runtime_down"

    def __init__(self) -> None:
        self._calls = 0

    async def inject(self, node: ChaosNode, occurrence: int) -> None:
        self._calls = node.cri.calls.total()
        if occurrence % 2:
            node.cri.delay_s = RUNTIME_HANG_S
        else:
            node.cri.unavailable = True

    def took_effect(self, node: ChaosNode) -> bool:
        return node.cri.calls.total() > self._calls

    async def clear(self, node: ChaosNode) -> None:
        node.cri.unavailable = False
        node.cri.delay_s = 0.0


def all_faults() -> list[Fault]:
    return [
        Kill(),
        ImdsStale(),
        ImdsErrors(),
        Ec2Fault("ec2_throttle", "throttle"),
        Ec2Fault("ec2_5xx", "internal"),
        Ec2Fault("ec2_timeout", "timeout"),
        DiskFull(),
        RuntimeDown(),
    ]


KINDS: Final = tuple(f.kind for f in all_faults())


def schedule(count: int, seed: int, kinds: tuple[str, ...] = KINDS) -> list[str]:
    """`count` fault kinds: rounds through every kind, each round in a seeded order."""
    rng = random.Random(seed)
    order: list[str] = []
    while len(order) < count:
        round_ = list(kinds)
        rng.shuffle(round_)
        order.extend(round_)
    return order[:count]
