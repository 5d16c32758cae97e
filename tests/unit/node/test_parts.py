"""The one wiring of a node's parts (`ipamd.node.engine_parts`): the engine's settings come from the
configuration and the instance's limits and are final once it is open; every part works on that one
engine; the ENIs the pool manager has in flight are the ones the drift and ENI GC leave alone."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from cloud.fakes import FakeEc2, FakeEni, FakeImds
from cloud.models import NetworkInterface
from cloud.ports import MANAGED_BY, TAG_CREATED_AT, TAG_INSTANCE_ID, TAG_MANAGED_BY
from datastore.store import STATE_FILE_NAME
from ipamd.clock import Clock, FakeClock
from ipamd.config.settings import Config
from ipamd.engine.allocator import EngineParams
from ipamd.engine.engine import Engine
from ipamd.node.engine_parts import (
    Parts,
    describe_node,
    engine_params,
    open_parts,
    pool_params,
    pool_targets,
)
from ipamd.pool.manager import PoolManager
from ipamd.runtime.fake import FakeRuntime
from ipamd.sizing.inputs import PoolTargets
from ipamd.sizing.modes import PREFIXES, SECONDARY_IPS
from tests.support.node import key


class KeepsDeleteOnTerminationOff(FakeEc2):
    """EC2 whose attached ENIs do not go away with the instance until told to: the state a new ENI
    is in between its attach and the call that sets DeleteOnTermination."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.bound: set[str] = set()

    async def set_delete_on_termination(self, eni_id: str, attachment_id: str) -> None:
        await super().set_delete_on_termination(eni_id, attachment_id)
        self.bound.add(eni_id)

    def _as_model(self, eni: FakeEni, units: list[str], attached: bool) -> NetworkInterface:
        model = super()._as_model(eni, units, attached)
        bound = attached and (eni.device_index == 0 or eni.eni_id in self.bound)
        return replace(model, delete_on_termination=bound)


def _config(tmp_path: Path, env: Mapping[str, str] | None = None) -> Config:
    return Config.from_env({"IPAMD_STATE_DIR": str(tmp_path), **(env or {})})


@dataclass
class Node:
    parts: Parts
    ec2: KeepsDeleteOnTerminationOff
    imds: FakeImds


