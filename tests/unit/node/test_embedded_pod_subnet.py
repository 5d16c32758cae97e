"""IPAMD_EMBEDDED_POD_SUBNET: a laptop node gets a second, tagged subnet for subnet discovery."""

from __future__ import annotations

import pytest

from cloud.embedded.world import EmbeddedEc2
from cloud.embedded.world_layout import CNI_ROLE_TAG
from ipamd.config.settings import Config, ConfigError
from ipamd.node.embedded import pod_subnet_layout


def test_the_setting_takes_a_subnet_outside_the_nodes() -> None:
    config = Config.from_env({"IPAMD_EMBEDDED_POD_SUBNET": "100.64.0.0/19"}, embedded=True)
    assert config.embedded.pod_subnet == "100.64.0.0/19"
    assert Config.from_env({}, embedded=True).embedded.pod_subnet is None


@pytest.mark.parametrize("text", ["10.0.4.0/24", "100.64.0.1/16", "100.64.0.0/29", "bogus"])
def test_a_subnet_that_cannot_be_the_pod_subnet_is_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="IPAMD_EMBEDDED_POD_SUBNET"):
        Config.from_env({"IPAMD_EMBEDDED_POD_SUBNET": text}, embedded=True)


def test_the_layout_adds_its_block_and_a_tagged_subnet_in_the_nodes_zone() -> None:
    assert pod_subnet_layout(None) is None
    layout = pod_subnet_layout("100.64.32.0/19")
    assert layout is not None
    with EmbeddedEc2() as host:
        world = host.world(layout=layout)
    assert world.secondary_cidrs == ("100.64.0.0/16",)
    (subnet,) = world.subnets
    assert subnet.cidr == "100.64.32.0/19"
    assert subnet.availability_zone == world.availability_zone
    assert dict(subnet.tags) == {CNI_ROLE_TAG: "1"}
