"""One run of the cluster simulator: a fresh moto account with N instances, an ipamd node on each, a
workload, and the measurements (`RunResult`).

A run goes: the nodes join over `join_spread_s` (each reads EC2 at start as the daemon does, and is
ready once its first drift check passed), the cluster idles `warmup_s` and, if some node is not
ready yet (at thousands of nodes their starts wait out the account's read budget), until every
node is, then the workload starts:
`steady` keeps about `pods_per_node` pods per node (a ramp to that level over `ramp_s`, then Poisson
arrivals and exponential lifetimes), `burst` schedules `burst_pods` pods within `burst_window_s` and
keeps them, and `churn_per_hour` (with steady) terminates that share of the nodes per hour — their
ENIs go with the instance (DeleteOnTermination), their pods are scheduled elsewhere — while fresh
instances join to replace them. The measured window is the steady part after the ramp (or the
whole burst); invariants are checked every `checkpoint_s` and at the end. Instances are launched
and terminated outside the front: those are the autoscaler's calls, not ipamd's.

A local error (the process's, not the cluster's: a state file that cannot be opened or written, a
descriptor limit, a job or task that crashed, anything unexpected) is never counted as a pod that
waited: `Cluster.failed` records it and the run stops with `LocalFailure`, naming it.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from bench.cluster.bound import Bound, BoundModel, NodeTrace
from bench.cluster.front import AccountFront, Ec2Budget
from bench.cluster.invariants import awaiting_eni_gc, check_cluster, leaked_enis
from bench.cluster.moto_client import MotoEc2Client, run_instance
from bench.cluster.node import MotoImds, SimNode, build_node, start_node
from bench.cluster.vtime import LatencyExecutor, VirtualClock
from bench.cluster.workload import INVARIANT, LOCAL, PodSettings, PodStats
from cloud.calls import CallLog
from cloud.ec2 import Boto3Ec2
from cloud.embedded.world import IMAGE_ID, EmbeddedEc2, World
from cloud.errors import CloudError
from datastore.store import STATE_FILE_NAME
from ipamd.config.settings import Config
from ipamd.errors import StoreWriteFailed
from ipamd.node.engine_parts import strategy
from ipamd.reconcile.jobs import Jobs

INSTANCE_TYPE = "m5.large"
NODES_PER_SUBNET = 10
"""Nodes per /20 subnet. Small subnets keep the simulated cluster fast: moto's address rules
(`cloud.embedded.eni_rules.subnet_space`) read every address of the subnet on each assign."""
SUBNETS_PER_VPC = 16
MAX_PROBLEMS_KEPT = 20
T = TypeVar("T")


class LocalFailure(RuntimeError):
    """A run stopped by a local error (`Cluster.failed`); the message names the first."""


POD_AWARE = (
    ("IPAMD_POD_AWARE_POOL", "on"),
    ("WARM_ENI_TARGET", "0"),
    ("WARM_IP_TARGET", "0"),
    ("MINIMUM_IP_TARGET", "0"),
)
"""`RunSpec.settings` of the pod-aware pool with every warm target at 0: it keeps addresses for
the pods bound to its node (`SimNode.coming`), as the API's pod watch tells it, and no more."""

CLUSTER_NAME = "sim"
"""Every node runs with this CLUSTER_NAME: the ENIs it creates carry it, and its ENI GC sweeps
the cluster's leftovers, those of terminated nodes included."""


@dataclass(frozen=True, slots=True)
class RunSpec:
    name: str
    nodes: int
    prefix: bool = False
    pods_per_node: float = 15.0
    mean_lifetime_s: float = 1800.0
    ramp_s: float = 600.0
    measure_s: float = 3600.0
    """Steady: the measured window after the ramp."""
    burst_pods: int = 0
    """More than 0: a burst run instead of a steady one."""
    burst_window_s: float = 60.0
    burst_settle_s: float = 300.0
    churn_per_hour: float = 0.0
    rejoin_after_s: float = 60.0
    join_spread_s: float = 120.0
    warmup_s: float = 120.0
    checkpoint_s: float = 900.0
    sample_s: float = 60.0
    budget: Ec2Budget = field(default_factory=Ec2Budget)
    build_unmetered: bool = False
    """Steady runs: the cluster is built (the nodes join, the pods ramp up) with the account's
    budget not metered, which applies from the measured window on, its buckets full. The window
    is then the grown cluster's steady state, whatever its size: under EC2's default budget
    (5 mutating calls a second) a cluster's growth takes at least three calls a node (the primary
    ENI's addresses, a second ENI's create and attach) before the node holds 15 pods, and at
    5,000 nodes those 15,000 calls take 50 minutes, where the ramp lasts ten: no node-local
    policy could serve the ramp's pods within their deadline."""
    pods: PodSettings = field(default_factory=PodSettings)
    settings: tuple[tuple[str, str], ...] = ()
    """ipamd's settings for every node, beyond VPC CNI's defaults (environment variable, value)."""
    seed: int = 1


