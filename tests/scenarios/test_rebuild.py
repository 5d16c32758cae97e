"""S9's way out: an unusable state file is moved aside and rebuilt from EC2's view and the addresses
the runtime recorded for its live sandboxes (a real gRPC CRI double), on a node of either family.

What each scenario replays, and which tests prove it: docs/failure-scenarios.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloud.embedded.world import EmbeddedEc2
from ipamd.engine.engine import Engine
from ipamd.engine.invariants import check_invariants
from ipamd.node.cloud_node import open_cloud_node
from ipamd.node.engine_parts import rebuild_drift
from ipamd.reconcile.rebuild import REBUILT_NETWORK, gather_claims, rebuild_state
from ipamd.runtime.cri import GrpcCriRuntime
from tests.support.cri_server import FakeCriServer
from tests.support.node import key


@pytest.mark.parametrize(
    ("ipv6", "elsewhere"),
    [(False, "192.168.9.9"), (True, "2001:db8::1")],
    ids=["ipv4", "ipv6"],
)
async def test_unusable_state_is_rebuilt_from_ec2_and_live_sandboxes(
    embedded: EmbeddedEc2, tmp_path: Path, ipv6: bool, elsewhere: str
) -> None:
    """On either family's node: an IPv6 node's /80 comes back from EC2, and each live sandbox's
    /128 from the runtime, found in the /80 without listing it."""
    async with open_cloud_node(embedded, tmp_path, ipv6=ipv6) as node:
        await node.settle()
        pods = {
            f"sandbox-{i}": (await node.engine.assign(key(f"sandbox-{i}"))).addresses
            for i in range(4)
        }
        await node.engine.close()
        node.path.write_bytes(b"\0" * 4096)  # the file is gone bad

        async with FakeCriServer() as cri, GrpcCriRuntime(cri.endpoint) as runtime:
            for sid in (
                "sandbox-0",
                "sandbox-1",
                "sandbox-2",
            ):  # sandbox-3 is gone with the node's reboot
                cri.add(sid, addresses=pods[sid])
            cri.add("elsewhere", addresses=(elsewhere,))  # an address not on this node per EC2
            plan = await gather_claims(runtime, runtime)
        assert set(plan.claims) == {"sandbox-0", "sandbox-1", "sandbox-2", "elsewhere"}

        async def open_engine(path: Path) -> Engine:
            engine = await Engine.open(path, node.clock, node.engine.settings)
            await engine.claim_instance(node.world.instance_id)
            return engine

        async def read_ec2(engine: Engine) -> None:
            drift = rebuild_drift(
                engine, node.api, node.world.instance_id, node.parts.kinds, node.clock
            )
            await drift.run_once()

        aside, unfixable = await rebuild_state(node.path, plan, open_engine, read_ec2, node.clock)
        assert aside.read_bytes() == b"\0" * 4096, "the unusable file is kept as it was"
        assert unfixable == [f"{elsewhere} of sandbox elsewhere is not on this node per EC2"]

        await node.reopen()
        assert node.engine.unavailable is None
        rebuilt = {k.container_id: a.addresses for k, a in node.engine.state.allocations().items()}
        assert rebuilt == {sid: pods[sid] for sid in ("sandbox-0", "sandbox-1", "sandbox-2")}
        assert {k.network for k in node.engine.state.allocations()} == {REBUILT_NETWORK}
        # The runtime's DEL names the container ID and its own network: it finds the allocation.
        assert await node.engine.release(key("sandbox-0"))
        assert node.engine.state.owner_of(pods["sandbox-3"][0]) is None, (
            "the gone sandbox's is free"
        )
        check_invariants(node.engine, node.path, node.clock.now())
        assert node.ec2_units() == node.ipamd_units()
