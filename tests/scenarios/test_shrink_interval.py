"""IPAMD_SHRINK_INTERVAL (VPC CNI's decreaseIPPoolInterval): the pool gives addresses back to EC2 no
more often than once per interval, however soon after a shrink the next excess appears; growing is
never held back by it."""

from __future__ import annotations

from pathlib import Path

from cloud.fakes import FakeEc2
from ipamd.clock import FakeClock
from ipamd.config.settings import Config
from ipamd.node.daemon import Daemon
from tests.support.daemons import fake_daemon
from tests.support.node import key

INTERVAL_S = 120.0


async def _daemon(tmp_path: Path, ec2: FakeEc2, clock: FakeClock) -> Daemon:
    env = {
        "IPAMD_STATE_DIR": str(tmp_path),
        "WARM_IP_TARGET": "2",
        "WARM_ENI_TARGET": "0",
        "IPAMD_SHRINK_INTERVAL": str(int(INTERVAL_S)),
        "IPAMD_RELEASE_DELAY": "0",  # only the interval holds a shrink back
    }
    daemon = await fake_daemon(Config.from_env(env), ec2, clock)
    await daemon.start()
    return daemon


async def _pods(daemon: Daemon, names: list[str]) -> None:
    for name in names:
        await daemon.pool.run_once()
        await daemon.engine.assign(key(name))
    await daemon.pool.run_once()


async def _stop(daemon: Daemon, names: list[str], clock: FakeClock) -> None:
    for name in names:
        await daemon.engine.release(key(name))
    clock.advance(daemon.engine.settings.cooldown_s + 1)  # cooled: free, and so excess


async def test_shrinks_are_at_least_the_shrink_interval_apart(tmp_path: Path) -> None:
    clock = FakeClock()
    ec2 = FakeEc2(clock)
    daemon = await _daemon(tmp_path, ec2, clock)
    try:
        await _pods(daemon, [f"p{i}" for i in range(6)])
        await _stop(daemon, ["p0", "p1"], clock)
        before = ec2.calls["unassign_units"]
        await daemon.pool.run_once()
        assert ec2.calls["unassign_units"] == before + 1, "the first excess goes back at once"
        first_shrink = clock.now()

        await _stop(daemon, ["p2", "p3"], clock)
        assert daemon.pool.plan().release_units, "a new excess, 31 s after the first shrink"
        await daemon.pool.run_once()
        assert ec2.calls["unassign_units"] == before + 1, "not within the shrink interval"

        await daemon.engine.assign(key("burst-0"))
        await daemon.engine.assign(key("burst-1"))
        await daemon.engine.assign(key("burst-2"))
        assert daemon.pool.plan().assign, "the burst leaves the pool short"
        grown = ec2.calls["assign_units"]
        await daemon.pool.run_once()
        assert ec2.calls["assign_units"] == grown + 1, "growth is never held back by it"

        for name in ("burst-0", "burst-1", "burst-2"):
            await daemon.engine.release(key(name))
        clock.advance(first_shrink + INTERVAL_S - 1 - clock.now())
        assert daemon.pool.plan().release_units
        await daemon.pool.run_once()
        assert ec2.calls["unassign_units"] == before + 1, "one second short of the interval"
        clock.advance(1)
        await daemon.pool.run_once()
        assert ec2.calls["unassign_units"] == before + 2, "the interval over: the excess goes back"
        assert not daemon.pool.plan().release_units
    finally:
        await daemon.close()
