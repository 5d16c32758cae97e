"""What scarcity mode reads of the subnets' free addresses, wired as the daemon wires it: with subnet
discovery, the subnet catalogue's own view (no call of its own); without it, a `SubnetFree` reading
built by `open_parts` from the EC2 catalog (unless the mode is off), read once at start and then by
its job. The pool manager's mode follows the number on its next round, without an EC2 call."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloud.errors import ServiceUnavailable
from cloud.fakes import FakeEc2, FakeImds
from ipamd.clock import FakeClock
from ipamd.config.settings import Config
from ipamd.node.engine_parts import Parts, describe_node, open_parts, pool_params
from ipamd.node.report import pool_report
from ipamd.reconcile.subnet_free import SubnetFree
from ipamd.runtime.fake import FakeRuntime
from tests.support.daemons import fake_daemon
from tests.support.node import key

NO_DISCOVERY = {"ENABLE_SUBNET_DISCOVERY": "false"}


def _scarce(parts: Parts) -> bool:
    return parts.pool.report().scarce


def _config(tmp_path: Path, env: dict[str, str] | None = None) -> Config:
    return Config.from_env({"IPAMD_STATE_DIR": str(tmp_path), **(env or {})})


async def _open(config: Config, ec2: FakeEc2, clock: FakeClock, catalog: bool = True) -> Parts:
    facts = await describe_node(ec2, ec2.instance_id)
    return await open_parts(
        config,
        facts,
        ec2=ec2,
        imds=FakeImds(ec2),
        runtime=FakeRuntime(clock),
        clock=clock,
        catalog=ec2 if catalog else None,
    )


async def test_with_discovery_the_catalogues_view_is_what_scarcity_reads(tmp_path: Path) -> None:
    clock = FakeClock()
    # A /26: 59 usable addresses, the instance's own among them, below the threshold of 64.
    ec2 = FakeEc2(clock, subnet_cidr="10.0.0.0/26")
    config = _config(tmp_path)
    assert pool_params(config).subnets.scarcity_threshold == 64
    parts = await _open(config, ec2, clock)
    try:
        assert parts.subnet_free is None, "no reading of its own: the catalogue reads the subnets"
        before = (await ec2.subnet(ec2.subnet_id)).available_ips
        await parts.pool.run_once()  # the catalogue's first read, then the plan
        free = parts.pool.subnets.free_addresses()
        assert free == before < 64
        assert _scarce(parts) and parts.pool.report().subnet_free == free
        assert len(parts.engine.state.units()) == 1, "scarce from the first round: one address"
        await parts.engine.assign(key("a"))
        await parts.pool.run_once()
        assert (await parts.pool.run_once()).is_empty()
        assert len(parts.engine.state.units()) == 2, "the pod's address and one free, no warm ENI"
    finally:
        await parts.engine.close()


async def test_without_discovery_a_reading_of_its_own_is_taken_and_followed(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    ec2 = FakeEc2(clock, subnet_cidr="10.0.0.0/26")
    parts = await _open(_config(tmp_path, NO_DISCOVERY), ec2, clock)
    try:
        reading = parts.subnet_free
        assert reading is not None and reading.free() is None
        await parts.pool.run_once()
        assert not _scarce(parts), "never read: the subnet is not taken for scarce"
        assert len(parts.engine.state.units()) == 9, "a warm ENI's worth"
        free = await reading.run_once()
        assert free == (await ec2.subnet(ec2.subnet_id)).available_ips < 64
        await parts.engine.assign(key("a"))
        await parts.pool.run_once()
        assert _scarce(parts) and parts.pool.report().subnet_free == free
        assert (await parts.pool.run_once()).is_empty()
        assert len(parts.engine.state.units()) == 2
    finally:
        await parts.engine.close()


@pytest.mark.parametrize(
    ("env", "catalog"),
    [({**NO_DISCOVERY, "IPAMD_SUBNET_SCARCITY_THRESHOLD": "0"}, True), (NO_DISCOVERY, False)],
)
async def test_no_reading_when_the_mode_is_off_or_there_is_no_catalog(
    tmp_path: Path, env: dict[str, str], catalog: bool
) -> None:
    clock = FakeClock()
    ec2 = FakeEc2(clock, subnet_cidr="10.0.0.0/26")
    parts = await _open(_config(tmp_path, env), ec2, clock, catalog)
    try:
        assert parts.subnet_free is None
        await parts.pool.run_once()
        assert not _scarce(parts) and parts.pool.report().subnet_free is None
    finally:
        await parts.engine.close()


async def test_a_failed_read_keeps_the_last_number() -> None:
    answers: list[int | Exception] = [40, ServiceUnavailable("DescribeSubnets", "503", "down"), 90]

    async def read() -> int:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    clock = FakeClock()
    reading = SubnetFree(read, clock)
    assert await reading.run_once() == 40
    first = clock.now()
    clock.advance(300)
    with pytest.raises(ServiceUnavailable):
        await reading.run_once()
    assert reading.free() == 40 and reading.read_at == first
    assert await reading.run_once() == 90 and reading.read_at == first + 300


async def test_without_discovery_the_daemon_reads_at_start_and_schedules_the_job(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    ec2 = FakeEc2(clock)
    daemon = await fake_daemon(_config(tmp_path, NO_DISCOVERY), ec2, clock)
    try:
        await daemon.start()
        assert daemon.ready
        reading = daemon.parts.subnet_free
        assert reading is not None
        assert reading.free() == (await ec2.subnet(ec2.subnet_id)).available_ips
        await daemon.pool.run_once()
        subnets = {"free_addresses": reading.free(), "scarce": False, "prefix_fallback": False}
        assert pool_report(daemon)["subnets"] == subnets, "what GET /v1/pool reports"
        daemon.schedule()
        (job,) = (j for j in daemon.jobs.scheduled() if j.name == "subnet_free")
        assert job.interval_s == 1800
    finally:
        await daemon.close()


async def test_with_discovery_the_daemon_schedules_no_read_of_its_own(tmp_path: Path) -> None:
    clock = FakeClock()
    daemon = await fake_daemon(_config(tmp_path), FakeEc2(clock), clock)
    try:
        await daemon.start()
        await daemon.pool.run_once()
        assert daemon.parts.subnet_free is None
        free = daemon.pool.subnets.free_addresses()
        assert free is not None and pool_report(daemon)["subnets"]["free_addresses"] == free  # type: ignore[index]
        daemon.schedule()
        assert "subnet_free" not in {job.name for job in daemon.jobs.scheduled()}
    finally:
        await daemon.close()
