"""A node that can hold no more addresses says so: every ENI attached and full, every address owned by
a pod, is `node_full` (not retryable: waiting brings nothing, only a DEL does), while a pool that can
still grow, or an address that is only cooling, stays the retryable "try again later"."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from cloud.fakes import FakeEc2
from ipamd.clock import FakeClock
from ipamd.config.settings import Config
from ipamd.errors import NoAddressAvailable, NodeFull
from tests.support.daemons import fake_daemon
from tests.support.node import NodeFixture, key


async def test_every_address_owned_at_capacity_is_node_full_not_try_again(
    node: NodeFixture,
) -> None:
    node.settings = replace(node.settings, max_addresses=4, max_pods=29)
    engine = await node.open()
    await node.seed(enis=1, per_eni=3)
    for n in range(3):
        await engine.assign(key(f"p{n}"))
    with pytest.raises(NoAddressAvailable):
        await engine.assign(key("waits"))  # one more address can still come: retryable
    assert engine.pool_wanted

    await engine.add_units("eni-0000", ["10.0.0.50/32"], "ip")
    await engine.assign(key("p3"))
    assert engine.take_demand(), "the pool manager takes the demand"
    with pytest.raises(NodeFull) as full:
        await engine.assign(key("too-many"))
    assert full.value.code == "node_full" and full.value.retryable is False
    assert "4 addresses" in str(full.value)
    assert not engine.take_demand(), "nothing for the pool manager to do"

    await engine.release(key("p0"))
    with pytest.raises(NoAddressAvailable):
        await engine.assign(key("after-a-del"))  # the freed address is cooling: retryable
    node.clock.advance(node.settings.cooldown_s)
    assert (await engine.assign(key("after-a-del"))).addresses
    node.check()


async def test_the_daemon_knows_its_address_capacity(tmp_path: Path) -> None:
    clock = FakeClock()
    ec2 = FakeEc2(clock)  # an m5.large: 3 ENIs of 10 addresses, one of each the ENI's own
    for env, capacity in (({}, 27), ({"MAX_ENI": "2"}, 18)):
        config = Config.from_env({"IPAMD_STATE_DIR": str(tmp_path / str(capacity)), **env})
        daemon = await fake_daemon(config, ec2, clock)
        try:
            assert daemon.engine.settings.max_addresses == capacity
            assert daemon.engine.settings.max_pods is not None
            assert daemon.engine.settings.max_pods > capacity, "max pods counts host-network pods"
        finally:
            await daemon.close()
