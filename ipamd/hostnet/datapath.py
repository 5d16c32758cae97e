"""The host-network owner: keeps the node's kernel what ipamd's durable state implies.

What it owns (the shapes are in `ipamd.hostnet.kernel_plan`): each secondary ENI's link and route table,
each pod address's policy rules, and the SNAT table. Everything is derived from the engine's state
(ENIs with their MAC and primary address, allocations) and reconciled by content; the kernel holds no
fact ipamd needs to remember.

Ordering, which is what makes an address safe to hand out:
- An ENI enters blocked (`Engine.block_eni`, from a commit listener in the very commit that brings
  the ENI in), so the allocator skips its addresses until its link is set up. A link the
  kernel does not show yet is retried with backoff; the ENI stays blocked meanwhile.
- ADD (`add`): the allocation commits, then its rules are installed, then the answer goes out. If the
  rules cannot be installed, the allocation is retracted (no intent, no cooldown: no pod ever used
  it) and ADD fails with the retryable `datapath_unavailable`; the runtime's retry starts clean.
- Every removal of an allocation (DEL, leak GC, CNI GC, repair) reaches a commit listener, which
  queues its addresses; DEL also waits for its own. A removal that fails is left to the periodic
  reconcile, which also catches anything changed behind ipamd's back.
- The periodic reconcile lists ipamd's rules and routes (its own protocol number only) and makes
  them exactly the plan. A listing that fails proves nothing: that round deletes nothing.
- Taking over from aws-node (`ipamd.hostnet.aws_node_rules`): in the same round, once ipamd's rules are
  in, VPC CNI's twins go; its ENI tables' routes are replaced in place; its SNAT chains go once
  ipamd's table is live.

All kernel changes run under one lock, and each decides from the state as it is at that moment, so
a DEL racing an ADD of the same address (or a reconcile round) cannot leave the other's rule behind.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from cloud.backoff import backoff_delay_s
from cloud.errors import CloudError
from datastore.records import AllocationKey, AllocationRecord, EniRecord, Mutation
from ipamd.clock import Clock
from ipamd.config.groups import DatapathSettings
from ipamd.engine.engine import Engine
from ipamd.errors import DatapathUnavailable
from ipamd.hostnet.aws_node_rules import AwsNodeRules
from ipamd.hostnet.aws_snat import AwsNodeSnat
from ipamd.hostnet.kernel_plan import (
    KernelDiff,
    KernelPlanner,
    ReadyEni,
    diff_kernel,
    eni_routes,
    eni_rule,
    prefix_length,
)
from ipamd.hostnet.ports import EniLink, HostNetError, HostNetwork, LinkNotFound
from ipamd.hostnet.snat import SnatPlan, SnatTable
from ipamd.hostnet.snat_modes import VPC_SNAT, SnatLinks, SnatMode
from ipamd.hostnet.sysctl import STRICT
from ipamd.model import PodRef

logger = logging.getLogger(__name__)

BLOCKED_NEW = "link not set up yet"


RETRY_BASE_S = 1.0
RETRY_CAP_S = 30.0
"""An ENI whose link could not be set up is tried again after a backoff between these."""


@dataclass(slots=True)
class DatapathHealth:
    """What the owner has done, for metrics and introspection."""

    fixes: Counter[str] = field(default_factory=Counter)
    """Reconcile's repairs by kind: rule_added, rule_removed, route_added, route_removed, snat."""
    reconciles: Counter[str] = field(default_factory=Counter)
    """Reconcile rounds by outcome: ok, unreadable, failed."""
    add_failures: int = 0
    takeover_failures: Counter[str] = field(default_factory=Counter)
    """Takeover steps from aws-node that failed (retried by the next reconcile), by step:
    unreadable, rules, snat."""
    rp_filter_strict: str = ""
    """The primary link's name while its reverse-path filtering is strict and ipamd marks inbound
    connections (NodePort and hostPort replies from pods on secondary ENIs are then dropped); ""
    otherwise."""

    def degraded(self) -> tuple[str, ...]:
        """What works less than it should on this node, one sentence each (`/readyz`)."""
        if not self.rp_filter_strict:
            return ()
        name = self.rp_filter_strict
        return (
            f"reverse-path filtering is strict on the primary interface {name} (rp_filter 1): "
            "NodePort, hostPort and load-balancer connections to pods on secondary ENIs are "
            f"dropped; set net.ipv4.conf.{name}.rp_filter=2 (loose), as ipamd's host-sysctls "
            "init container does",
        )


@dataclass(slots=True)
class _Pending:
    attempts: int = 0
    next_try: float = 0.0


