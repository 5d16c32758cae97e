"""One of `bench.api`'s client processes: ADD+DEL pairs over the daemon's socket, as pods' plugins
make them, timed here and reported on stdout.

`python -m bench.api_client SOCKET PREFIX PAIRS`: prints `ready`, waits for `go` on stdin (so the
interpreter's start and imports are not timed, and all clients start together), then makes PAIRS
pairs with container IDs `PREFIX-n` through `ipamd.cni.client.call`, the plugin's own client (one
HTTP/1.1 exchange on a fresh connection per request), and prints one JSON line: per pair, its start,
the ADD's answer and the DEL's answer, in nanoseconds of CLOCK_MONOTONIC (one clock for every process
on the machine, so the bench can line the clients up against each other and the daemon). It exits
when its stdin ends, which the bench closes once every client has reported.

It must not import asyncio, aiohttp or the engine: a client process costs what a plugin costs.
"""

from __future__ import annotations

import json
import sys
import time

from ipamd.cni.client import call
from ipamd.wire import PATH_ALLOCATIONS

NETWORK = "k8s-pod-network"


def pairs(socket_path: str, prefix: str, count: int) -> list[tuple[int, int, int]]:
    """Per pair: (start, ADD answered, DEL answered), monotonic nanoseconds."""
    marks: list[tuple[int, int, int]] = []
    for n in range(count):
        container_id = f"{prefix}-{n}"
        body: dict[str, object] = {
            "container_id": container_id,
            "ifname": "eth0",
            "network": NETWORK,
        }
        started = time.monotonic_ns()
        call(socket_path, "POST", PATH_ALLOCATIONS, body)
        added = time.monotonic_ns()
        call(socket_path, "DELETE", f"{PATH_ALLOCATIONS}/{container_id}/eth0?network={NETWORK}")
        marks.append((started, added, time.monotonic_ns()))
    return marks


def main(argv: list[str]) -> int:
    socket_path, prefix, count = argv[0], argv[1], int(argv[2])
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return 1  # the bench gave up before starting: nothing to do
    print(json.dumps(pairs(socket_path, prefix, count)), flush=True)
    # Not gone until told (end of stdin): an interpreter's exit takes CPU that the clients still
    # making pairs, and the daemon serving them, would otherwise lose at the end of the run.
    sys.stdin.read()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
