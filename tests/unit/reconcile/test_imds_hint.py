"""The IMDS hint costs EC2 nothing while IMDS merely lags: a disagreement about units ipamd changed
within the grace window (IPAMD_RECONCILE_GRACE) triggers no drift check, so no
DescribeNetworkInterfaces call; the same disagreement once the window is over does."""

from __future__ import annotations

from pathlib import Path

from ipamd.clock import FakeClock
from ipamd.config import Config
from ipamd.daemon import Daemon
from tests.support.fake_cloud import FakeEc2, FakeImds, fake_daemon


async def _hint_tick(daemon: Daemon) -> list[str]:
    """One run of the hint job, and the drift check it asks for, as `Daemon.drift_on_demand` runs it."""
    found = await daemon.hint.run_once()
    if daemon.drift_wanted.is_set():
        daemon.drift_wanted.clear()
        await daemon.drift.run_once()
    return found


async def test_an_imds_hint_inside_the_grace_window_costs_no_describe(tmp_path: Path) -> None:
    clock = FakeClock()
    ec2 = FakeEc2(clock)
    env = {"IPAMD_STATE_DIR": str(tmp_path), "WARM_IP_TARGET": "2", "WARM_ENI_TARGET": "0"}
    config = Config.from_env(env)
    daemon = await fake_daemon(config, ec2, clock)
    imds = daemon.imds
    assert isinstance(imds, FakeImds)
    try:
        await daemon.start()
        grown = ec2.calls["assign_units"]
        await daemon.pool.run_once()
        assert ec2.calls["assign_units"] == grown + 1, "the pool grew"
        new = {c for units in ec2.truth().values() for c in units}
        assert len(new) == 2
        imds.hidden |= new  # IMDS lags behind the assign, as it does
        describes = ec2.calls["describe_enis"]

        clock.advance(config.reconcile_grace_s - 1)
        assert await _hint_tick(daemon) == [], "inside the window IMDS's lag is no disagreement"
        assert ec2.calls["describe_enis"] == describes, "and costs no DescribeNetworkInterfaces"
        assert daemon.hint.triggers == 0

        clock.advance(1)
        assert await _hint_tick(daemon), "the window over, the same lag is a disagreement"
        assert daemon.hint.triggers == 1
        assert ec2.calls["describe_enis"] == describes + 1, "which EC2's listing settles"
    finally:
        await daemon.close()
