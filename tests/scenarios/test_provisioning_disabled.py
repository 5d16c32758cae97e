"""DISABLE_NETWORK_RESOURCE_PROVISIONING=true, VPC CNI's meaning: someone else (a launch template, an
operator's tooling) puts the ENIs and addresses on the node, and ipamd never creates, attaches,
assigns, releases, detaches or deletes anything. It serves what EC2 lists on the node, adopts what is
added later, and its pool, shrink and leaked-ENI cleanup make no EC2 call that changes anything.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cloud.fakes import FakeEc2
from datastore.records import AllocationKey
from ipamd.clock import FakeClock
from ipamd.config.settings import Config
from ipamd.errors import NoAddressAvailable
from ipamd.model import PodRef
from ipamd.node.daemon import Daemon
from tests.support.daemons import fake_daemon

CHANGING = (
    "create_eni",
    "attach_eni",
    "detach_eni",
    "delete_eni",
    "assign_units",
    "unassign_units",
    "assign_ipv6_prefix",
    "set_delete_on_termination",
)


def key(n: int) -> AllocationKey:
    return AllocationKey("aws-cni", f"pod{n:03}", "eth0")


def changes(ec2: FakeEc2) -> dict[str, int]:
    return {c: ec2.calls[c] for c in CHANGING if ec2.calls[c]}


@pytest.fixture
async def provisioned(tmp_path: Path) -> tuple[FakeClock, FakeEc2, list[str]]:
    """A node whose primary ENI already has three secondary addresses (put there by someone else)."""
    clock = FakeClock(1_800_000_000.0)
    ec2 = FakeEc2(clock)
    primary = next(iter(ec2.enis))
    cidrs = await ec2.assign_units(primary, "ip", 3)
    ec2.calls.clear()
    return clock, ec2, [c.removesuffix("/32") for c in cidrs]


def config(tmp_path: Path, **extra: str) -> Config:
    return Config.from_env(
        {
            "IPAMD_STATE_DIR": str(tmp_path / "state"),
            "DISABLE_NETWORK_RESOURCE_PROVISIONING": "true",
            "WARM_IP_TARGET": "5",
            "MINIMUM_IP_TARGET": "10",
            "IPAMD_RELEASE_DELAY": "0",
            **extra,
        }
    )


async def started(tmp_path: Path, clock: FakeClock, ec2: FakeEc2, **extra: str) -> Daemon:
    daemon = await fake_daemon(config(tmp_path, **extra), ec2, clock)
    await daemon.start()
    return daemon


async def test_the_node_serves_what_it_has_and_asks_ec2_for_nothing(
    tmp_path: Path, provisioned: tuple[FakeClock, FakeEc2, list[str]]
) -> None:
    clock, ec2, addresses = provisioned
    daemon = await started(tmp_path, clock, ec2)
    try:
        assert daemon.ready
        got: list[str] = []
        for n in range(3):
            got.extend((await daemon.engine.assign(key(n), PodRef("d", f"p{n}", ""))).addresses)
            await daemon.pool.run_once()
        assert sorted(got) == sorted(addresses)
        with pytest.raises(NoAddressAvailable):
            await daemon.engine.assign(key(3), PodRef("d", "p3", ""))
        for _ in range(5):
            await daemon.pool.run_once()  # pods wait: a provisioning pool would grow now
            clock.advance(60)
        for n in range(3):
            await daemon.engine.release(key(n))
        clock.advance(3600)
        await daemon.pool.run_once()  # and shrink now, far above its targets
        await daemon.eni_gc.run_once()
        assert changes(ec2) == {}, "EC2 was asked to change something"
        assert len(daemon.engine.state.units()) == 3, "nothing given back"
    finally:
        await daemon.close()


async def test_addresses_provisioned_later_are_served(
    tmp_path: Path, provisioned: tuple[FakeClock, FakeEc2, list[str]]
) -> None:
    clock, ec2, _ = provisioned
    daemon = await started(tmp_path, clock, ec2)
    try:
        for n in range(3):
            await daemon.engine.assign(key(n), PodRef("d", f"p{n}", ""))
        primary = next(iter(ec2.enis))
        (later,) = await ec2.assign_units(primary, "ip", 1)  # the operator's tooling adds one
        await daemon.drift.run_once()
        record = await daemon.engine.assign(key(3), PodRef("d", "p3", ""))
        assert record.addresses == (later.removesuffix("/32"),)
    finally:
        await daemon.close()


def test_the_setting_is_parsed_as_vpc_cni_parses_it(tmp_path: Path) -> None:
    assert config(tmp_path).pool.disable_network_resource_provisioning
    on = Config.from_env({"IPAMD_STATE_DIR": str(tmp_path)})
    assert not on.pool.disable_network_resource_provisioning
