"""The node's world for the image's smoke test, as a process of its own.

    python -m tests.image.cloud HOST_ROOT READY_FILE

It serves, until SIGTERM or SIGINT: moto's EC2 (`EmbeddedEc2("server")`, one VPC, subnet and
instance) and the IMDS simulator for that instance, both on 127.0.0.1 of the network namespace it is
started in (the test runs it with `ip netns exec`, in the namespace the ipamd container joins as its
host network); and the container runtime double (`FakeCriServer`) on the node's containerd socket,
`HOST_ROOT/run/containerd/containerd.sock`, which the DaemonSet mounts into the ipamd container. Once
all three answer it writes READY_FILE (JSON: `ec2_url`, `imds_url`, `region`, `instance_id`,
`subnet_cidr`), by rename, so a reader sees all of it or nothing.

This is how the chaos runner gives its daemon a world (chaos/node.py), here outside the test's own
process: the test process stays in the machine's network namespace, and this one needs none of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import sys
from pathlib import Path

from cloud.embedded.imds_sim import ImdsSimulator
from cloud.embedded.world import EmbeddedEc2
from tests.support.cri_server import FakeCriServer

INSTANCE_TYPE = "m5.large"
REGION = "us-west-2"
SEED = 7


async def serve(host_root: Path, ready_file: Path) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    host = EmbeddedEc2("server").start()
    try:
        world = host.world(INSTANCE_TYPE, region=REGION, seed=SEED)
        imds = ImdsSimulator(world, rng=random.Random(SEED))
        imds_url = await imds.start()
        socket_dir = host_root / "run" / "containerd"
        socket_dir.mkdir(parents=True, exist_ok=True)
        cri = FakeCriServer(socket_dir / "containerd.sock")
        await cri.start()
        try:
            answer = {
                "ec2_url": world.endpoint_url,
                "imds_url": imds_url,
                "region": world.region,
                "instance_id": world.instance_id,
                "subnet_cidr": world.subnet_cidr,
            }
            partial = ready_file.with_suffix(".tmp")
            partial.write_text(json.dumps(answer))
            partial.rename(ready_file)
            await stop.wait()
        finally:
            await cri.close()
            await imds.close()
    finally:
        host.close()


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m tests.image.cloud HOST_ROOT READY_FILE", file=sys.stderr)
        return 2
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(Path(argv[1]), Path(argv[2])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
