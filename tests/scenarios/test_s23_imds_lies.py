"""S23: seed 001 replayed with its addresses and counts. IMDS keeps four addresses ipamd released and
misses every new one; at the worst moment the counts are equal. ipamd compares by content, takes EC2's
word, and never releases or reassigns the in-use 10.56.156.194 — nor after a restart.

What each scenario replays, and which tests prove it: docs/failure-scenarios.md."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cloud.embedded.imds_sim import ImdsSimulator
from cloud.embedded.world import EmbeddedEc2
from cloud.imds import Imdsv2Client
from ipamd.config.groups import PoolSettings
from ipamd.node.cloud_node import CloudNode, open_cloud_node
from ipamd.reconcile.imds_hint import ImdsHint
from ipamd.sizing.inputs import PoolTargets
from tests.support.node import key

GRACE_S = 60.0
COMMON = ("10.56.146.10", "10.56.146.11", "10.56.146.12")  # the seed's "M common" addresses
RELEASED = ("10.56.150.175", "10.56.147.61", "10.56.159.130", "10.56.151.147")  # IMDS keeps them
NEW = ("10.56.156.194", "10.56.151.27", "10.56.151.25")  # IMDS misses them
IN_USE = "10.56.156.194"
STEP3 = "10.56.145.254"
STEP6 = ("10.56.148.72", "10.56.154.181")


@dataclass
class Views:
    node: CloudNode
    sim: ImdsSimulator
    imds: Imdsv2Client
    triggered: list[bool]

    @property
    def eni_id(self) -> str:
        return self.node.world.primary_eni_id

    def ec2_addresses(self) -> set[str]:
        return {c.removesuffix("/32") for c in self.node.ec2_units()[self.eni_id]}

    def ipamd_addresses(self) -> set[str]:
        return {c.removesuffix("/32") for c in self.node.ipamd_units()[self.eni_id]}

    async def imds_addresses(self) -> set[str]:
        interfaces = await self.imds.interfaces()
        return {a for i in interfaces if i.eni_id == self.eni_id for a in i.local_ipv4s[1:]}

    async def grow(self, *addresses: str) -> None:
        """The pool's grow, with the addresses of the seed: EC2 assigns, its answer enters ipamd."""
        self.node.world.client().assign_private_ip_addresses(
            NetworkInterfaceId=self.eni_id, PrivateIpAddresses=list(addresses)
        )
        await self.node.engine.add_units(self.eni_id, [f"{a}/32" for a in addresses], "ip")

    async def shrink(self, *addresses: str) -> None:
        """The pool's release of free addresses: marked releasing, unassigned, then forgotten."""
        cidrs = [f"{a}/32" for a in addresses]
        assert set(await self.node.engine.begin_release(cidrs)) == set(cidrs)
        self.node.world.client().unassign_private_ip_addresses(
            NetworkInterfaceId=self.eni_id, PrivateIpAddresses=list(addresses)
        )
        await self.node.engine.finish_release(cidrs)

    def hint(self) -> ImdsHint:
        return ImdsHint(
            lambda: self.node.engine.state,
            self.imds,
            ("ip",),
            GRACE_S,
            self.node.clock,
            lambda: self.triggered.append(True),
            min_trigger_interval_s=0,
        )

    async def reconcile(self) -> None:
        """eniIPPoolReconcile's moment: IMDS is read; a disagreement sends ipamd to EC2."""
        self.triggered.clear()
        await self.hint().run_once()
        if self.triggered:
            await self.node.drift.run_once()

    def assert_safe(self) -> None:
        state = self.node.engine.state
        assert state.owner_of(IN_USE) == key("pod-a"), "the in-use address stays with its pod"
        assert IN_USE in self.ec2_addresses(), "and is never returned to EC2"
        assert not self.ipamd_addresses() - self.ec2_addresses(), "nothing EC2 does not list"
        assert not set(RELEASED) & self.ipamd_addresses(), "IMDS's stale addresses never enter"
        self.node.check()


@pytest.fixture
async def views(embedded: EmbeddedEc2, tmp_path: Path) -> AsyncIterator[Views]:
    targets = PoolTargets(warm_ip_target=2, minimum_ip_target=2, min_eni_lifetime_s=0)
    async with open_cloud_node(
        embedded,
        tmp_path,
        targets=targets,
        subnet_cidr="10.56.144.0/20",
        # the excess goes at once: the lie meets a release
        settings={"pool": PoolSettings(release_delay_s=0.0)},
    ) as node:
        sim = ImdsSimulator(node.world, clock=node.clock.now)
        base_url = await sim.start()
        imds = Imdsv2Client(base_url, clock=node.clock.now)
        try:
            yield Views(node, sim, imds, [])
        finally:
            await imds.close()
            await sim.close()


async def test_s23_seed_001_timeline_never_releases_the_in_use_address(views: Views) -> None:
    node = views.node
    # Before the seed's first step: M common addresses, some in use; four addresses ipamd released
    # that IMDS keeps serving; three new ones IMDS never shows, one of them (…156.194) in use.
    await views.grow(*COMMON, *RELEASED)
    for i in range(len(COMMON)):
        await node.engine.assign(key(f"pod-common-{i}"))
    views.sim.lag.keep(*RELEASED)
    await views.shrink(*RELEASED)
    views.sim.lag.hide(*NEW, STEP3, *STEP6)
    await views.grow(IN_USE)
    assert (await node.engine.assign(key("pod-a"))).addresses == (IN_USE,)
    await views.grow(*NEW[1:])
    node.clock.advance(GRACE_S)

    # Step 2 (22:14:11): counts differ (M+3 vs M+4); ipamd compares contents anyway.
    await views.reconcile()
    assert views.triggered, "IMDS disagrees in content"
    views.assert_safe()

    # Step 3 (22:14:30): a pod takes an address; the pool adds 10.56.145.254, unseen by IMDS.
    await node.engine.assign(key("pod-b"))
    await views.grow(STEP3)
    imds, ours = await views.imds_addresses(), views.ipamd_addresses()
    assert len(imds) == len(ours) and imds != ours, "the equal-count moment of the seed"

    # Step 4 (22:15:36): with equal counts VPC CNI trusted IMDS and dropped four addresses.
    await views.reconcile()
    assert views.triggered, "content, not count: still a disagreement"
    views.assert_safe()

    # Step 6 (22:15:39): the pool adds two more, unseen by IMDS.
    await views.grow(*STEP6)
    node.clock.advance(GRACE_S)

    # Steps 7-8 (22:16:42-44): reconcile, then the warm pool releases what it finds unused.
    await views.reconcile()
    await node.pool.run_once()
    assert not node.pool.plan().release_units, "the excess went back"
    views.assert_safe()

    # The same right after a restart: grace windows and cooldowns come back from disk.
    await node.engine.close()
    await node.reopen()
    await views.reconcile()
    node.clock.advance(GRACE_S)
    await views.reconcile()
    await node.pool.run_once()
    await node.engine.release(key("pod-b"))
    node.clock.advance(node.engine.settings.cooldown_s)
    await node.pool.run_once()
    views.assert_safe()
