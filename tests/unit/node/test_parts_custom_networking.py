"""Custom networking in the wiring of a node's parts (`ipamd.node.engine_parts`): the ENIConfig of
the node's zone goes to the pool manager, the engine keeps pods off the primary ENI and counts one
ENI fewer, and a file without the node's zone is one start-up error before the state file is opened."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cloud.fakes import FakeEc2, FakeImds
from ipamd.clock import FakeClock
from ipamd.config.eniconfig import EniConfig
from ipamd.config.settings import Config
from ipamd.engine.allocator import EngineParams
from ipamd.errors import SettingUnusable
from ipamd.node.engine_parts import (
    NodeFacts,
    describe_node,
    engine_params,
    node_eni_config,
    open_parts,
)
from ipamd.runtime.fake import FakeRuntime

ZONE = "us-west-2a"  # FakeEc2's instance's
SUBNET = "subnet-0a1b2c3d4e5f60718"
SG = "sg-0123456789abcdef0"


def _config(tmp_path: Path, zones: dict[str, object], **env: str) -> Config:
    path = tmp_path / "eniconfigs.json"
    path.write_text(json.dumps(zones), encoding="utf-8")
    return Config.from_env(
        {
            "IPAMD_STATE_DIR": str(tmp_path / "state"),
            "AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG": "true",
            "IPAMD_ENI_CONFIG_FILE": str(path),
            **env,
        }
    )


async def _facts(clock: FakeClock) -> tuple[FakeEc2, NodeFacts]:
    ec2 = FakeEc2(clock)  # an m5.large: 3 ENIs of 10 addresses, one of each the ENI's own
    return ec2, await describe_node(ec2, ec2.instance_id)


async def test_the_zones_eniconfig_reaches_the_pool_and_the_engine_spares_the_primary(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    zones = {ZONE: {"subnet": SUBNET, "securityGroups": [SG]}, "us-west-2b": {"subnet": SUBNET}}
    config = _config(tmp_path, zones)
    ec2, facts = await _facts(clock)

    parts = await open_parts(
        config, facts, ec2=ec2, imds=FakeImds(ec2), runtime=FakeRuntime(clock), clock=clock
    )
    try:
        assert parts.pool.subnets.eni_config == EniConfig(ZONE, SUBNET, (SG,))
        # Two ENIs of 9 pod addresses (the primary carries none), + 2 host-network pods: EKS's 20.
        assert parts.engine.settings == EngineParams(
            cooldown_s=30.0, max_pods=20, max_addresses=18, pods_on_primary=False
        )
        assert parts.targets.custom_networking is True
    finally:
        await parts.engine.close()


async def test_without_custom_networking_the_file_is_not_used(tmp_path: Path) -> None:
    config = _config(
        tmp_path, {ZONE: {"subnet": SUBNET}}, AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG="false"
    )
    _, facts = await _facts(FakeClock())

    assert node_eni_config(config, facts) is None
    settings = engine_params(config, facts.limits)
    assert (settings.max_pods, settings.pods_on_primary) == (29, True)


async def test_a_file_without_the_nodes_zone_is_refused_before_the_state_file_opens(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    config = _config(tmp_path, {"us-west-2b": {"subnet": SUBNET}, "us-west-2c": {"subnet": SUBNET}})
    ec2, facts = await _facts(clock)

    with pytest.raises(SettingUnusable) as caught:
        await open_parts(
            config, facts, ec2=ec2, imds=FakeImds(ec2), runtime=FakeRuntime(clock), clock=clock
        )

    assert str(caught.value) == (
        f"IPAMD_ENI_CONFIG_FILE={str(tmp_path / 'eniconfigs.json')!r} has no ENIConfig for this "
        f"node's zone {ZONE!r} (it has us-west-2b, us-west-2c): custom networking needs one per "
        "zone, named after it (without the Kubernetes API, a node's ENIConfig is the file's entry "
        "for its zone)"
    )
    assert not (tmp_path / "state").exists(), "nothing was opened"


async def test_a_node_left_with_no_eni_for_pods_is_refused(tmp_path: Path) -> None:
    config = _config(tmp_path, {ZONE: {"subnet": SUBNET}}, MAX_ENI="1")
    _, facts = await _facts(FakeClock())

    with pytest.raises(SettingUnusable, match="leaves no ENI for pods") as caught:
        node_eni_config(config, facts)

    assert "MAX_ENI=1" in str(caught.value) and "m5.large takes 3" in str(caught.value)
