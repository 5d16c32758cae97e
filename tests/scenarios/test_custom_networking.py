"""Custom networking against the embedded EC2: with the ENIConfig file of the node's zone, the primary
ENI carries no pods. The pool grows on secondary ENIs only, every pod address is theirs, the node fills
at EKS's custom-networking max pods, and a node that ran without custom networking gives back what its
primary ENI held once its pods are gone."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from cloud.ec2 import Boto3Ec2, client_config
from cloud.embedded.world import EmbeddedEc2, World
from cloud.embedded.world_layout import Layout, SubnetSpec
from datastore.records import AllocationRecord
from datastore.store import STATE_FILE_NAME
from ipamd.clock import FakeClock
from ipamd.config.eniconfig import EniConfig
from ipamd.config.settings import Config
from ipamd.engine.engine import Engine
from ipamd.errors import NoAddressAvailable, NodeFull
from ipamd.node.cloud_node import FAST, CloudNode, NoImds
from ipamd.node.engine_parts import describe_node, open_parts
from ipamd.node.engine_parts import strategy as unit_strategy
from ipamd.runtime.fake import FakeRuntime
from tests.support.node import key

POD_SUBNET = "100.64.0.0/19"
LAYOUT = Layout(secondary_cidrs=("100.64.0.0/16",), subnets=(SubnetSpec(POD_SUBNET),))


def _eniconfig_file(tmp_path: Path, world: World) -> Path:
    """The ENIConfigs as `kubectl get eniconfigs -o json` prints them: the pod subnet for the
    node's zone, and another zone's."""
    item = {
        "apiVersion": "crd.k8s.amazonaws.com/v1alpha1",
        "kind": "ENIConfig",
        "metadata": {"name": world.availability_zone},
        "spec": {
            "subnet": world.subnet(POD_SUBNET).subnet_id,
            "securityGroups": [world.security_group_id],
        },
    }
    other = {"metadata": {"name": "us-west-2c"}, "spec": {"subnet": "subnet-0123456789abcdef0"}}
    path = tmp_path / "eniconfigs.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [item, other]}))
    return path


def _config(tmp_path: Path, world: World, custom: bool) -> Config:
    env = {
        "IPAMD_STATE_DIR": str(tmp_path / "state"),
        "IPAMD_MIN_ENI_LIFETIME": "0",
        "IP_COOLDOWN_PERIOD": "30",
        "IPAMD_ENI_CONFIG_FILE": str(_eniconfig_file(tmp_path, world)),
        "AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG": "true" if custom else "false",
    }
    return Config.from_env(env)


async def _open(world: World, config: Config, clock: FakeClock) -> CloudNode:
    ec2 = Boto3Ec2(world.client(client_config()), limits=FAST, rng=random.Random(1))
    facts = await describe_node(ec2, world.instance_id)
    runtime = FakeRuntime(clock)
    parts = await open_parts(
        config,
        facts,
        ec2=ec2,
        imds=NoImds(),
        runtime=runtime,
        clock=clock,
        open_engine=Engine.open,
        rng=random.Random(3),
    )
    await parts.pool.adopt()
    path = Path(config.storage.state_dir) / STATE_FILE_NAME
    strategy = unit_strategy(config)
    return CloudNode(world, ec2, ec2, parts, clock, path, strategy, config, facts, runtime)


async def _add(node: CloudNode, container_id: str) -> AllocationRecord:
    """An ADD as the runtime retries it: the pool grows while the node has no free address."""
    for _ in range(5):
        try:
            return await node.engine.assign(key(container_id))
        except NoAddressAvailable:
            await node.pool.run_once()
    raise AssertionError(f"no address for {container_id}: {node.pool.plan()}")


def _units_on_primary(node: CloudNode) -> set[str]:
    return node.ec2_units()[node.world.primary_eni_id]


async def test_the_eniconfig_file_leaves_the_primary_eni_without_pods(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    world = embedded.world("m5.large", layout=LAYOUT, seed=7)
    node = await _open(world, _config(tmp_path, world, custom=True), FakeClock())
    try:
        assert node.pool.subnets.eni_config == EniConfig(
            world.availability_zone,
            world.subnet(POD_SUBNET).subnet_id,
            (world.security_group_id,),
        )
        await node.settle()
        assert _units_on_primary(node) == set(), "no unit goes to the primary ENI"

        # An m5.large: 3 ENIs of 9 pod addresses; the primary's are not among them.
        pods = [await _add(node, f"pod-{i}") for i in range(18)]
        with pytest.raises(NodeFull):
            await _add(node, "pod-18")

        assert world.primary_eni_id not in {p.eni_id for p in pods}
        assert len({p.eni_id for p in pods}) == 2, "both secondary ENIs carry pods"
        assert node.engine.settings.max_pods == 20, "EKS's figure with custom networking"
        assert _units_on_primary(node) == set()
        assert not node.engine.state.units_on(world.primary_eni_id)
        node.check()
    finally:
        await node.engine.close()


async def test_what_the_primary_held_before_custom_networking_goes_back(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    world = embedded.world("m5.large", layout=LAYOUT, seed=7)
    clock = FakeClock()
    before = await _open(world, _config(tmp_path, world, custom=False), clock)
    try:
        await before.settle()
        old = [await _add(before, f"old-{i}") for i in range(2)]
        assert {p.eni_id for p in old} == {world.primary_eni_id}
        assert len(_units_on_primary(before)) == 9
    finally:
        await before.engine.close()

    node = await _open(world, _config(tmp_path, world, custom=True), clock)
    try:
        await node.settle()
        assert _units_on_primary(node) == {a for p in old for a in p.unit_cidrs}, (
            "the free units went back; the pods' stay until they end"
        )
        new = await _add(node, "new")
        assert new.eni_id != world.primary_eni_id

        for p in old:
            await node.engine.release(p.key)
        clock.advance(30.0)
        await node.settle()

        assert _units_on_primary(node) == set()
        assert (await _add(node, "newer")).eni_id != world.primary_eni_id
        node.check()
    finally:
        await node.engine.close()


async def test_a_changed_eniconfig_goes_to_the_next_eni_and_no_other(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    """The node's ENIConfig changes while ipamd runs (`ipamd.kube.eniconfigs` follows it): the ENI
    made before keeps its subnet and its pods; the next ENI is made in the new subnet."""
    other = "100.64.32.0/19"
    layout = Layout(
        secondary_cidrs=("100.64.0.0/16",), subnets=(SubnetSpec(POD_SUBNET), SubnetSpec(other))
    )
    world = embedded.world("m5.large", layout=layout, seed=7)
    node = await _open(world, _config(tmp_path, world, custom=True), FakeClock())
    try:
        await node.settle()
        first = [await _add(node, f"pod-{i}") for i in range(9)]
        (first_eni,) = {p.eni_id for p in first}
        moved = EniConfig("pods-b", world.subnet(other).subnet_id, (world.security_group_id,))
        node.pool.subnets.follow_eni_config(moved)
        assert node.pool.subnets.candidates() == (moved.subnet_id,)

        later = [await _add(node, f"later-{i}") for i in range(9)]
        enis = {e.eni_id: e for e in node.engine.state.enis().values()}
        assert {p.eni_id for p in later}.isdisjoint({first_eni}), "the first ENI is full"
        assert {enis[p.eni_id].subnet_id for p in later} == {moved.subnet_id}
        assert enis[first_eni].subnet_id == world.subnet(POD_SUBNET).subnet_id, "it keeps its own"
        assert all(node.engine.state.allocations().get(p.key) for p in first), "pods keep theirs"
        node.check()
    finally:
        await node.engine.close()
