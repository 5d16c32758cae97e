"""The daemon: its parts (`ipamd.node.engine_parts`) on the adapters `main` hands over, the host's
datapath, and its start-up.

Building reads this instance from IMDS and EC2 first, so that the state file opens with its final
settings (max pods and address capacity follow from the instance type's limits). Start-up order
(readiness follows it): bind the state file to this instance (a state file from another instance is
set aside) → read EC2 (drift: the inventory comes from EC2, never from IMDS; then the subnets' free
addresses, for the pool's scarcity mode) → the first runtime listing (it releases nothing yet: a
leak needs two misses) → ready. Afterwards the pool manager runs its own loop, and the reconcilers
run on the schedule of `ipamd.reconcile.jobs`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cloud.backoff import Backoff
from cloud.errors import CloudError
from cloud.ports import CallUrgency, Imds, Instance
from datastore.store import STATE_FILE_NAME
from ipamd.awsnode.checkpoint import CheckpointFile
from ipamd.awsnode.keeper import CheckpointKeeper
from ipamd.awsnode.takeover import Takeover
from ipamd.clock import Clock
from ipamd.config.eniconfig import EniConfig
from ipamd.config.settings import Config
from ipamd.engine.engine import Engine
from ipamd.errors import StoreWriteFailed, utc_text
from ipamd.hostnet.aws_snat import AwsNodeSnat
from ipamd.hostnet.datapath import Datapath
from ipamd.hostnet.ports import HostNetError, HostNetwork
from ipamd.hostnet.snat import SnatTable
from ipamd.node.engine_parts import (
    Ec2,
    EngineOpener,
    NodeFacts,
    OnParts,
    Parts,
    describe_node,
    open_parts,
    rebuild_drift,
)
from ipamd.node.family import family_of
from ipamd.reconcile.jobs import Job, Jobs
from ipamd.reconcile.rebuild import gather_claims, rebuild_state
from ipamd.reconcile.repair import apply_repair, plan_repair
from ipamd.runtime.ports import RuntimeApi, RuntimeUnavailable, SandboxAddresses

logger = logging.getLogger(__name__)

START_RETRY_CAP_S = 30.0
"""Longest wait between two tries of start-up's EC2 reads."""


