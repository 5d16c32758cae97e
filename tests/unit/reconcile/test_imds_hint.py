"""The IMDS hint costs EC2 nothing while IMDS merely lags: a disagreement about units ipamd changed
within the grace window (IPAMD_RECONCILE_GRACE) triggers no drift check, so no
DescribeNetworkInterfaces call; the same disagreement once the window is over does."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cloud.fakes import FakeEc2, FakeImds
from cloud.ports import ImdsInterface
from datastore.records import EniRecord
from ipamd.clock import FakeClock
from ipamd.config.settings import Config
from ipamd.node.daemon import Daemon
from ipamd.reconcile import imds_hint
from ipamd.reconcile.imds_hint import diff_imds
from tests.support.daemons import fake_daemon
from tests.support.node import NodeFixture, key


async def _hint_tick(daemon: Daemon) -> list[str]:
    """One run of the hint job, and the drift check it asks for, as `Daemon.drift_on_demand` runs it."""
    found = await daemon.hint.run_once()
    if daemon.drift_wanted.is_set():
        daemon.drift_wanted.clear()
        await daemon.drift.run_once()
    return found


async def _daemon(tmp_path: Path) -> tuple[Daemon, FakeEc2, FakeImds, FakeClock, Config]:
    """A daemon on fake EC2 and IMDS, two warm addresses, no warm ENI."""
    clock = FakeClock()
    ec2 = FakeEc2(clock)
    env = {"IPAMD_STATE_DIR": str(tmp_path), "WARM_IP_TARGET": "2", "WARM_ENI_TARGET": "0"}
    config = Config.from_env(env)
    daemon = await fake_daemon(config, ec2, clock)
    assert isinstance(daemon.imds, FakeImds)
    return daemon, ec2, daemon.imds, clock, config


async def test_an_imds_hint_inside_the_grace_window_costs_no_describe(tmp_path: Path) -> None:
    daemon, ec2, imds, clock, config = await _daemon(tmp_path)
    try:
        await daemon.start()
        grown = ec2.calls["assign_units"]
        await daemon.pool.run_once()
        assert ec2.calls["assign_units"] == grown + 1, "the pool grew"
        new = {c for units in ec2.truth().values() for c in units}
        assert len(new) == 2
        imds.hidden |= new  # IMDS lags behind the assign, as it does
        describes = ec2.calls["describe_enis"]

        clock.advance(config.reconcile.grace_s - 1)
        assert await _hint_tick(daemon) == [], "inside the window IMDS's lag is no disagreement"
        assert ec2.calls["describe_enis"] == describes, "and costs no DescribeNetworkInterfaces"
        assert daemon.hint.triggers == 0

        clock.advance(1)
        assert await _hint_tick(daemon), "the window over, the same lag is a disagreement"
        assert daemon.hint.triggers == 1
        assert ec2.calls["describe_enis"] == describes + 1, "which EC2's listing settles"
    finally:
        await daemon.close()


async def test_an_agreeing_imds_is_compared_again_only_once_something_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon, ec2, imds, clock, config = await _daemon(tmp_path)
    compared: list[float] = []

    def counting(*args: Any, **kwargs: Any) -> list[str]:
        compared.append(clock.now())
        return diff_imds(*args, **kwargs)

    monkeypatch.setattr(imds_hint, "diff_imds", counting)
    try:
        await daemon.start()
        await daemon.pool.run_once()
        clock.advance(config.reconcile.grace_s)
        assert await daemon.hint.run_once() == []
        assert compared, "compared the first time"
        compared.clear()
        clock.advance(5)
        assert await daemon.hint.run_once() == []
        assert compared == [], "the same state and the same answer agree as they did"

        await daemon.engine.assign(key("a"))  # a commit: the state's revision moves on
        assert await daemon.hint.run_once() == []
        assert compared, "a changed state is compared again"
        compared.clear()
        imds.hidden |= {c for units in ec2.truth().values() for c in units}
        clock.advance(5)
        assert await daemon.hint.run_once(), "a changed answer is compared, and disagrees"
        assert compared
    finally:
        await daemon.close()


async def test_an_ipv6_nodes_80_is_compared_with_imds_by_content(node: NodeFixture) -> None:
    """IMDS listing another /80 than the one ipamd holds is a disagreement, and lacking ipamd's own
    is one once the grace window is over; the same /80 is none."""
    engine = await node.open()
    held, other = "2600:1f14:abc:d00:1234::/80", "2600:1f14:abc:d00:5678::/80"
    await engine.add_eni(EniRecord("eni-0", 0, "subnet-1", True, 0.0, mac="02:00:00:00:00:00"))
    await engine.add_units("eni-0", [held], "ipv6_prefix")
    imds = ImdsInterface("02:00:00:00:00:00", "eni-0", 0, "subnet-1", ("10.0.0.5",), ())
    later = node.clock.now() + 61.0

    def seen(prefixes: tuple[str, ...], now: float) -> list[str]:
        interface = replace(imds, ipv6_prefixes=prefixes)
        return diff_imds(engine.state, (interface,), ("ipv6_prefix",), now, 60.0)

    assert seen((held,), later) == []
    # ipamd added its /80 just now: IMDS lacking it may be lag; a /80 ipamd never had is not.
    assert seen((other,), node.clock.now()) == [f"eni-0: IMDS lists {other}"]
    assert seen((other,), later) == [f"eni-0: IMDS lists {other}", f"eni-0: IMDS lacks {held}"]
