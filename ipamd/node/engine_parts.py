"""The daemon's parts, wired once, from the configuration, the instance EC2 describes and the adapters.

`open_parts` computes the engine's settings from the configuration and the instance type's limits
(the IP cooldown and delete-intent lifetime, max pods, the node's address capacity) before the state
file is opened, so they are final the moment the engine exists: nothing patches them afterwards. With
custom networking it first finds the ENIConfig of the node's zone (`node_eni_config`); a file without
one is a start-up error, before anything is opened. On that one engine it builds the pool manager
(IPv6 mode's, `ipamd.pool.ipv6`, with ENABLE_IPv6), the EC2 drift, the IMDS hint, the runtime leak GC and ENI
GC, and what the pool's scarcity mode reads of the subnets' free addresses (`subnet_reading`); the
ENIs the pool manager is creating or attaching (`pending_enis`) are the same set the drift
and ENI GC leave alone. The reconcilers and the subnet catalogue's reads call EC2 through the
adapter's background view (`CallUrgency.BACKGROUND`: no pod waits on them, so a throttled call is
not retried); the pool manager picks a view per round.

`ipamd.daemon.build_daemon` uses it, and so does every test, benchmark and simulation that runs a
node's parts. A variant is asked for through the inputs — configuration values, the clock, the
adapters, the engine opener (a store with faults, an engine on the loop's thread, finer engine
settings), the pool manager's settings — never by building a part by hand.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cloud.ports import CallUrgency, Ec2Api, Ec2Catalog, Imds, Instance
from datastore.records import UnitKind
from datastore.store import STATE_FILE_NAME
from ipamd.clock import Clock
from ipamd.config.eniconfig import DEFAULT_ENICONFIG_KEY, ZONE_LABELS, EniConfig
from ipamd.config.settings import Config
from ipamd.engine.allocator import EngineParams
from ipamd.engine.engine import Engine
from ipamd.errors import SettingUnusable
from ipamd.node.family import Family, family_of
from ipamd.pool.params import PoolParams
from ipamd.pool.rounds import Pool
from ipamd.pool.subnet_catalogue import SubnetCatalogue, SubnetSource
from ipamd.reconcile.ec2_drift import Ec2Drift
from ipamd.reconcile.eni_gc import EniGc
from ipamd.reconcile.imds_hint import ImdsHint
from ipamd.reconcile.leaks import LeakGc
from ipamd.reconcile.subnet_free import SubnetFree, read_subnets
from ipamd.runtime.ports import RuntimeApi
from ipamd.sizing.inputs import NodeLimits, PoolTargets
from ipamd.sizing.modes import SECONDARY_IPS, UnitStrategy, strategy_for
from ipamd.sizing.plan import compute_address_capacity, compute_pod_limit, enis_for_pods


class Ec2(Ec2Api, Ec2Catalog, Protocol):
    """Both EC2 ports, as one adapter serves them."""

    def with_urgency(self, urgency: CallUrgency) -> Ec2: ...


EngineOpener = Callable[[Path, Clock, EngineParams], Awaitable[Engine]]


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What start-up reads of this instance before anything is built: EC2's description of it and
    its instance type's limits."""

    instance: Instance
    limits: NodeLimits


async def describe_node(ec2: Ec2Catalog, instance_id: str) -> NodeFacts:
    """The instance and its type's limits, from EC2. Raises `CloudError`."""
    instance = await ec2.describe_instance(instance_id)
    raw = await ec2.instance_limits(instance.instance_type)
    limits = NodeLimits(
        max_enis=raw.max_enis,
        units_per_eni=raw.units_per_eni,
        vcpus=raw.vcpus,
        nitro=raw.hypervisor == "nitro",
    )
    return NodeFacts(instance, limits)


def strategy(config: Config) -> UnitStrategy:
    """The unit the pool grows by: /28 prefixes or secondary IPs (ENABLE_PREFIX_DELEGATION)."""
    return strategy_for(config.sizing.enable_prefix_delegation)


