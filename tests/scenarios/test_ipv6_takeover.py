"""Taking an IPv6 node over from aws-node: the /128s its checkpoint records (under `ipv6`) become
ipamd's allocations in the primary ENI's /80, and no ADD hands out one of them, nor one the next
ADDs could take while aws-node's recent releases may still be in a peer's conntrack.

What each scenario replays, and which tests prove it: docs/failure-scenarios.md."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cloud.embedded.world import EmbeddedEc2
from datastore.records import AllocationKey
from ipamd.awsnode.checkpoint import CheckpointFile
from ipamd.awsnode.takeover import Takeover
from ipamd.node.cloud_node import CloudNode, open_cloud_node
from tests.support.node import key


@pytest.fixture
async def node(embedded: EmbeddedEc2, tmp_path: Path) -> AsyncIterator[CloudNode]:
    async with open_cloud_node(embedded, tmp_path, ipv6=True) as opened:
        yield opened  # its /80 is the one aws-node's pods hold addresses of


def _entry(container_id: str, address: str) -> dict[str, object]:
    return {
        "networkName": "aws-cni",
        "containerID": container_id,
        "ifName": "eth0",
        "ipv6": address,
        "allocationTimestamp": 1_700_000_000_000_000_000,
        "metadata": {"k8sPodNamespace": "default", "k8sPodName": container_id},
    }


async def test_aws_nodes_ipv6_pods_are_adopted_and_their_neighbours_cool(
    node: CloudNode, tmp_path: Path
) -> None:
    (prefix,) = node.engine.state.units()
    net = ipaddress.IPv6Network(prefix)
    first, third = str(net[1]), str(net[3])  # ::2 was a pod's until a moment ago
    file = CheckpointFile(tmp_path / "aws-node" / "ipam.json")
    file.path.parent.mkdir(parents=True)
    entries = [_entry("web-0", first), _entry("web-1", third), _entry("gone", "2001:db8::9")]
    file.path.write_text(json.dumps({"version": "vpc-cni-ipam/1", "allocations": entries}))
    node.runtime.start("web-0")
    node.runtime.start("web-1")

    adoption = await Takeover(node.engine, file, node.runtime).run()

    assert adoption is not None
    assert adoption.adopted == (
        AllocationKey("aws-cni", "web-0", "eth0"),
        AllocationKey("aws-cni", "web-1", "eth0"),
    )
    assert adoption.refused == (
        "gone (default/gone): 2001:db8::9 is on no ENI of this node per EC2",
    )
    max_pods = node.engine.settings.max_pods
    assert max_pods is not None
    assert adoption.cooling == 3 + max_pods - 2, "::1 to ::3 + max pods, the two pods' aside"
    state = node.engine.state
    assert state.owner_of(first) == AllocationKey("aws-cni", "web-0", "eth0")
    assert state.owner_of(third) == AllocationKey("aws-cni", "web-1", "eth0")
    fresh = await node.engine.assign(key("new"))
    assert fresh.addresses == (str(net[3 + max_pods + 1]),), "above every cooling address"
    node.check()
