"""A pool EC2 refuses for good: custom networking whose ENIConfig names a subnet that does not exist.

Every ADD that finds no address says why, with EC2's code and words (not only "try again"); the
daemon stays ready but `/readyz`'s reasons, the pool's report (`ipamctl status`) and the gauge
`ipamd_pool_blocked` say it; and the pool does not ask EC2 again every few seconds: over 60 s of
simulated time, with pods asking all along, it calls at most 6 times. Once the subnet exists the
next round goes through and every sign clears.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cloud.fakes import FakeEc2
from datastore.records import AllocationKey
from ipamd.api import views
from ipamd.cli.ipamctl import render_status
from ipamd.clock import FakeClock
from ipamd.config.settings import Config
from ipamd.errors import NoAddressAvailable
from ipamd.model import PodRef
from ipamd.node.report import last_failure, pool_report
from tests.support.daemons import fake_daemon

MISSING = "subnet-0123456789abcdef0"


async def _no_sleep(_seconds: float) -> None:
    return None


@pytest.fixture
def world(tmp_path: Path) -> tuple[FakeClock, FakeEc2, Config]:
    clock = FakeClock(1_800_000_000.0)
    ec2 = FakeEc2(clock)
    eniconfigs = tmp_path / "eniconfigs.json"
    eniconfigs.write_text(json.dumps({ec2.zone: {"subnet": MISSING}}))
    config = Config.from_env(
        {
            "IPAMD_STATE_DIR": str(tmp_path / "state"),
            "AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG": "true",
            "IPAMD_ENI_CONFIG_FILE": str(eniconfigs),
        }
    )
    return clock, ec2, config


async def test_a_final_refusal_is_named_and_not_asked_again_every_few_seconds(
    world: tuple[FakeClock, FakeEc2, Config],
) -> None:
    clock, ec2, config = world
    daemon = await fake_daemon(config, ec2, clock, _no_sleep)
    try:
        await daemon.start()
        assert daemon.ready
        before = ec2.calls["create_eni"]
        errors: list[str] = []
        for second in range(60):
            try:
                await daemon.engine.assign(
                    AllocationKey("aws-cni", f"c{second}", "eth0"), PodRef("d", "p", "")
                )
            except NoAddressAvailable as err:
                errors.append(str(err))
            await daemon.pool.run_once()
            clock.advance(1.0)

        calls = ec2.calls["create_eni"] - before
        assert 1 <= calls <= 6, f"{calls} CreateNetworkInterface calls in 60 s"
        assert errors and all("InvalidSubnetID.NotFound" in e and MISSING in e for e in errors[1:])
        (reason,) = daemon.degraded()
        assert "InvalidSubnetID.NotFound" in reason and MISSING in reason
        failure = last_failure(daemon)
        assert failure is not None and failure["blocking"] is True
        assert MISSING in str(failure["error"]) and str(failure["at"]).endswith("Z")

        made = ec2.subnets.pop(ec2.add_subnet("10.0.64.0/20"))  # the operator creates it
        made.subnet_id = MISSING
        ec2.subnets[MISSING] = made
        clock.advance(120.0)
        await daemon.pool.run_once()
        assert daemon.degraded() == ()
        assert daemon.pool.blocked_by() == ""
    finally:
        await daemon.close()


async def test_a_daemon_retrying_its_start_says_why_it_is_not_ready(
    world: tuple[FakeClock, FakeEc2, Config],
) -> None:
    """What `ipamctl status` prints (the API's `GET /v1/pool`, rendered by ipamctl) while start-up
    retries: not ready, the attempt's error and when the next one is."""
    clock, ec2, config = world
    shown: list[str] = []

    async def sleep(_seconds: float) -> None:
        body = views.pool(daemon.engine.snapshot())
        body.update(pool_report(daemon))
        shown.append(render_status(body))

    daemon = await fake_daemon(config, ec2, clock, _no_sleep)
    daemon.sleep = sleep
    ec2.fail_next("describe_enis", after_acting=False)
    try:
        await daemon.start()
        first = shown[0].splitlines()[0]
        assert first.startswith("ipamd: NOT READY: start-up attempt 1 failed at "), first
        assert "describe_enis: ReadTimeout" in first and "next attempt at " in first
        assert daemon.ready and daemon.not_ready == ""
    finally:
        await daemon.close()
