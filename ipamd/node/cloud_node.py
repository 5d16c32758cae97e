"""A whole node on the embedded EC2, for tests and benchmarks: a world (VPC, subnet, instance), the
boto3 adapter on it, and the daemon's parts wired by `open_parts`, the one composition path the daemon
itself takes (an engine on a real state file, the pool manager, the EC2 drift, ...), on a fake clock
and a fake runtime — with helpers to compare what EC2 reports with what ipamd believes.

`async with open_cloud_node(embedded, tmp_path) as node:` opens one and closes its engine on the way
out; `node_config` is the configuration such a node runs with, for callers that wire parts of their
own.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cloud.calls import CallLog
from cloud.ec2 import Boto3Ec2, client_config
from cloud.embedded.ipv6_rules import eni_ipv6_prefixes
from cloud.embedded.world import EmbeddedEc2, World
from cloud.embedded.world_layout import Layout
from cloud.errors import ServiceUnavailable
from cloud.ports import Ec2Api, ImdsIdentity, ImdsInterface
from cloud.ratelimit import RateLimits
from datastore.store import STATE_FILE_NAME
from ipamd.clock import FakeClock
from ipamd.config.eniconfig import EniConfig
from ipamd.config.groups import FamilySettings
from ipamd.config.settings import Config
from ipamd.engine.engine import Engine
from ipamd.engine.invariants import InvariantBroken, check_invariants
from ipamd.node.engine_parts import (
    EngineOpener,
    NodeFacts,
    OnParts,
    Parts,
    describe_node,
    open_parts,
)
from ipamd.node.engine_parts import strategy as unit_strategy
from ipamd.pool.manager import PoolManager
from ipamd.runtime.fake import FakeRuntime
from ipamd.sizing.inputs import PoolTargets
from ipamd.sizing.modes import UnitStrategy

# Generous buckets: these tests are about correctness, and the fake clock does not refill them.
FAST = RateLimits(
    read_rate_per_s=1e6, read_burst=10_000, mutate_rate_per_s=1e6, mutate_burst=10_000
)


class NoImds:
    """IMDS for a node whose tests never run the IMDS hint: asking is IMDS not answering."""

    async def identity(self) -> ImdsIdentity:
        raise ServiceUnavailable("ImdsGet", "503", "this test node has no IMDS")

    async def interfaces(self) -> tuple[ImdsInterface, ...]:
        raise ServiceUnavailable("ImdsGet", "503", "this test node has no IMDS")


@dataclass
class CloudNode(OnParts):
    world: World
    ec2: Boto3Ec2
    api: Ec2Api
    """What the parts call EC2 through: `ec2`, or a test's wrapper around it."""
    parts: Parts
    clock: FakeClock
    path: Path
    strategy: UnitStrategy
    config: Config
    facts: NodeFacts
    runtime: FakeRuntime
    """The node's container runtime, which its leak GC lists (start and stop sandboxes on it)."""
    calls: CallLog = field(default_factory=CallLog)
    peak_enis: int = 0
    eni_config: EniConfig | None = None

    @property
    def manager(self) -> PoolManager:
        """An IPv4 node's pool manager, for the tests that drive what only it has (its plan, its
        stats, its new ENIs); an IPv6 node has none."""
        pool = self.parts.pool
        if not isinstance(pool, PoolManager):
            raise TypeError(f"this node's pool is {type(pool).__name__}, not a PoolManager")
        return pool

    async def reopen(
        self, api: Ec2Api | None = None, open_engine: EngineOpener = Engine.open
    ) -> None:
        """The node's parts afresh on its state file, as after a restart (close the engine first):
        on `api` (default: the node's), the engine opened by `open_engine`."""
        self.parts = await _open_parts(
            self.config,
            self.facts,
            api or self.api,
            self.clock,
            self.runtime,
            open_engine,
            self.ec2,
            self.eni_config,
        )

    def ec2_units(self) -> dict[str, set[str]]:
        """EC2's view, read from moto's backend directly: units per attached ENI of the instance."""
        backend: Any = self.world.backend()
        instance = backend.get_instance(self.world.instance_id)
        view: dict[str, set[str]] = {}
        for eni in instance.nics.values():
            if self.config.family.enable_ipv6:
                units = set(eni_ipv6_prefixes(eni))
            elif self.strategy.kind == "prefix":
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

    def check(self) -> None:
        """The engine's invariants hold, and what EC2 reports equals what ipamd believes."""
        check_invariants(self.engine, self.path, self.clock.now())
        ec2, ipamd = self.ec2_units(), self.ipamd_units()
        if ec2 != ipamd:
            raise InvariantBroken(f"EC2 reports {ec2}, ipamd believes {ipamd}")


