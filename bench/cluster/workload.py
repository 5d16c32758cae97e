"""Pods, as Kubernetes drives them through a node's runtime and CNI: scheduled onto a ready node with
room (the less loaded of two picked at random), the sandbox created, then CNI ADD (the datapath's
`add`, as the API serves it); later the sandbox is removed and CNI DEL (its `release`) sent, unless
the DEL goes missing, which leaves the address to the runtime leak GC.

An ADD refused with `NoAddressAvailable` has already woken the node's pool manager (the engine sets
`pool_wanted`); the runtime retries the ADD every `retry_s` virtual seconds, as kubelet retries a pod
sandbox that failed to start, until it gets an address or `deadline_s` has passed: that pod counts as
an ADD failed for want of an address. A retry within `retry_s` of the node's last refusal, with
nothing since that could change the engine's answer (`node.Refusal`: no commit, the same ENIs held
back, no address out of its cooldown), is refused without asking the engine: the answer would be
the same, and each node's engine still hears a refused ADD every `retry_s` while pods wait. In a
ramp at the account's limit thousands of pods wait at once, and their retries were most of a run.
Time to address runs from the first ADD to the one that got an address (for a pod given up at
its deadline, to the deadline: the least it would have waited). When a node is terminated,
its pods are scheduled again elsewhere (a controller replaces them); any waiting pod task of the old
node ends on its own.

Every ADD that fails is counted by its cause (`PodStats`): no address by its deadline, and of those
the pods whose node's pool rounds the account refused (RequestLimitExceeded) while they waited,
the EC2 budget's; an invariant of ipamd's own refusing it (an address with a second owner, an
inventory conflict, a delete intent for a pod never deleted); or a local error, the process's and
not the cluster's (a state file that cannot be written or opened, a descriptor limit, anything
unexpected). A local error is also handed to the run (`failed`), which stops loudly: it is never a
pod that waited.

The workload's dice are its own (`Draws`): the nth pod is offered the same nodes, arrives at the
same instant, lives as long and loses its DEL or not alike whatever ipamd does meanwhile, so two
versions of ipamd meet the same pods (common random numbers) and what differs in their figures is
theirs.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bench.cluster.bound import PodTrace
from bench.cluster.node import Refusal, SimNode
from bench.cluster.waiting import EPS_S, Waiting
from datastore.errors import OwnershipConflict
from datastore.records import AllocationKey
from ipamd.clock import Clock
from ipamd.errors import (
    DeleteIntentActive,
    InventoryError,
    MaxPodsReached,
    NoAddressAvailable,
    NodeFull,
)
from ipamd.model import PodRef
from ipamd.sizing.max_pods import HOST_NETWORK_PODS

NETWORK = "k8s-pod-network"


@dataclass(frozen=True, slots=True)
class PodSettings:
    retry_s: float = 10.0
    """Between two ADDs of a pod that found no address: kubelet's pod-worker backoff after a sync
    that failed (`backOffPeriod`, 10 s; its jitter of up to half again is left out, so that every
    pod's tries fall on a grid the bound can round to, `bench.cluster.bound`)."""
    deadline_s: float = 1800.0
    """After its first ADD, a pod still without an address counts as failed."""
    missed_del_ratio: float = 0.01
    """Share of deletions whose CNI DEL never reaches ipamd."""
    bind_to_add_median_s: float = 0.0
    """From the scheduler's binding to the pod's first ADD: the kubelet's sync of the new pod
    (its volumes, the sandbox image) before it creates the sandbox. 0: the ADD comes at the
    binding. Otherwise log-normal with this median and `bind_to_add_sigma` (`Draws.bind_to_add_s`):
    at 2 s and 0.8, 0.3 s at the 1st percentile and 13 s at the 99th."""
    bind_to_add_sigma: float = 0.8


LOCAL = "local_error"
INVARIANT = "invariant"
NO_ADDRESS = "no_address"
CAPACITY = (MaxPodsReached, NodeFull)
"""Refusals for want of an address that no wait brings (the node holds all it may): no address."""


def cause(err: BaseException) -> str:
    """Why an ADD (or DEL) failed, other than an address still to come: `INVARIANT`, `NO_ADDRESS`
    for a node that may hold no more, else `LOCAL`."""
    if isinstance(err, InventoryError | DeleteIntentActive):
        return INVARIANT
    if isinstance(err.__cause__, OwnershipConflict):  # the state file's one-owner index refused
        return INVARIANT
    if isinstance(err, CAPACITY):
        return NO_ADDRESS
    return LOCAL


Failed = Callable[[str, str, BaseException], None]
"""Told of every local error and invariant refusal: (cause, where, the error)."""


@dataclass
class PodStats:
    traces: list[PodTrace] = field(default_factory=list)
    """Every pod's first ADD, address and release, in the order of their first ADDs."""
    failed_no_address: int = 0
    """ADDs given up without an address: at their deadline, or refused as the node is full."""
    failed_ec2_budget: int = 0
    """Of `failed_no_address`, the pods whose node's pool rounds the account throttled while they
    waited."""
    failed_invariant: int = 0
    failed_local: int = 0
    add_errors: Counter[str] = field(default_factory=Counter)
    """ADDs and DELs that failed with an error, by its class (`del_` before a DEL's)."""
    scheduled: int = 0
    unschedulable: int = 0
    deleted: int = 0
    missed_dels: int = 0
    rescheduled: int = 0
    waiting: int = 0
    """Pods whose ADD is being retried right now."""


class Draws:
    """The workload's random draws, each kind from a stream of its own seeded by the run's seed, and
    each taking the same number of draws whatever the cluster's state (so one kind's draws never
    shift another's): which nodes a pod is offered, when the next pod arrives, how long a pod lives
    once it has its address, whether its DEL goes missing."""

    OFFERS = 8
    """Nodes offered to each pod (it takes the less loaded of the first two with room)."""

    def __init__(self, seed: int) -> None:
        self._offers = random.Random(f"{seed}/offers")
        self._arrivals = random.Random(f"{seed}/arrivals")
        self._lifetimes = random.Random(f"{seed}/lifetimes")
        self._dels = random.Random(f"{seed}/dels")
        self._syncs = random.Random(f"{seed}/syncs")

    def offers(self, nodes: Sequence[SimNode]) -> list[SimNode]:
        return [nodes[int(self._offers.random() * len(nodes))] for _ in range(self.OFFERS)]

    def gap_s(self, rate_per_s: float) -> float:
        return self._arrivals.expovariate(rate_per_s)

    def lifetime_s(self, mean_s: float | None) -> float | None:
        """Drawn for every pod (None while pods live until the end), so the nth pod's lifetime is
        the same whenever the pods before it got their addresses."""
        draw = self._lifetimes.expovariate(1.0)
        return None if mean_s is None else draw * mean_s

    def del_missed(self, ratio: float) -> bool:
        return self._dels.random() < ratio

    def bind_to_add_s(self, median_s: float, sigma: float) -> float:
        """Drawn for every pod (0 when `median_s` is 0): log-normal, `median_s` at its median."""
        draw = self._syncs.gauss(0.0, 1.0)
        return median_s * math.exp(sigma * draw) if median_s > 0 else 0.0


def _standing(node: SimNode, retry_s: float) -> Callable[[], float]:
    """Until when the node's last refusal stands if nothing changes (-inf: not now)."""

    def until() -> float:
        refusal = node.refusal
        if node.gone or refusal is None:
            return -math.inf
        return refusal.until(node, retry_s)

    return until


class Workload:
    """Schedules pods onto the cluster's nodes and runs each pod's life as a task."""

    def __init__(
        self,
        nodes: Callable[[], Sequence[SimNode]],
        clock: Clock,
        draws: Draws,
        settings: PodSettings,
        family: str,
        failed: Failed = lambda _cause, _where, err: None,
    ) -> None:
        self._nodes = nodes
        self._failed = failed
        self._clock = clock
        self._draws = draws
        self._settings = settings
        self._family = family
        self._serial = 0
        self.stats = PodStats()
        self.mean_lifetime_s: float | None = None
        """Mean of the pods' exponentially distributed lifetimes; None: they live until the end."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._live: dict[str, PodTrace] = {}
        """Traces of the pods that still hold or want an address, by container ID."""

    def place(self) -> SimNode | None:
        """A ready node with room: the less loaded of two drawn at random (a few draws at most)."""
        nodes = self._nodes()
        if not nodes:
            return None
        picks = [n for n in self._draws.offers(nodes) if self._fits(n)][:2]
        if not picks:
            picks = [n for n in nodes if self._fits(n)][:1]
        return min(picks, key=lambda n: len(n.pods)) if picks else None

    @staticmethod
    def _fits(node: SimNode) -> bool:
        return node.ready and not node.gone and len(node.pods) < node.max_pods - HOST_NETWORK_PODS

    def launch(self) -> bool:
        """Schedule one pod; False if no node has room for it."""
        lifetime_s = self._draws.lifetime_s(self.mean_lifetime_s)
        missed_del = self._draws.del_missed(self._settings.missed_del_ratio)
        s = self._settings
        sync_s = self._draws.bind_to_add_s(s.bind_to_add_median_s, s.bind_to_add_sigma)
        node = self.place()
        if node is None:
            self.stats.unschedulable += 1
            return False
        self._serial += 1
        cid = hashlib.sha256(f"{self._family}-{self._serial}".encode()).hexdigest()
        node.pods.add(cid)
        self.stats.scheduled += 1
        pod = self._pod(node, cid, lifetime_s, missed_del, sync_s)
        task = asyncio.get_running_loop().create_task(pod)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    def reschedule(self, node: SimNode) -> None:
        """The node is gone: its pods start again elsewhere, with fresh lifetimes."""
        for cid in node.pods:
            self._released(cid)
        for _ in range(len(node.pods)):
            self.stats.rescheduled += 1
            self.launch()
        node.pods.clear()

    def _released(self, cid: str) -> None:
        trace = self._live.pop(cid, None)
        if trace is not None:
            trace.released_s = self._clock.now()

    async def _pod(
        self, node: SimNode, cid: str, lifetime_s: float | None, missed_del: bool, sync_s: float
    ) -> None:
        try:
            await self._life(node, cid, lifetime_s, missed_del, sync_s)
        except Exception as err:  # not ipamd's answer: the simulator's own, which ends the run
            self._failed(LOCAL, f"{node.name}: pod {cid[:12]}", err)
        finally:
            node.coming.discard(cid)

    async def _life(
        self, node: SimNode, cid: str, lifetime_s: float | None, missed_del: bool, sync_s: float
    ) -> None:
        key = AllocationKey(NETWORK, cid, "eth0")
        bound_s = self._clock.now()
        if sync_s > 0:
            node.bound(cid)
            await asyncio.sleep(sync_s)
            if node.gone:
                return  # rescheduled elsewhere (`reschedule`)
        node.runtime.start(cid)
        if not await self._add(node, key, bound_s):
            node.runtime.stop(cid)
            node.pods.discard(cid)
            await self._release(node, key)  # the runtime's DEL after a failed ADD
            return
        if lifetime_s is None:
            return
        await asyncio.sleep(lifetime_s)
        if not node.gone:
            await self._delete(node, key, missed_del)

    async def _add(self, node: SimNode, key: AllocationKey, bound_s: float) -> bool:
        started = self._clock.now()
        trace = PodTrace(node.name, started, bound_s=bound_s)
        self.stats.traces.append(trace)
        self._live[key.container_id] = trace
        pod = PodRef("default", key.container_id[:12], key.container_id[:32])
        waiting = False
        retry_s = self._settings.retry_s
        throttled = node.pool.health.throttled_rounds
        try:
            while not node.gone:
                try:
                    refusal = node.refusal
                    if refusal is not None and refusal.stands(node, self._clock.now(), retry_s):
                        raise NoAddressAvailable("refused as the node's last ADD")
                    try:
                        await node.datapath.add(key, pod)
                        node.coming.discard(key.container_id)  # it holds its address now
                    except NoAddressAvailable:
                        node.refusal = Refusal.of(node, self._clock.now())
                        node.changed()
                        raise
                except NoAddressAvailable:
                    if self._clock.now() - started >= self._settings.deadline_s - EPS_S:
                        self._no_address(node, throttled)
                        trace.gave_up = True
                        self._released(key.container_id)
                        return False
                    if not waiting:
                        waiting = True
                        self.stats.waiting += 1
                    await self._waiting(node).turn(started)
                    continue
                except Exception as err:
                    self._add_failed(node, key, err, throttled)
                    return False
                trace.address_s = self._clock.now()
                return True
            self._released(key.container_id)
            return False
        finally:
            if waiting:
                self.stats.waiting -= 1

    def _no_address(self, node: SimNode, throttled_before: int) -> None:
        self.stats.failed_no_address += 1
        if node.pool.health.throttled_rounds > throttled_before:
            self.stats.failed_ec2_budget += 1

    def _add_failed(
        self, node: SimNode, key: AllocationKey, err: Exception, throttled_before: int
    ) -> None:
        """An ADD that failed with an error rather than wait for an address, counted by cause."""
        self.stats.add_errors[type(err).__name__] += 1
        self._released(key.container_id)
        why = cause(err)
        if why == NO_ADDRESS:
            self._no_address(node, throttled_before)
            return
        if why == INVARIANT:
            self.stats.failed_invariant += 1
        else:
            self.stats.failed_local += 1
        self._failed(why, f"{node.name}: ADD {key.container_id[:12]}", err)

    def _waiting(self, node: SimNode) -> Waiting:
        if node.waiting is None:
            s = self._settings
            standing = _standing(node, s.retry_s)
            node.waiting = Waiting(self._clock, s.retry_s, s.deadline_s, standing)
        return node.waiting

    async def _delete(self, node: SimNode, key: AllocationKey, missed: bool) -> None:
        node.runtime.stop(key.container_id)
        node.pods.discard(key.container_id)
        self._released(key.container_id)
        self.stats.deleted += 1
        if missed:
            self.stats.missed_dels += 1
            return
        await self._release(node, key)

    async def _release(self, node: SimNode, key: AllocationKey) -> None:
        if node.gone:
            return
        try:
            await node.datapath.release(key)
        except Exception as err:
            self.stats.add_errors[f"del_{type(err).__name__}"] += 1
            self._failed(cause(err), f"{node.name}: DEL {key.container_id[:12]}", err)

    async def arrivals(self, rate_per_s: float, until_s: float) -> None:
        """Poisson arrivals at `rate_per_s` until the clock reads `until_s`."""
        while True:
            await asyncio.sleep(self._draws.gap_s(rate_per_s))
            if self._clock.now() >= until_s:
                return
            self.launch()

    async def spread(self, count: int, over_s: float) -> None:
        """`count` pods scheduled evenly over `over_s` seconds."""
        gap_s = over_s / max(count, 1)
        for _ in range(count):
            self.launch()
            await asyncio.sleep(gap_s)

    def pending(self) -> int:
        return len(self._tasks)

    async def settle(self, timeout_s: float) -> None:
        """Wait until every pod task has ended (pods that live on end once they have an address),
        or `timeout_s`."""
        if self._tasks and timeout_s > 0:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