async def _open(
    config: Config,
    ec2: FakeEc2,
    clock: FakeClock,
    imds: FakeImds | None = None,
) -> Parts:
    facts = await describe_node(ec2, ec2.instance_id)
    return await open_parts(
        config,
        facts,
        ec2=ec2,
        imds=imds or FakeImds(ec2),
        runtime=FakeRuntime(clock),
        clock=clock,
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def node(tmp_path: Path, clock: FakeClock) -> AsyncIterator[Node]:
    ec2 = KeepsDeleteOnTerminationOff(clock)
    imds = FakeImds(ec2)
    parts = await _open(_config(tmp_path), ec2, clock, imds)
    yield Node(parts, ec2, imds)
    await parts.engine.close()


async def test_the_engine_opens_with_its_final_settings_from_the_configuration(
    tmp_path: Path, clock: FakeClock
) -> None:
    env = {"IP_COOLDOWN_PERIOD": "7", "IPAMD_DELETE_INTENT_TTL": "42", "MAX_ENI": "2"}
    config = _config(tmp_path, env)
    ec2 = FakeEc2(clock)  # an m5.large: 3 ENIs of 10 addresses, one of each the ENI's own
    parts = await _open(config, ec2, clock)
    try:
        # Two ENIs (MAX_ENI) of 9 pod addresses; max pods counts 2 host-network pods as well.
        assert parts.engine.settings == EngineParams(
            cooldown_s=7.0, intent_ttl_s=42.0, max_pods=20, max_addresses=18
        )
        assert (tmp_path / STATE_FILE_NAME).exists(), "the state file is in IPAMD_STATE_DIR"
        assert parts.targets == pool_targets(config)
        assert parts.node.limits.max_enis == 3 and parts.node.limits.units_per_eni == 9
        assert parts.kinds == ("ip",)
        assert parts.pool.strategy is SECONDARY_IPS
    finally:
        await parts.engine.close()


async def test_prefix_mode_with_the_fallback_holds_both_kinds(
    tmp_path: Path, clock: FakeClock
) -> None:
    env = {"ENABLE_PREFIX_DELEGATION": "true", "IPAMD_PREFIX_FALLBACK_TO_IPS": "true"}
    config = _config(tmp_path, env)
    parts = await _open(config, FakeEc2(clock), clock)
    try:
        assert parts.kinds == ("prefix", "ip")
        assert parts.pool.strategy is PREFIXES
        assert pool_params(config).fallback_strategy is SECONDARY_IPS
    finally:
        await parts.engine.close()


async def test_finer_settings_than_the_configuration_carries_come_through_the_inputs(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A run on a compressed clock (a crash scenario's child lives well under a second) asks for
    a cooldown finer than IP_COOLDOWN_PERIOD's whole seconds through the engine opener, and for a
    short pool backoff through the pool manager's settings; nothing is patched afterwards."""
    config = _config(tmp_path)
    ec2 = FakeEc2(clock)
    opened: list[EngineParams] = []

    async def open_engine(path: Path, clock: Clock, settings: EngineParams) -> Engine:
        opened.append(settings)
        return await Engine.open(path, clock, replace(settings, cooldown_s=0.05))

    pool = replace(pool_params(config), backoff_base_s=0.05, backoff_cap_s=0.2)
    facts = await describe_node(ec2, ec2.instance_id)
    parts = await open_parts(
        config,
        facts,
        ec2=ec2,
        imds=FakeImds(ec2),
        runtime=FakeRuntime(clock),
        clock=clock,
        open_engine=open_engine,
        pool_config=pool,
    )
    try:
        assert opened == [engine_params(config, parts.node.limits)], "the configuration's"
        assert parts.engine.settings == replace(opened[0], cooldown_s=0.05)
        assert isinstance(parts.pool, PoolManager), "an IPv4 node's pool"
        assert parts.pool._settings is pool
        assert pool_params(config) == replace(pool, backoff_base_s=1.0, backoff_cap_s=60.0)
    finally:
        await parts.engine.close()


async def test_every_part_works_on_the_one_engine(node: Node, clock: FakeClock) -> None:
    parts = node.parts
    engine = parts.engine
    report = await parts.drift.run_once()
    assert list(engine.state.enis()) == report.enis_added, "the drift fills the engine's inventory"
    assert await parts.pool.adopt() == 0, "the pool sees the same inventory: nothing to add"
    await parts.pool.run_once()
    assert engine.state.units(), "the pool grew the engine's inventory"
    clock.advance(61)
    assert await parts.hint.run_once() == [], "IMDS agrees with the engine's inventory"
    assert not parts.drift_wanted.is_set()

    await engine.assign(key("gone"))  # its sandbox is not in the runtime's listing
    clock.advance(121)
    assert await parts.leak_gc.run_once() == ()
    assert await parts.leak_gc.run_once() == ("gone",), "released from the same engine"
    assert not engine.state.allocations()


async def test_the_imds_hint_asks_for_a_drift_check(node: Node, clock: FakeClock) -> None:
    parts = node.parts
    await parts.drift.run_once()
    await parts.pool.run_once()
    clock.advance(61)
    node.imds.hidden.add(next(iter(parts.engine.state.units())))  # IMDS misses one of ipamd's
    assert await parts.hint.run_once()
    assert parts.drift_wanted.is_set()


async def test_the_pools_pending_enis_are_left_to_it(node: Node, clock: FakeClock) -> None:
    parts, ec2 = node.parts, node.ec2
    assert parts.pending_enis is parts.pool.pending_enis
    instance_id = parts.node.instance.instance_id
    created_at = datetime.fromtimestamp(clock.now(), UTC).strftime("%Y-%m-%dT%H:%M:%S%z")
    tags = {TAG_INSTANCE_ID: instance_id, TAG_MANAGED_BY: MANAGED_BY, TAG_CREATED_AT: created_at}
    detached = (await ec2.create_eni(ec2.subnet_id, (), "ipamd", tags)).eni_id
    attaching = (await ec2.create_eni(ec2.subnet_id, (), "ipamd", tags)).eni_id
    await ec2.attach_eni(attaching, instance_id, 1)
    parts.pending_enis.update({detached, attaching})
    clock.advance(3600)

    assert await parts.eni_gc.run_once() == (), "ENI GC never deletes a pending ENI"
    await parts.drift.run_once()
    assert ec2.bound == set(), "the drift leaves DeleteOnTermination to the pool manager"

    parts.pending_enis.clear()
    assert await parts.eni_gc.run_once() == (detached,)
    await parts.drift.run_once()
    assert ec2.bound == {attaching}, "no longer pending: the drift binds it to the instance"


def test_the_pool_targets_are_the_configured_knobs() -> None:
    config = Config.from_env(
        {
            "WARM_ENI_TARGET": "2",
            "WARM_IP_TARGET": "3",
            "MINIMUM_IP_TARGET": "4",
            "WARM_PREFIX_TARGET": "5",
            "MAX_ENI": "6",
            "IPAMD_MAX_PODS": "70",
            "IPAMD_MIN_ENI_LIFETIME": "80",
        }
    )
    assert pool_targets(config) == PoolTargets(2, 3, 4, 5, 6, 70, 80.0)
    assert pool_targets(Config.from_env({})) == PoolTargets()