@dataclass
class Daemon(OnParts):
    config: Config
    clock: Clock
    parts: Parts
    ec2: Ec2
    imds: Imds
    runtime: RuntimeApi
    addresses: SandboxAddresses
    datapath: Datapath | None = None
    """The host's datapath (IPAMD_HOST_NETWORK=on); None when ipamd only hands out addresses."""
    takeover: Takeover | None = None
    """Adopting the pods aws-node's checkpoint records, in start-up; None without a checkpoint."""
    keeper: CheckpointKeeper | None = None
    """ipamd's copy of that checkpoint, for a rollback to aws-node; None without a checkpoint."""
    jobs: Jobs = field(default_factory=Jobs)
    restart_wanted: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once repair rebuilt the state file: the daemon exits so its supervisor starts it afresh."""
    ready: bool = False
    not_ready: str = "starting"
    """Why the daemon is not ready ("" once it is): starting, the state file, or the last start-up
    attempt's error with when the next one is (`ipamctl status`)."""
    start_retry_cap_s: float = START_RETRY_CAP_S
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    rng: random.Random = field(default_factory=random.Random)

    def degraded(self) -> tuple[str, ...]:
        """What works less than it should while ready, one reason each (`/readyz` names them): the
        datapath's, a pool that cannot grow because EC2 refuses it for good, and an ENIConfig the
        node chose that cannot be used."""
        reasons = tuple(self.datapath.health.degraded()) if self.datapath is not None else ()
        pool = (self.pool.blocked_by(), self.pool.subnets.eni_config_problem)
        return (*reasons, *(reason for reason in pool if reason))

    async def start(self) -> None:
        """Bring the node to a state it can serve from; sets `ready`. EC2 answering badly or the
        state disk refusing a write (full, read-only) is waited out with backoff, not-ready
        meanwhile, rather than ending the process: a restart would only meet the same."""
        if self.engine.unavailable is not None:
            self.not_ready = f"the state file is unusable: {self.engine.unavailable}"
            logger.error("daemon.not_ready reason=%s", self.engine.unavailable)
            return
        self._warn_unreachable_targets()
        # Full jitter: a fleet restarted together does not retry together. One attempt per call
        # (the parts call EC2 through its background view): a throttled read waits here, where
        # the tries are spaced, not in the adapter's retries.
        backoff = Backoff(1.0, self.start_retry_cap_s, self.rng)
        for attempt in itertools.count(1):
            try:
                await self._start_once()
                return
            except (CloudError, StoreWriteFailed, HostNetError) as err:
                wait = backoff.delay_s(attempt)
                now = self.clock.now()
                self.not_ready = (
                    f"start-up attempt {attempt} failed at {utc_text(now)}: {err}; "
                    f"next attempt at {utc_text(now + wait)}"
                )
                logger.warning("daemon.start_failed error=%s retry_in_s=%.1f", err, wait)
                await self.sleep(wait)

    def _warn_unreachable_targets(self) -> None:
        """Say once, at start, when a warm target asks more than the node can ever hold: the pool
        stops at the node's max pods and at what its ENIs can carry, so the target is never met."""
        settings, targets = self.engine.settings, self.parts.targets
        limits = [b for b in (settings.max_pods, settings.max_addresses) if b is not None]
        bounds = self.parts.family.target_bounds(limits)
        if not bounds:
            return
        capacity = min(bounds)
        for name, value in (
            ("MINIMUM_IP_TARGET", targets.minimum_ip_target),
            ("WARM_IP_TARGET", targets.warm_ip_target),
        ):
            if value > capacity:
                logger.warning(
                    "config.target_exceeds_capacity %s=%d capacity=%d max_pods=%s "
                    "max_addresses=%s: the pool holds at most %d addresses on this node",
                    name,
                    value,
                    capacity,
                    settings.max_pods,
                    settings.max_addresses,
                    capacity,
                )

    async def _start_once(self) -> None:
        if await self.engine.claim_instance(self.instance_id):
            logger.warning("daemon.foreign_state set_aside=%d", len(self.engine.state.quarantine()))
        await self.drift.run_once()
        await self.pool.before_ready()  # IPv6 mode: the primary ENI's /80, from EC2 or assigned
        await self._read_subnets()
        try:
            await self.leak_gc.run_once()  # the first listing: a leak needs two misses
        except RuntimeUnavailable as err:
            # An unreachable runtime proves nothing and blocks nothing: ipamd serves without it.
            logger.warning("daemon.runtime_unreachable error=%s", err)
        if self.takeover is not None:
            # After EC2's inventory (an adopted address must be on a unit EC2 lists) and before
            # the datapath's first pass, which then gives the adopted pods ipamd's rules.
            await self.takeover.run()
        if self.keeper is not None:
            self.keeper.arm()  # only now: the takeover has read aws-node's file
        if self.datapath is not None:
            # Before ready (and so before the conflist): every live pod's rules are back, and none
            # of a pod gone while ipamd was down is left.
            await self.datapath.reconcile()
        self.ready, self.not_ready = True, ""
        logger.info("daemon.ready instance_id=%s", self.instance_id)

    def schedule(self) -> None:
        c = self.config
        self.jobs.add(Job("ec2_drift", self.drift.run_once, c.reconcile.ec2_interval_s, 5.0))
        self.jobs.add(Job("imds_hint", self.hint.run_once, c.reconcile.imds_hint_interval_s, 1.0))
        self.jobs.add(Job("leak_gc", self.leak_gc.run_once, c.runtime.leak_gc_interval_s, 5.0))
        if self.datapath is not None:
            self.jobs.add(
                Job("hostnet", self.datapath.reconcile, c.datapath.reconcile_interval_s, 1.0)
            )
        # A node whose pool makes no ENIs (IPv6) has none to leak, nor does a node provisioned by
        # someone else (VPC CNI turns ENI GC off in both cases too).
        makes_enis = self.parts.family.makes_enis
        if makes_enis and not (
            c.enis.disable_leaked_eni_cleanup or c.pool.disable_network_resource_provisioning
        ):
            self.jobs.add(Job("eni_gc", self.eni_gc.run_once, c.enis.gc_interval_s, 60.0))
        if self.parts.subnet_free is not None:
            reading = self.parts.subnet_free
            self.jobs.add(Job("subnet_free", reading.run_once, c.subnets.refresh_interval_s, 30.0))

    async def _read_subnets(self) -> None:
        """The first reading of the subnets' free addresses, so that scarcity is known from the
        first round; without it the pool plans as if the subnets had plenty, until the job reads."""
        if self.parts.subnet_free is None:
            return
        try:
            await self.parts.subnet_free.run_once()
        except CloudError as err:
            logger.warning("daemon.subnets_unread error=%s", err)

    async def drift_on_demand(self) -> None:
        """Run the EC2 check when the IMDS hint disagreed, instead of waiting for its period."""
        job = Job("ec2_drift_triggered", self.drift.run_once, 0.0)
        while True:
            await self.drift_wanted.wait()
            self.drift_wanted.clear()
            await self.jobs.run_now(job)

    async def close(self) -> None:
        """Stop the schedule and close the state; the adapters belong to `main`, which closes them."""
        self.jobs.shutdown()
        await self.engine.close()