def fallback_strategy(config: Config) -> UnitStrategy | None:
    """Prefix mode with IPAMD_PREFIX_FALLBACK_TO_IPS: secondary IPs when no /28 is left."""
    prefix_mode = strategy(config).kind == "prefix"
    return SECONDARY_IPS if config.sizing.prefix_fallback_to_ips and prefix_mode else None


def unit_kinds(config: Config) -> tuple[UnitKind, ...]:
    """The kinds of unit the node may hold, the one it grows by first (IPv6 mode: its /80)."""
    fallback = fallback_strategy(config)
    mode_kinds = (strategy(config).kind,) + ((fallback.kind,) if fallback else ())
    return family_of(config).unit_kinds(mode_kinds)


def engine_params(config: Config, limits: NodeLimits) -> EngineParams:
    """The engine's settings, final: the configuration's, with the pod and address limits the
    pool's targets leave on this instance type."""
    targets, unit, family = pool_targets(config), strategy(config), family_of(config)
    max_pods = compute_pod_limit(targets, limits, unit, family.name)
    enis_hold = compute_address_capacity(targets, limits, unit)
    return EngineParams(
        cooldown_s=float(config.engine.ip_cooldown_period_s),
        intent_ttl_s=config.engine.delete_intent_ttl_s,
        max_pods=max_pods,
        max_addresses=family.address_capacity(max_pods, enis_hold),
        pods_on_primary=not config.custom_networking.enabled,
        pick=family.pick,
    )


def node_eni_config(config: Config, node: NodeFacts) -> EniConfig | None:
    """With custom networking, the ENIConfig named after the node's zone, which gives new ENIs
    their subnet and security groups; None without. Raises `SettingUnusable` when the file has
    none for the zone, or when no ENI is left for pods besides the primary."""
    if not config.custom_networking.enabled:
        return None
    file, zone = config.custom_networking.eni_config_file, node.instance.availability_zone
    if file is None:
        raise SettingUnusable(
            "AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG=true: no ENIConfig could be read from the "
            "Kubernetes API, and there is no IPAMD_ENI_CONFIG_FILE"
        )
    by_name = [
        f"{env}={value!r}"
        for env, value, default in (
            (
                "ENI_CONFIG_LABEL_DEF",
                config.custom_networking.eni_config_label,
                (DEFAULT_ENICONFIG_KEY, *ZONE_LABELS),
            ),
            (
                "ENI_CONFIG_ANNOTATION_DEF",
                config.custom_networking.eni_config_annotation,
                (DEFAULT_ENICONFIG_KEY,),
            ),
        )
        if value not in default
    ]
    if by_name:
        # The file is keyed by zone: a node label or annotation needs the API to be read.
        raise SettingUnusable(
            f"{', '.join(by_name)}: the node's labels and annotations are read from the Kubernetes "
            "API only (IPAMD_KUBERNETES); from IPAMD_ENI_CONFIG_FILE the node's ENIConfig is the "
            "one named after its zone"
        )
    path = file.path if file else ""
    spec = file.find(zone) if file and zone else None
    if spec is None:
        names = ", ".join(file.names) if file else ""
        raise SettingUnusable(
            f"IPAMD_ENI_CONFIG_FILE={path!r} has no ENIConfig for this node's zone {zone!r} "
            f"(it has {names}): custom networking needs one per zone, named after it (without "
            "the Kubernetes API, a node's ENIConfig is the file's entry for its zone)"
        )
    if enis_for_pods(pool_targets(config), node.limits) == 0:
        raise SettingUnusable(
            "AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG=true leaves no ENI for pods: the primary carries "
            f"none, and this node may have only one (MAX_ENI={config.sizing.max_eni}, "
            f"{node.instance.instance_type} takes {node.limits.max_enis})"
        )
    return spec


def pool_params(config: Config) -> PoolParams:
    """The pool manager's parameters: its groups as they are, with the targets and unit strategy
    the sizing group and the family decide (where new ENIs go is the subnet catalogue's)."""
    return PoolParams(
        targets=pool_targets(config),
        strategy=strategy(config),
        fallback_strategy=fallback_strategy(config),
        pool=config.pool,
        subnets=config.subnets,
        enis=config.enis,
        release_grace_s=config.reconcile.grace_s,
    )


