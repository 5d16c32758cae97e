"""End to end: a node whose aws-node dates from its CRI migration, taken over in place.

aws-node v1.7/v1.8 found the pods already running through CRI and keyed them
`_migrated-from-cri`/`unknown`; those keys stay in its checkpoint for as long as the pods run. The
node here is prepared as such a node is (`aws_node.AwsNode`, the checkpoint written byte for byte as
v1.8.0 wrote it: `tests/support/vpc_cni_checkpoints.py` cites the code). ipamd adopts every pod with
its key and address, a new pod gets none of theirs, and the kubelet's DEL of a migrated pod, which
carries the real key (`aws-cni`, the sandbox, `eth0`), releases its address at once.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bench.vpc.fabric import INET_HOST, VPC_HOST
from bench.vpc.node import LEAK_GRACE_S
from tests.e2e.vpc.aws_node import AwsNode, aws_vpc_node
from tests.e2e.vpc.test_takeover import allocations, key_of, unreachable
from tests.support.vpc_cni_checkpoints import BACKFILL_IFNAME, BACKFILL_NETWORK, SHAPES

pytestmark = pytest.mark.timeout(600)

V1_8 = next(s for s in SHAPES if s.tag == "v1.8.0")


def test_pods_keyed_by_aws_nodes_cri_migration_keep_their_addresses(pause_image: Path) -> None:
    with aws_vpc_node(pause_image) as node:
        aws = AwsNode.prepare(node, {0: 3, 1: 2})
        pods = aws.run_pods([("mig-p0", 0), ("mig-s0", 1), ("add-p1", 0)])
        aws.write_checkpoint(pods, shape=V1_8, migrated={"mig-p0", "mig-s0"})

        node.start_ipamd()
        node.wait_ipamd_ready()

        held = allocations(node)
        for pod in pods:
            migrated = pod.name.startswith("mig-")
            key = (
                (BACKFILL_NETWORK, pod.sandbox_id, BACKFILL_IFNAME)
                if migrated
                else key_of(pod.sandbox_id)
            )
            assert held.get(key) == [pod.address], f"{pod.name}: {held}"
        assert not unreachable(node, pods, (VPC_HOST, INET_HOST))

        fresh = node.run_pod("after-0")
        (address,) = allocations(node)[key_of(fresh)]
        assert address not in {p.address for p in pods}, "a live pod's address handed out again"

        victim = next(p for p in pods if p.name == "mig-s0")
        removed_at = time.monotonic()
        node.remove_pod(victim.sandbox_id)  # the DEL comes as (aws-cni, sandbox, eth0)
        left = allocations(node)
        assert time.monotonic() - removed_at < LEAK_GRACE_S, "released by the DEL, not the leak GC"
        assert (BACKFILL_NETWORK, victim.sandbox_id, BACKFILL_IFNAME) not in left
        assert victim.address not in {a for addrs in left.values() for a in addrs}
        assert node.daemon.address_states().get(victim.address) == "cooling"
        assert node.daemon.stop() == 0, node.daemon.log_tail()