@dataclass
class RunResult:
    spec: RunSpec
    window_s: float = 0.0
    calls: dict[str, int] = field(default_factory=dict)
    throttled_by_operation: dict[str, int] = field(default_factory=dict)
    """Of `calls`, the requests EC2 refused with RequestLimitExceeded."""
    """EC2 requests in the measured window, by operation (every outcome)."""
    throttled: int = 0
    throttled_total: int = 0
    client_retries: int = 0
    pods: PodStats = field(default_factory=PodStats)
    problems: list[str] = field(default_factory=list)
    violations: int = 0
    checkpoints: int = 0
    pool_failures: int = 0
    job_failures: int = 0
    nodes_replaced: int = 0
    awaiting_eni_gc: int = 0
    """Detached ENIs of live nodes left to their ENI GC, at the end."""
    series: list[tuple[float, int, int]] = field(default_factory=list)
    """(seconds since the workload began, pods holding an address, addresses in the pools)."""
    node_addresses: list[int] = field(default_factory=list)
    """Addresses in one node's pool, for every node at every sample in the measured window."""
    node_pods: list[int] = field(default_factory=list)
    """Pods holding an address on one node, alike."""
    sim_s: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)
    """A run's own figures, reported with the common ones (`bench.cluster.subnets_run`)."""
    since_s: float = 0.0
    until_s: float = 0.0
    """The measured window, in the nodes' clock: pods whose first ADD falls in it are counted."""
    node_traces: list[NodeTrace] = field(default_factory=list)
    bound: Bound | None = None
    """The lower bound on its time to address (`bench.cluster.bound`)."""
    local_errors: int = 0
    """Local errors anywhere in the run (`Cluster.failed`); the run stops at the first."""
    descriptors_per_node: float = 0.0
    """Descriptors the process opened per node, from before the first joined to all ready."""
    rss_mib_per_node: float = 0.0
    """The process's peak resident set less its resident set before the account was built, per
    node: what a simulated node costs (its parts, its instance in moto, its pods' records)."""
    peak_rss_mib: float = 0.0
    cpu_s: float = 0.0
    """CPU seconds the run took its process: its wall time on a machine with a CPU to spare."""
    state_mib_per_node: float = 0.0
    """The nodes' state files (and their WALs) at the end, per node: in RAM on /dev/shm."""