@asynccontextmanager
async def open_cloud_node(
    embedded: EmbeddedEc2,
    tmp_path: Path,
    instance_type: str = "m5.large",
    targets: PoolTargets | None = None,
    prefix_mode: bool = False,
    subnet_cidr: str = "10.0.0.0/16",
    api_wrapper: Any = None,
    fallback: bool = False,
    layout: Layout | None = None,
    eni_config: EniConfig | None = None,
    settings: Mapping[str, Any] | None = None,
    seed: int = 7,
    ipv6: bool = False,
) -> AsyncIterator[CloudNode]:
    """A node on `embedded`'s new world, its pool adopted, its state in `tmp_path`; its engine
    closed on the way out (whichever engine it has then: `reopen` replaces it).

    `layout`: the VPC's other subnets (subnet discovery reads them through `ec2`, whatever wraps
    the parts' EC2 calls); `eni_config`: custom networking's subnet and security groups;
    `settings`: other `Config` fields; `seed`: moto's random source (IDs, the addresses EC2 draws);
    `ipv6`: IPv6 mode (its settings, and IPv6 blocks on the VPC), the /80 in place as at ready."""
    if ipv6:
        layout = replace(layout or Layout(), ipv6=True)
        settings = {
            **(settings or {}),
            "family": FamilySettings(enable_ipv4=False, enable_ipv6=True),
        }
        prefix_mode = True
    world = embedded.world(instance_type, subnet_cidr=subnet_cidr, seed=seed, layout=layout)
    calls = CallLog()
    ec2 = Boto3Ec2(world.client(client_config()), recorder=calls, limits=FAST, rng=random.Random(1))
    api: Ec2Api = api_wrapper(ec2) if api_wrapper else ec2
    clock = FakeClock()
    config = node_config(
        tmp_path / "state", targets, prefix_mode=prefix_mode, fallback=fallback, **(settings or {})
    )
    facts = await describe_node(ec2, world.instance_id)
    runtime = FakeRuntime(clock)
    parts = await _open_parts(config, facts, api, clock, runtime, Engine.open, ec2, eni_config)
    await parts.pool.adopt()
    await parts.pool.before_ready()  # as the daemon's start-up: IPv6 mode's /80
    path = Path(config.storage.state_dir) / STATE_FILE_NAME
    node = CloudNode(
        world,
        ec2,
        api,
        parts,
        clock,
        path,
        unit_strategy(config),
        config,
        facts,
        runtime,
        calls,
        eni_config=eni_config,
    )
    try:
        yield node
    finally:
        await node.engine.close()


async def _open_parts(
    config: Config,
    facts: NodeFacts,
    api: Ec2Api,
    clock: FakeClock,
    runtime: FakeRuntime,
    open_engine: EngineOpener,
    subnets: Boto3Ec2,
    eni_config: EniConfig | None = None,
) -> Parts:
    return await open_parts(
        config,
        facts,
        ec2=api,
        imds=NoImds(),
        runtime=runtime,
        clock=clock,
        open_engine=open_engine,
        rng=random.Random(3),
        eni_config=eni_config,
        subnets=subnets,
        catalog=subnets,  # as the daemon's: scarcity mode reads subnets discovery does not
    )


def node_config(
    state_dir: Path,
    targets: PoolTargets | None = None,
    *,
    prefix_mode: bool = False,
    fallback: bool = False,
    cluster_name: str = "test-cluster",
    **groups: Any,
) -> Config:
    """The configuration whose pool targets are `targets` (PoolTargets' defaults are the settings'),
    in prefix mode (with the fallback to secondary IPs) or not; `groups` replaces any other settings
    group by its `Config` field (`pool=PoolSettings(release_delay_s=0.0)`: a group's own defaults
    but the values given)."""
    t = targets or PoolTargets()
    plain = Config()
    sizing = replace(
        plain.sizing,
        warm_eni_target=t.warm_eni_target,
        warm_ip_target=t.warm_ip_target,
        minimum_ip_target=t.minimum_ip_target,
        warm_prefix_target=t.warm_prefix_target,
        max_eni=t.max_eni,
        max_pods_override=t.max_pods,
        min_eni_lifetime_s=t.min_eni_lifetime_s,
        enable_prefix_delegation=prefix_mode,
        prefix_fallback_to_ips=fallback,
    )
    return replace(
        plain,
        storage=replace(plain.storage, state_dir=str(state_dir)),
        sizing=sizing,
        enis=replace(plain.enis, cluster_name=cluster_name),
        **groups,
    )
