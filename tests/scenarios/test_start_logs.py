"""What a start logs: a first look at the node is adoption, at info; drift warns only when EC2 changed
something behind ipamd's back."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloud.fakes import FakeEc2
from ipamd.clock import FakeClock
from ipamd.config.settings import Config
from tests.support.daemons import fake_daemon


async def test_a_clean_start_is_adoption_logged_at_info_and_real_drift_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A first look at the node (nothing held yet) is not drift; a warning every start trained
    operators to ignore the one that matters."""
    clock = FakeClock()
    ec2 = FakeEc2(clock)
    config = Config.from_env({"IPAMD_STATE_DIR": str(tmp_path)})
    daemon = await fake_daemon(config, ec2, clock)
    try:
        with caplog.at_level("INFO", logger="ipamd.reconcile.ec2_drift"):
            await daemon.start()
            assert daemon.ready
            warned = [r for r in caplog.records if r.levelname == "WARNING"]
            assert warned == [], [r.getMessage() for r in warned]
            assert any("reconcile.adopted" in r.getMessage() for r in caplog.records)
            await daemon.pool.run_once()  # the warm pool's first units, on ipamd's own calls
            clock.advance(config.reconcile.grace_s + 1)
            await daemon.drift.run_once()
            warned = [r for r in caplog.records if r.levelname == "WARNING"]
            assert warned == [], "its own growth is no drift either"
            caplog.clear()
            held = next(iter(daemon.engine.state.units()))
            eni_id = daemon.engine.state.units()[held].eni_id
            await ec2.unassign_units(eni_id, "ip", [held])  # behind ipamd's back
            clock.advance(config.reconcile.grace_s + 1)
            report = await daemon.drift.run_once()
            assert report.dropped == [held]
            assert [r.getMessage().split()[0] for r in caplog.records] == ["reconcile.drift"]
            assert caplog.records[0].levelname == "WARNING"
    finally:
        await daemon.close()