class Cluster:
    def __init__(self, spec: RunSpec, host: EmbeddedEc2, workdir: Path) -> None:
        self.spec = spec
        self.workdir = workdir
        self.victims = random.Random(f"{spec.seed}/victims")
        """Which ready node the churn terminates next (a stream of its own, like the workload's)."""
        self.world: World = host.world(INSTANCE_TYPE, seed=spec.seed)
        self.backend: Any = self.world.backend()
        self._client = self.world.client()
        self._subnets: list[tuple[str, str]] = []
        self.instances: dict[str, Any] = {}
        self.nodes: list[SimNode] = []
        self.retired: list[SimNode] = []
        env = {"CLUSTER_NAME": CLUSTER_NAME, **dict(spec.settings)}
        if spec.prefix:
            env["ENABLE_PREFIX_DELEGATION"] = "true"
        self.config = Config.from_env(env)
        self.jobs = Jobs()
        self.result = RunResult(spec)
        self._joins: set[asyncio.Task[None]] = set()
        self._serial = 0
        self._eni_suspects: set[str] = set()
        self.node_traces: dict[str, NodeTrace] = {}
        self._failure: asyncio.Future[str] | None = None

    # -- local errors --------------------------------------------------------------------------

    @property
    def failure(self) -> asyncio.Future[str]:
        """Done, with the first local error's description, once the run has one."""
        if self._failure is None:
            self._failure = asyncio.get_running_loop().create_future()
        return self._failure

    def failed(self, why: str, where: str, err: BaseException) -> None:
        """A local error (`workload.LOCAL`: the run stops) or an invariant's refusal
        (`workload.INVARIANT`: counted as a violation); other causes are counted where they
        happen."""
        message = f"{where}: {type(err).__name__}: {err}"
        if why == INVARIANT:
            self.result.violations += 1
            self._keep(f"invariant: {message}")
        elif why == LOCAL:
            self.result.local_errors += 1
            self._keep(f"local error: {message}")
            if not self.failure.done():
                self.failure.set_result(message)

    def _keep(self, problem: str) -> None:
        if len(self.result.problems) < MAX_PROBLEMS_KEPT:
            self.result.problems.append(problem)

    async def until_failed(self, work: Awaitable[T]) -> T:
        """`work`'s outcome, unless a local error comes first: then `work` is cancelled and
        `LocalFailure` raised."""
        task = asyncio.ensure_future(work)
        either: set[asyncio.Future[Any]] = {task, self.failure}
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if self.failure.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise LocalFailure(f"{self.spec.name}: local error: {self.failure.result()}")
        return task.result()

    def raise_if_failed(self) -> None:
        if self.failure.done():
            raise LocalFailure(f"{self.spec.name}: local error: {self.failure.result()}")

    # -- EC2 side ------------------------------------------------------------------------------

    def _subnet_for(self, index: int) -> tuple[str, str]:
        """The (subnet, security group) of the `index`th node: `NODES_PER_SUBNET` nodes to a /20,
        `SUBNETS_PER_VPC` /20s to a VPC, new VPCs as the cluster grows."""
        while index // NODES_PER_SUBNET >= len(self._subnets):
            self._add_vpc()
        return self._subnets[index // NODES_PER_SUBNET]

    def _add_vpc(self) -> None:
        n = len(self._subnets) // SUBNETS_PER_VPC + 1  # 10.0.0.0/16 is the world's own
        vpc = self._client.create_vpc(CidrBlock=f"10.{n}.0.0/16")["Vpc"]["VpcId"]
        group = self._client.create_security_group(
            GroupName=f"ipamd-nodes-{n}", Description="cluster nodes", VpcId=vpc
        )["GroupId"]
        for k in range(SUBNETS_PER_VPC):
            subnet = self._client.create_subnet(
                VpcId=vpc,
                CidrBlock=f"10.{n}.{16 * k}.0/20",
                AvailabilityZone=self.world.availability_zone,
            )["Subnet"]["SubnetId"]
            self._subnets.append((str(subnet), str(group)))

    def launch_instances(self, count: int, first_index: int) -> list[str]:
        ids: list[str] = []
        for index in range(first_index, first_index + count):
            subnet, group = self._subnet_for(index)
            instance = run_instance(
                self.backend, self.world.region, IMAGE_ID, INSTANCE_TYPE, subnet, group
            )
            self.instances[instance.id] = instance
            ids.append(str(instance.id))
        return ids

    # -- nodes ---------------------------------------------------------------------------------

    def live_nodes(self) -> Sequence[SimNode]:
        return self.nodes

    async def _join(self, instance_id: str, delay_s: float, client: MotoEc2Client) -> None:
        await asyncio.sleep(delay_s)
        self._serial += 1
        name = f"node-{self._serial:04d}"
        try:
            await self._start(name, instance_id, client)
        except Exception as err:  # EC2's refusals are waited out: this one is the process's
            self.failed(LOCAL, f"{name}: start", err)

    async def _start(self, name: str, instance_id: str, client: MotoEc2Client) -> None:
        loop = asyncio.get_running_loop()
        clock = VirtualClock(loop)
        self.node_traces[instance_id] = NodeTrace(name, clock.now())
        # The node's own dice (its jobs' jitter, its backoffs): no draw of one node's moves
        # another's, or the workload's.
        rng = random.Random(f"{self.spec.seed}/{name}")
        adapter = Boto3Ec2(
            client,
            recorder=CallLog(),
            call_timeout_s=self.config.ec2.call_timeout_s,
            clock=loop.time,
            rng=random.Random(rng.random()),
        )
        imds = MotoImds(self.instances[instance_id], self.world.region)
        node = None
        backoff_s = 1.0
        while node is None:
            try:
                node = await build_node(
                    name,
                    self.workdir / name / STATE_FILE_NAME,
                    self.config,
                    adapter,
                    imds,
                    clock,
                    rng,
                )
            except CloudError:  # refused for good (others it waits out): it exits, is restarted
                await asyncio.sleep(rng.uniform(0, backoff_s))
                backoff_s = min(backoff_s * 2, 60.0)
        self.nodes.append(node)
        await start_node(node, self.config, self.jobs, rng, self.failed)

    def join(self, instance_ids: Sequence[str], spread_s: float, client: MotoEc2Client) -> None:
        loop = asyncio.get_running_loop()
        for n, instance_id in enumerate(instance_ids):
            delay_s = spread_s * n / max(len(instance_ids), 1)
            task = loop.create_task(self._join(instance_id, delay_s, client))
            self._joins.add(task)
            task.add_done_callback(self._joins.discard)

    async def retire(self, node: SimNode) -> None:
        """Terminate the node's instance (its ENIs go with it) after stopping its ipamd."""
        await node.stop()
        self.nodes.remove(node)
        self.retired.append(node)
        self.backend.terminate_instances([node.instance_id])
        self.instances.pop(node.instance_id, None)
        self.node_traces[node.instance_id].gone_s = VirtualClock(asyncio.get_running_loop()).now()

    async def close(self) -> None:
        for task in list(self._joins):
            task.cancel()
        await asyncio.gather(*self._joins, return_exceptions=True)
        for node in self.nodes:
            await node.stop()

    def bound_model(self) -> BoundModel | None:
        """What the policies the lower bound covers obey (`bench.cluster.bound`): the nodes' own
        targets, instance limits and unit, the account's budget and the runtime's retry interval."""
        node = next(iter((*self.nodes, *self.retired)), None)
        if node is None:
            return None
        parts = node.daemon.parts
        return BoundModel(
            parts.targets,
            parts.node.limits,
            strategy(self.config),
            self.spec.budget,
            self.spec.pods.retry_s,
            self.result.since_s if self.spec.build_unmetered else -math.inf,
        )

    # -- checks and samples ----------------------------------------------------------------------

    def check(self, now: float) -> None:
        try:
            self._check(now)
        except Exception as err:  # a file the check could not read is no violation: it is local
            self.failed(LOCAL, "invariant check", err)

    def _check(self, now: float) -> None:
        problems = check_cluster(self.nodes, self.instances, now)
        suspects = set(leaked_enis(self.nodes, self.backend))
        problems += sorted(suspects & self._eni_suspects)
        self._eni_suspects = suspects
        self.result.checkpoints += 1
        self.result.violations += len(problems)
        room = MAX_PROBLEMS_KEPT - len(self.result.problems)
        self.result.problems += problems[: max(room, 0)]
        self.result.awaiting_eni_gc = awaiting_eni_gc(self.nodes, self.backend)
        if self.jobs.fatal is not None:
            self.failed(LOCAL, "a job crashed", self.jobs.fatal)

    def sample(self, t_s: float) -> None:
        for node in self.nodes:
            failures = node.pool.health.errors_by_code.get(StoreWriteFailed.code, 0)
            if failures:
                why = RuntimeError(f"{failures} pool rounds could not write the state file")
                self.failed(LOCAL, f"{node.name}: pool", why)
        using = [len(n.engine.state.allocations()) for n in self.nodes]
        held = [n.pool_addresses() for n in self.nodes]
        self.result.series.append((round(t_s, 1), sum(using), sum(held)))
        if self.result.since_s and not self.result.until_s:
            self.result.node_addresses += held
            self.result.node_pods += using


def new_front(spec: RunSpec, clock: VirtualClock) -> AccountFront:
    return AccountFront(spec.budget, clock.elapsed_s, metered=not spec.build_unmetered)


def install_executor(loop: asyncio.AbstractEventLoop, front: AccountFront) -> None:
    loop.set_default_executor(LatencyExecutor(loop, lambda: front.last_latency_s))
