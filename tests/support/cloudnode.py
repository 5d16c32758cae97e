"""A whole node on the embedded EC2: a world (VPC, subnet, instance), the boto3 adapter on it, an engine
on a real state file, and the pool manager — with helpers to compare what EC2 reports with what ipamd
believes."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cloud.calls import CallLog
from cloud.ec2 import Boto3Ec2, client_config
from cloud.embedded.world import EmbeddedEc2, World
from cloud.ports import Ec2Api, Instance
from cloud.ratelimit import RateLimits
from ipamd.clock import FakeClock
from ipamd.engine.allocator import EngineSettings
from ipamd.engine.engine import Engine
from ipamd.engine.pool import PoolManager, PoolSettings
from ipamd.policy.model import NodeLimits, PoolTargets
from ipamd.policy.modes import PREFIXES, SECONDARY_IPS, UnitStrategy
from ipamd.policy.plan import compute_pod_limit
from ipamd.reconcile.ec2_drift import Ec2Drift
from tests.support.invariants import check_invariants

# Generous buckets: these tests are about correctness, and the fake clock does not refill them.
FAST = RateLimits(
    read_rate_per_s=1e6, read_burst=10_000, mutate_rate_per_s=1e6, mutate_burst=10_000
)


@dataclass
class CloudNode:
    world: World
    ec2: Boto3Ec2
    api: Ec2Api
    engine: Engine
    pool: PoolManager
    clock: FakeClock
    path: Path
    strategy: UnitStrategy
    calls: CallLog = field(default_factory=CallLog)
    peak_enis: int = 0

    def ec2_units(self) -> dict[str, set[str]]:
        """EC2's view, read from moto's backend directly: units per attached ENI of the instance."""
        backend: Any = self.world.backend()
        instance = backend.get_instance(self.world.instance_id)
        view: dict[str, set[str]] = {}
        for eni in instance.nics.values():
            if self.strategy.kind == "prefix":
                units = {p["Ipv4Prefix"] for p in getattr(eni, "ipv4_prefixes", [])}
            else:
                units = {
                    f"{a['PrivateIpAddress']}/32"
                    for a in eni.private_ip_addresses
                    if not a.get("Primary")
                }
            view[eni.id] = units
        return view

    def ipamd_units(self) -> dict[str, set[str]]:
        state = self.engine.state
        return {
            eni_id: {c for c in state.units_on(eni_id) if state.units()[c].state != "lost"}
            for eni_id in state.enis()
        }

    async def settle(self, max_rounds: int = 20) -> int:
        """Run the pool manager until its plan is empty; returns the rounds it took."""
        for rounds in range(1, max_rounds + 1):
            if (await self.pool.run_once()).is_empty():
                return rounds
        raise AssertionError(f"the pool did not settle in {max_rounds} rounds: {self.pool.plan()}")

    def drift(self, grace_s: float = 60.0) -> Ec2Drift:
        """The EC2 drift reconcile wired as the daemon wires it."""
        return Ec2Drift(
            self.engine,
            self.api,
            self.world.instance_id,
            (self.strategy.kind,),
            grace_s,
            self.clock,
            lambda: self.pool.releases_in_flight,
        )

    def check(self) -> None:
        check_invariants(self.engine, self.path, self.clock.now())
        assert self.ec2_units() == self.ipamd_units(), "what EC2 reports equals what ipamd believes"


async def open_cloud_node(
    embedded: EmbeddedEc2,
    tmp_path: Path,
    instance_type: str = "m5.large",
    targets: PoolTargets | None = None,
    prefix_mode: bool = False,
    subnet_cidr: str = "10.0.0.0/16",
    api_wrapper: Any = None,
    fallback: bool = False,
) -> CloudNode:
    world = embedded.world(instance_type, subnet_cidr=subnet_cidr, seed=7)
    calls = CallLog()
    ec2 = Boto3Ec2(world.client(client_config()), recorder=calls, limits=FAST, rng=random.Random(1))
    api: Ec2Api = api_wrapper(ec2) if api_wrapper else ec2
    clock = FakeClock()
    strategy = PREFIXES if prefix_mode else SECONDARY_IPS
    limits_raw = await ec2.instance_limits(instance_type)
    limits = NodeLimits(max_enis=limits_raw.max_enis, units_per_eni=limits_raw.units_per_eni)
    targets = targets or PoolTargets()
    path = tmp_path / "state" / "ipamd.db"
    engine = await Engine.open(
        path,
        clock,
        EngineSettings(max_pods=compute_pod_limit(targets, limits, strategy)),
    )
    instance: Instance = await ec2.describe_instance(world.instance_id)
    pool = PoolManager(
        engine,
        api,
        instance,
        limits,
        PoolSettings(
            targets=targets,
            strategy=strategy,
            fallback_strategy=SECONDARY_IPS if fallback else None,
            cluster_name="test-cluster",
        ),
        clock,
        random.Random(3),
    )
    await pool.adopt()
    return CloudNode(world, ec2, api, engine, pool, clock, path, strategy, calls)