@dataclass(frozen=True, slots=True)
class HostNetAdapters:
    """What the host's datapath runs on: the kernel's routing (netlink), its SNAT table (nftables),
    and where the VPC's CIDRs are read (IMDS, by the primary ENI's MAC)."""

    host: HostNetwork
    snat: SnatTable
    vpc_cidrs: Callable[[str], Awaitable[tuple[str, ...]]]
    aws_node_snat: AwsNodeSnat | None = None
    """Where aws-node's SNAT chains are found and removed once ipamd's table is live (None: not
    looked for)."""
    rp_filter: Callable[[str], int] | None = None
    """The reverse-path filtering a link applies (`ipamd.hostnet.sysctl.read_rp_filter`), checked
    on the primary link when ipamd marks inbound connections (None: not checked)."""


async def _describe_when_answered(
    ec2: Ec2, instance_id: str, rng: random.Random, sleep: Callable[[float], Awaitable[None]]
) -> NodeFacts:
    """The instance and its limits, waited for while EC2 answers with an error worth retrying
    (throttled, above all, when a cluster's nodes start together), as `Daemon.start` waits: one
    attempt per call and full-jitter backoff between tries, since a restart would meet the same and
    a saturated account admits as many reads however often the nodes ask. Any other error is
    raised (`CloudError`)."""
    backoff = Backoff(1.0, START_RETRY_CAP_S, rng)
    background = ec2.with_urgency(CallUrgency.BACKGROUND)
    for attempt in itertools.count(1):
        try:
            return await describe_node(background, instance_id)
        except CloudError as err:
            if not err.retryable:
                raise
            wait = backoff.delay_s(attempt)
            logger.warning("daemon.instance_unread error=%s retry_in_s=%.1f", err, wait)
            await sleep(wait)
    raise AssertionError("unreachable")


async def build_daemon(
    config: Config,
    *,
    ec2: Ec2,
    imds: Imds,
    runtime: RuntimeApi,
    addresses: SandboxAddresses,
    clock: Clock,
    open_engine: EngineOpener = Engine.open,
    rng: random.Random | None = None,
    hostnet: HostNetAdapters | None = None,
    checkpoint: CheckpointFile | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    eni_config: EniConfig | None = None,
) -> Daemon:
    """Read this instance from IMDS and EC2, open the state and build every part on the adapters
    `main` made; nothing runs until `start()` and the task group. (`open_engine` and `rng` let a
    simulation on virtual time build the same parts.) `checkpoint`: aws-node's checkpoint file, to
    take the node over from and keep for a rollback (None: neither). `eni_config`: custom
    networking's ENIConfig as the Kubernetes API gives it (None: the file's). Raises `CloudError` when EC2
    refuses this instance for good; an error worth retrying is waited out."""
    identity = await imds.identity()
    node = await _describe_when_answered(ec2, identity.instance_id, rng or random.Random(), sleep)
    parts = await open_parts(
        config,
        node,
        ec2=ec2,
        imds=imds,
        runtime=runtime,
        clock=clock,
        open_engine=open_engine,
        rng=rng,
        catalog=ec2,
        eni_config=eni_config,
    )
    datapath = (
        _datapath(
            config, parts.engine, ec2, node.instance, parts.pool.subnets.cidrs, hostnet, clock, rng
        )
        if hostnet is not None
        else None
    )
    return Daemon(
        config=config,
        clock=clock,
        parts=parts,
        ec2=ec2,
        imds=imds,
        runtime=runtime,
        addresses=addresses,
        datapath=datapath,
        takeover=None if checkpoint is None else Takeover(parts.engine, checkpoint, runtime),
        keeper=None if checkpoint is None else CheckpointKeeper(parts.engine, checkpoint),
        rng=rng or random.Random(),
    )


