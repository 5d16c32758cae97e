"""A daemon on the in-memory fakes (`cloud.fakes`, `ipamd.runtime.fake`), built by `build_daemon`
itself, for tests of start-up and of the daemon's parts together."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from cloud.fakes import FakeEc2, FakeImds
from ipamd.awsnode.checkpoint import CheckpointFile
from ipamd.clock import FakeClock
from ipamd.config.settings import Config
from ipamd.node.daemon import Daemon, build_daemon
from ipamd.runtime.fake import FakeRuntime, NoSandboxAddresses


async def fake_daemon(
    config: Config,
    ec2: FakeEc2,
    clock: FakeClock,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    *,
    runtime: FakeRuntime | None = None,
    checkpoint: CheckpointFile | None = None,
) -> Daemon:
    """The daemon's parts, built by `build_daemon` itself, on the in-memory EC2 and IMDS (`sleep`:
    how its start-up waits; `checkpoint`: aws-node's checkpoint file, to take over and keep)."""
    return await build_daemon(
        config,
        ec2=ec2,
        imds=FakeImds(ec2),
        runtime=runtime or FakeRuntime(clock),
        addresses=NoSandboxAddresses(),
        clock=clock,
        checkpoint=checkpoint,
        sleep=sleep,
    )