def pool_targets(config: Config) -> PoolTargets:
    """The pool's knobs, as the configuration sets them (the pods on their way come later, from
    the pool manager: `PoolManager.targets`)."""
    kubelet = config.sizing.kubelet_config
    return PoolTargets(
        warm_eni_target=config.sizing.warm_eni_target,
        warm_ip_target=config.sizing.warm_ip_target,
        minimum_ip_target=config.sizing.minimum_ip_target,
        warm_prefix_target=config.sizing.warm_prefix_target,
        max_eni=config.sizing.max_eni,
        max_pods=config.sizing.max_pods_override,
        kubelet_max_pods=kubelet.max_pods if kubelet else None,
        min_eni_lifetime_s=config.sizing.min_eni_lifetime_s,
        custom_networking=config.custom_networking.enabled,
    )


@dataclass(frozen=True, slots=True)
class Parts:
    """A node's parts, all on one engine. Nothing runs until a caller runs them."""

    engine: Engine
    pool: Pool
    drift: Ec2Drift
    hint: ImdsHint
    leak_gc: LeakGc
    eni_gc: EniGc
    pending_enis: set[str]
    """ENIs the pool manager created and has not brought into the inventory yet: the drift leaves
    them to it, ENI GC never deletes them (the pool manager's own set)."""
    node: NodeFacts
    targets: PoolTargets
    """The pool's targets (WARM_*_TARGET, MINIMUM_IP_TARGET, MAX_ENI, ...), as configured."""
    kinds: tuple[UnitKind, ...]
    drift_wanted: asyncio.Event
    """Set by the IMDS hint when IMDS disagrees: an EC2 drift check is due now."""
    family: Family
    """The node's address family, as the settings chose it once."""
    subnet_free: SubnetFree | None = None
    """The reading of the free addresses in the node's subnets, for the pool's scarcity mode; None
    when the mode is off (IPAMD_SUBNET_SCARCITY_THRESHOLD=0) or no EC2 catalog was given."""


class OnParts:
    """What a node built on `Parts` shows of them, declared once: the daemon (`ipamd.node.daemon`)
    and the test node (`ipamd.node.cloud_node`) each hold their `parts` and read them through these."""

    parts: Parts

    @property
    def engine(self) -> Engine:
        return self.parts.engine

    @property
    def pool(self) -> Pool:
        return self.parts.pool

    @property
    def drift(self) -> Ec2Drift:
        """The EC2 drift reconcile."""
        return self.parts.drift

    @property
    def hint(self) -> ImdsHint:
        return self.parts.hint

    @property
    def leak_gc(self) -> LeakGc:
        return self.parts.leak_gc

    @property
    def eni_gc(self) -> EniGc:
        return self.parts.eni_gc

    @property
    def drift_wanted(self) -> asyncio.Event:
        return self.parts.drift_wanted

    @property
    def instance_id(self) -> str:
        return self.parts.node.instance.instance_id

    @property
    def node_ip(self) -> str:
        return self.parts.node.instance.private_ip

    @property
    def kinds(self) -> tuple[UnitKind, ...]:
        return self.parts.kinds