class Datapath:
    def __init__(
        self,
        engine: Engine,
        host: HostNetwork,
        snat: SnatTable,
        settings: DatapathSettings,
        *,
        mode: SnatMode = VPC_SNAT,
        node_ip: str,
        subnet_cidr: Callable[[str], Awaitable[str]],
        vpc_cidrs: Callable[[str], Awaitable[tuple[str, ...]]],
        clock: Clock,
        rng: random.Random | None = None,
        aws_node_snat: AwsNodeSnat | None = None,
        rp_filter: Callable[[str], int] | None = None,
    ) -> None:
        self._engine = engine
        self._rp_filter = rp_filter
        self._host = host
        self._snat = snat
        self.settings = settings
        self.mode = mode
        """What the SNAT table does for the node's family (`ipamd/hostnet/snat_modes.py`): IPv4's
        marks and SNAT out of the VPC, or IPv6's SNAT of its pods' IPv4 egress range alone, to
        which the external SNAT, exclusion and node port settings do not apply."""
        self._node_ip = node_ip
        self._subnet_cidr = subnet_cidr
        self._vpc_cidrs = vpc_cidrs
        self._clock = clock
        self._rng = rng or random.Random()
        self._lock = asyncio.Lock()
        self._ready: dict[str, ReadyEni] = {}
        self._planner = KernelPlanner()
        self._pending: dict[str, _Pending] = {}
        self._dirty: dict[str, AllocationRecord] = {}
        """Address → the allocation that owned it, for removals not yet done."""
        self._gone_enis: dict[str, EniRecord] = {}
        self._adding: dict[AllocationKey, tuple[asyncio.Lock, int]] = {}
        self._snat_stale = True
        self._subnets: dict[str, str] = {}
        self._wanted = asyncio.Event()
        self.health = DatapathHealth()
        self._takeover = AwsNodeRules(
            host, aws_node_snat, self.health.fixes, self.health.takeover_failures
        )
        for eni in engine.state.enis().values():
            self._block(eni)
        engine.subscribe(self._on_commit)

    # -- ADD and DEL ----------------------------------------------------------------------------

    async def add(self, key: AllocationKey, pod: PodRef | None) -> AllocationRecord:
        """ADD: the allocation, with its rules in the kernel before it is returned. ADDs of one
        key are serialized, so a retract can never undo an allocation another ADD acknowledged."""
        lock, users = self._adding.get(key, (asyncio.Lock(), 0))
        self._adding[key] = (lock, users + 1)
        try:
            async with lock:
                return await self._add(key, pod)
        finally:
            lock, users = self._adding[key]
            if users == 1:
                del self._adding[key]
            else:
                self._adding[key] = (lock, users - 1)

    async def _add(self, key: AllocationKey, pod: PodRef | None) -> AllocationRecord:
        record = await self._engine.assign(key, pod)
        try:
            await self._install(record)
        except HostNetError as err:
            self.health.add_failures += 1
            await self._engine.retract(record)
            logger.warning("hostnet.add_failed container_id=%s error=%s", key.container_id, err)
            raise DatapathUnavailable(f"the pod's routing could not be set up: {err}") from err
        return record

    async def release(self, key: AllocationKey) -> tuple[AllocationRecord, ...]:
        """DEL: release, then remove the released addresses' rules (a failure is left to the
        reconcile: the DEL itself has happened)."""
        released = await self._engine.release(key)
        if released:
            await self.settle()
        return released

    async def _install(self, record: AllocationRecord) -> None:
        async with self._lock:
            if self._engine.state.allocation(record.key) != record:
                return  # released meanwhile: its removal owns the address now
            eni = self._engine.state.eni(record.eni_id)
            rules_of = self.mode.pod_rules
            rules = [r for a in record.addresses for r in rules_of(a, eni)]
            await self._host.add_rules(rules)

    # -- changes the engine committed -------------------------------------------------------------

    def _on_commit(self, mutation: Mutation, removed: tuple[AllocationRecord, ...]) -> None:
        for eni in mutation.put_enis:
            if eni.eni_id not in self._ready and not eni.is_primary:
                self._block(eni)
                # New facts (an attach, or the MAC a version-1 record lacked): try at once.
                self._pending[eni.eni_id] = _Pending()
        for eni_id in mutation.delete_enis:
            self._engine.unblock_eni(eni_id)
            self._pending.pop(eni_id, None)
            ready = self._ready.pop(eni_id, None)
            if ready is not None:
                self._gone_enis[eni_id] = ready.record
        for record in removed:
            for address in record.addresses:
                self._dirty[address] = record
        if removed or mutation.put_enis or mutation.delete_enis:
            self._wanted.set()

    def _block(self, eni: EniRecord) -> None:
        if eni.is_primary:
            return  # main table, set up with the instance
        self._engine.block_eni(eni.eni_id, BLOCKED_NEW)
        self._pending.setdefault(eni.eni_id, _Pending())

    async def settle(self) -> None:
        """Remove the rules of released addresses and undo detached ENIs, now."""
        async with self._lock:
            dirty, self._dirty = self._dirty, {}
            gone, self._gone_enis = self._gone_enis, {}
            state = self._engine.state
            stale = [
                rule
                for address, record in dirty.items()
                if state.owner_of(address) is None
                for rule in self.mode.pod_rules(address, state.eni(record.eni_id))
            ]
            try:
                if stale:
                    await self._host.delete_rules(stale)
                for eni in gone.values():
                    await self._host.delete_rules([eni_rule(eni)])
            except HostNetError as err:
                logger.warning("hostnet.remove_failed error=%s (the reconcile retries)", err)

    # -- ENI links ----------------------------------------------------------------------------------

    async def setup_enis(self, *, force: bool = False) -> None:
        """Set up every blocked ENI whose retry is due (every secondary ENI with `force`)."""
        now = self._clock.now()
        state = self._engine.state
        for eni in sorted(state.enis().values(), key=lambda e: e.device_index):
            if eni.is_primary:
                continue
            pending = self._pending.get(eni.eni_id)
            if pending is None and not force:
                continue
            if pending is not None and pending.next_try > now and not force:
                continue
            await self._setup_eni(eni)

    async def _setup_eni(self, eni: EniRecord) -> None:
        try:
            if not eni.mac or not eni.primary_ip:
                raise LinkNotFound("its MAC and primary address are not known yet (EC2 is read)")
            subnet = await self._subnet(eni.subnet_id)
            link = EniLink(
                eni.eni_id,
                eni.mac,
                eni.primary_ip,
                prefix_length(subnet),
                subnet,
                self.settings.eni_mtu,
            )
            async with self._lock:
                if eni.eni_id not in self._engine.state.enis():
                    return  # detached meanwhile
                ifname = await self._host.prepare_link(link)
                await self._host.add_routes(eni_routes(eni, ifname, subnet))
                await self._host.add_rules([eni_rule(eni)])
        except (HostNetError, CloudError) as err:
            self._retry_later(eni, err)
            return
        if eni.eni_id not in self._ready:
            self._snat_stale = True  # the new link is an ENI's: traffic from it is not a pod's
        self._ready[eni.eni_id] = ReadyEni(eni, ifname, subnet)
        self._pending.pop(eni.eni_id, None)
        if self._engine.unblock_eni(eni.eni_id):
            logger.info("hostnet.eni_ready eni_id=%s ifname=%s", eni.eni_id, ifname)

    async def _subnet(self, subnet_id: str) -> str:
        # A subnet's CIDR never changes: one lookup (DescribeSubnets) per subnet for the process.
        if subnet_id not in self._subnets:
            self._subnets[subnet_id] = await self._subnet_cidr(subnet_id)
        return self._subnets[subnet_id]

    def _retry_later(self, eni: EniRecord, err: Exception) -> None:
        pending = self._pending.setdefault(eni.eni_id, _Pending())
        pending.attempts += 1
        delay = backoff_delay_s(pending.attempts, RETRY_BASE_S, RETRY_CAP_S, self._rng, floor=0.5)
        pending.next_try = self._clock.now() + delay
        if eni.eni_id in self._ready:
            return  # set up before; a failed refresh does not take its addresses away
        self._engine.block_eni(eni.eni_id, str(err))
        logger.warning(
            "hostnet.eni_blocked eni_id=%s mac=%s reason=%s retry_in_s=%.1f",
            eni.eni_id,
            eni.mac,
            err,
            delay,
        )

    # -- the loop and the reconcile -----------------------------------------------------------------

    async def run(self) -> None:
        """Set up ENIs as they arrive (retrying those whose link is missing) and remove released
        addresses' rules as they go; until cancelled."""
        while True:
            self._wanted.clear()
            await self.setup_enis()
            await self.settle()
            if self._snat_stale:
                try:
                    await self._reconcile_snat()
                except HostNetError as err:
                    logger.warning("hostnet.snat_failed error=%s (the reconcile retries)", err)
            due = [p.next_try for p in self._pending.values()]
            delay = max(0.05, min(due) - self._clock.now()) if due else None
            try:
                async with asyncio.timeout(delay):
                    await self._wanted.wait()
            except TimeoutError:
                pass

    async def reconcile(self) -> KernelDiff:
        """Make ipamd's rules, routes and SNAT table exactly what the state implies. Raises
        `HostNetError` when the kernel cannot be read (nothing is deleted then)."""
        await self.setup_enis(force=True)
        await self.settle()
        try:
            async with self._lock:
                diff = await self._reconcile_kernel()
            if await self._reconcile_snat():
                await self._takeover.snat(inbound=self.inbound_marked)
        except HostNetError as err:
            self.health.reconciles["failed"] += 1
            logger.warning("hostnet.reconcile_failed error=%s (nothing deleted)", err)
            raise
        self.health.reconciles["ok"] += 1
        return diff

    async def _reconcile_kernel(self) -> KernelDiff:
        state = self._engine.state
        rules = await self._host.list_rules()
        routes = await self._host.list_routes()
        foreign = await self._takeover.read()
        ready = tuple(r for r in self._ready.values() if r.record.eni_id in state.enis())
        plan = self._planner.plan(state, ready, self.marks_connections, self.mode.pod_rules)
        diff = diff_kernel(plan, rules, routes)
        if not diff.is_empty():
            await self._apply(diff)
        if foreign is not None:
            # ipamd's rules and routes are the plan now: VPC CNI's twins can go.
            await self._takeover.replace(plan, diff.add_routes, foreign, state)
        return diff

    async def _apply(self, diff: KernelDiff) -> None:
        await self._host.delete_rules(diff.delete_rules)
        await self._host.delete_routes(diff.delete_routes)
        await self._host.add_routes(diff.add_routes)
        await self._host.add_rules(diff.add_rules)
        fixes = {
            "rule_added": len(diff.add_rules),
            "rule_removed": len(diff.delete_rules),
            "route_added": len(diff.add_routes),
            "route_removed": len(diff.delete_routes),
        }
        self.health.fixes.update({k: v for k, v in fixes.items() if v})
        logger.warning("hostnet.reconciled %s", " ".join(f"{k}={v}" for k, v in fixes.items()))
        for rule in sorted(diff.delete_rules | diff.add_rules):
            logger.info("hostnet.fixed rule=%s", rule)

    @property
    def marks_connections(self) -> bool:
        """Whether ipamd's table marks connections (IPv4 mode: pods' traffic leaving the VPC
        without external SNAT, or inbound connections to the node with node port support): the
        connmark rule is then part of the kernel plan."""
        return self.mode.marks_connections(self.settings)

    @property
    def inbound_marked(self) -> bool:
        """Whether ipamd's table marks inbound connections to the node (IPv4 mode with
        AWS_VPC_CNI_NODE_PORT_SUPPORT)."""
        return self.mode.inbound_marked(self.settings)

    async def _reconcile_snat(self) -> bool:
        """True once the table is what the settings say: ipamd's table live, or (in IPv4 mode
        with external SNAT and without node port support) absent."""
        self._snat_stale = False
        s = self.settings
        if not self.mode.keeps_table(s):
            if await self._snat.remove():
                self.health.fixes["snat"] += 1
            return True
        plan = await self.snat_plan()
        if plan is None:
            self._snat_stale = True
            return False
        if await self._snat.apply(plan):
            self.health.fixes["snat"] += 1
            logger.info(
                "hostnet.snat_applied primary=%s exempt=%s", plan.primary_ip, plan.exempt_cidrs
            )
        if plan.node_port:
            self._check_rp_filter(plan.primary_ifname)
        return True

    def _check_rp_filter(self, ifname: str) -> None:
        """Whether the primary link's reverse-path filter lets inbound connections reach pods on
        secondary ENIs (`ipamd.hostnet.sysctl`); said once per change, kept in `health`."""
        if self._rp_filter is None:
            return
        try:
            strict = self._rp_filter(ifname) == STRICT
        except HostNetError as err:
            logger.warning("hostnet.rp_filter_unreadable ifname=%s error=%s", ifname, err)
            return
        was, self.health.rp_filter_strict = self.health.rp_filter_strict, ifname if strict else ""
        if strict and not was:
            logger.warning("hostnet.rp_filter_strict %s", self.health.degraded()[0])
        elif was and not strict:
            logger.info("hostnet.rp_filter_loose ifname=%s", ifname)

    async def snat_plan(self) -> SnatPlan | None:
        """The SNAT table for the links set up now; None until the primary link is found."""
        mac = next((e.mac for e in self._engine.state.enis().values() if e.is_primary), "")
        primary = (await self._host.link_names()).get(mac) if mac else None
        if primary is None:
            logger.warning("hostnet.snat_waiting reason=no link with the primary ENI's MAC %r", mac)
            return None
        s = self.settings

        async def exempt() -> tuple[str, ...]:
            try:
                vpc = await self._vpc_cidrs(mac)
            except CloudError as err:
                raise HostNetError(f"the VPC's CIDRs could not be read: {err}") from err
            return tuple(dict.fromkeys((*vpc, *s.exclude_snat_cidrs)))

        links = SnatLinks(self._node_ip, primary, [r.ifname for r in self._ready.values()])
        return await self.mode.plan(links, exempt, s)

    def ready_links(self) -> Iterable[ReadyEni]:
        return tuple(self._ready.values())
