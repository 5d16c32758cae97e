"""Start-up waits out EC2 errors and a full state disk with backoff, not ready meanwhile, instead of
ending the process (which would only meet the same on restart)."""

from __future__ import annotations

from pathlib import Path

from ipamd.clock import FakeClock
from ipamd.config import Config
from tests.support.fake_cloud import FakeEc2, fake_daemon


async def test_start_retries_a_failing_first_reconcile_with_backoff(tmp_path: Path) -> None:
    clock = FakeClock()
    ec2 = FakeEc2(clock)
    config = Config.from_env({"IPAMD_STATE_DIR": str(tmp_path)})
    daemon = await fake_daemon(config, ec2, clock)
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        assert not daemon.ready, "not ready while start-up waits"
        waits.append(seconds)

    daemon.sleep = sleep
    for _ in range(3):
        ec2.fail_next("describe_enis", after_acting=False)
    try:
        await daemon.start()
        assert daemon.ready
        assert len(waits) == 3, "one wait per failed attempt"
        assert all(0 <= w <= cap for w, cap in zip(waits, (1.0, 2.0, 4.0), strict=True)), (
            "full jitter under a ceiling that doubles"
        )
        assert ec2.calls["describe_enis"] >= 1
    finally:
        await daemon.close()