async def open_parts(
    config: Config,
    node: NodeFacts,
    *,
    ec2: Ec2Api,
    imds: Imds,
    runtime: RuntimeApi,
    clock: Clock,
    open_engine: EngineOpener = Engine.open,
    rng: random.Random | None = None,
    pool_config: PoolParams | None = None,
    eni_config: EniConfig | None = None,
    subnets: SubnetSource | None = None,
    catalog: Ec2Catalog | None = None,
) -> Parts:
    """Open the state file in IPAMD_STATE_DIR with its final settings and build every part on it.

    `pool_config`: the pool manager's settings; by default `pool_params(config)`'s. `eni_config`: this
    zone's ENIConfig under custom networking; by default the one the configuration's ENIConfig file
    has for the node's zone. `subnets`: where subnet discovery reads
    the zone's subnets; by default `ec2` when it serves that call too (a pure `Ec2Api` that does not
    leaves new ENIs in the node's subnet). `catalog`: where scarcity mode reads the free addresses
    of the subnet new ENIs go to when discovery does not read them; None: not then. Raises
    `SettingUnusable` (before opening anything) when custom networking has no ENIConfig for the
    node's zone."""
    if eni_config is None:
        eni_config = node_eni_config(config, node)
    path = Path(config.storage.state_dir) / STATE_FILE_NAME
    engine = await open_engine(path, clock, engine_params(config, node.limits))
    instance_id = node.instance.instance_id
    kinds = unit_kinds(config)
    source = subnets
    if source is None and isinstance(ec2, SubnetSource):
        # Background work: nothing waits on the view (the last one, or the node's subnet, serves
        # meanwhile), so a throttled read is not retried in the adapter; the catalogue waits
        # longer after each failure in a row instead.
        view = ec2.with_urgency(CallUrgency.BACKGROUND)
        source = view if isinstance(view, SubnetSource) else ec2
    # Where new ENIs go: the ENIConfig's subnet (custom networking), else subnet discovery
    # (ENABLE_SUBNET_DISCOVERY) or the node's subnet.
    catalogue = SubnetCatalogue(
        source,
        node.instance,
        config.subnets,
        clock,
        cluster_name=config.enis.cluster_name,
        eni_config=eni_config,
    )
    settings = pool_params(config) if pool_config is None else pool_config
    subnet_free = subnet_reading(config, catalogue, catalog, clock)
    free = catalogue.free_addresses if subnet_free is None else subnet_free.free
    family = family_of(config)
    pool = family.pool(
        engine, ec2, node.instance, node.limits, settings, catalogue, clock, rng, subnet_free=free
    )
    pending, foreign = pool.pending_enis, pool.foreign_enis
    background = ec2.with_urgency(CallUrgency.BACKGROUND)
    drift = Ec2Drift(
        engine,
        background,
        instance_id,
        kinds,
        config.reconcile.grace_s,
        clock,
        lambda: pool.releases_in_flight | pending | pool.unbound_enis,
        foreign,
        pool.new_enis,
    )
    drift_wanted = asyncio.Event()
    hint = ImdsHint(
        lambda: engine.state,
        imds,
        kinds,
        config.reconcile.grace_s,
        clock,
        drift_wanted.set,
        foreign=foreign,
    )
    eni_gc = EniGc(
        background,
        instance_id,
        config.enis.gc_grace_s,
        clock,
        lambda: pending | set(engine.state.enis()),
        cluster_name=config.enis.cluster_name,
    )
    return Parts(
        engine=engine,
        pool=pool,
        drift=drift,
        hint=hint,
        leak_gc=LeakGc(engine, runtime, config.runtime.leak_grace_s, clock),
        eni_gc=eni_gc,
        pending_enis=pending,
        node=node,
        targets=pool_targets(config),
        kinds=kinds,
        drift_wanted=drift_wanted,
        family=family,
        subnet_free=subnet_free,
    )


def subnet_reading(
    config: Config, catalogue: SubnetCatalogue, catalog: Ec2Catalog | None, clock: Clock
) -> SubnetFree | None:
    """A reading of its own of the free addresses in the subnets new ENIs go to (the ENIConfig's, or
    the node's), for scarcity mode when subnet discovery does not read them; None when discovery
    does (the catalogue's view has them), the mode is off, or there is no catalog to read."""
    if catalogue.discovering or catalog is None or config.subnets.scarcity_threshold <= 0:
        return None
    background = catalog.with_urgency(CallUrgency.BACKGROUND)
    return SubnetFree(read_subnets(background, catalogue.candidates), clock)


def rebuild_drift(
    engine: Engine, ec2: Ec2Api, instance_id: str, kinds: tuple[UnitKind, ...], clock: Clock
) -> Ec2Drift:
    """The drift that fills a state file being rebuilt (`ipamd.reconcile.rebuild`): EC2's word on
    every unit at once — no grace window, since nothing in the new file is a recent change of
    ipamd's — and nothing in flight, since no pool manager runs meanwhile."""
    return Ec2Drift(engine, ec2, instance_id, kinds, 0.0, clock)