def _datapath(
    config: Config,
    engine: Engine,
    ec2: Ec2,
    instance: Instance,
    cidrs: Mapping[str, str],
    adapters: HostNetAdapters,
    clock: Clock,
    rng: random.Random | None,
) -> Datapath:
    """The datapath owner on the adapters `main` made. The primary ENI's MAC (to find its link and
    read the VPC's CIDRs) comes from the state, filled from EC2 by the first drift; a subnet's CIDR
    comes from `cidrs` (the subnet catalogue's) when it has it, else from DescribeSubnets, as
    background work (the datapath retries an ENI's set-up with a backoff of its own)."""
    catalog = ec2.with_urgency(CallUrgency.BACKGROUND)

    async def subnet_cidr(subnet_id: str) -> str:
        # From the subnet catalogue's view if it showed the subnet (a CIDR never changes).
        known = cidrs.get(subnet_id)
        return known if known is not None else (await catalog.subnet(subnet_id)).cidr

    return Datapath(
        engine,
        adapters.host,
        adapters.snat,
        config.datapath,
        mode=family_of(config).snat,
        node_ip=instance.private_ip,
        subnet_cidr=subnet_cidr,
        vpc_cidrs=adapters.vpc_cidrs,
        clock=clock,
        rng=rng,
        aws_node_snat=adapters.aws_node_snat,
        rp_filter=adapters.rp_filter,
    )


async def repair(daemon: Daemon, apply: bool) -> dict[str, object]:
    """`ipamctl repair`: EC2's view first (drift), then the runtime's sandboxes; a dry run unless
    `apply`. Raises `RuntimeUnavailable` — without the runtime's list nothing can be judged dead.
    With an unusable state file, repair is a rebuild (`ipamd.reconcile.rebuild`)."""
    if daemon.engine.unavailable is not None:
        return await _rebuild(daemon, apply)
    await daemon.drift.run_once()
    sandboxes = await daemon.runtime.list_sandboxes()
    plan = plan_repair(
        daemon.engine.state, frozenset(s.sandbox_id for s in sandboxes), daemon.clock.now()
    )
    if apply and not plan.is_empty():
        await apply_repair(daemon.engine, plan)
    return {"applied": apply and not plan.is_empty(), "actions": plan.describe()}


async def _rebuild(daemon: Daemon, apply: bool) -> dict[str, object]:
    path = Path(daemon.config.storage.state_dir) / STATE_FILE_NAME
    plan = await gather_claims(daemon.runtime, daemon.addresses)
    actions = [str(daemon.engine.unavailable), *plan.describe(path)]
    if not apply:
        return {"applied": False, "actions": actions}

    async def open_engine(p: Path) -> Engine:
        engine = await Engine.open(p, daemon.clock, daemon.engine.settings)
        await engine.claim_instance(daemon.instance_id)
        return engine

    async def read_ec2(engine: Engine) -> None:
        drift = rebuild_drift(engine, daemon.ec2, daemon.instance_id, daemon.kinds, daemon.clock)
        await drift.run_once()

    aside, unfixable = await rebuild_state(path, plan, open_engine, read_ec2, daemon.clock)
    daemon.restart_wanted.set()
    return {
        "applied": True,
        "actions": [
            *actions,
            f"the unusable file was kept as {aside}",
            *(f"cannot fix: {u}" for u in unfixable),
            "ipamd exits to be restarted on the new state file",
        ],
    }
