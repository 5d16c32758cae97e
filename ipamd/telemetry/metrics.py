"""Prometheus metrics: the `awscni_*` names VPC CNI users already chart, with VPC CNI's types, labels and
meanings, plus ipamd's own (`ipamd_*`). The only home of `prometheus_client`.

Owns, over the catalogue of every published metric (`ipamd.telemetry.catalogue`), the recorders of
events as they happen (`Recorders`: EC2 attempts, ADD and DEL requests, start-up, addresses EC2 took
away from pods), and the collectors that turn one engine snapshot and the daemon's own counters into
metric families at scrape time.

It must not read the engine more than once per scrape (the pool collector takes one snapshot; the
others read plain counters), must not register anything in prometheus_client's global registry
(each daemon has its own, so that tests can build many), and does no I/O. Everything it keeps is
bounded: fixed histogram buckets, and labels drawn from EC2 API names, error codes and the node's
own ENIs and units.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Histogram, Summary, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from cloud.calls import OK
from datastore.records import Mutation
from ipamd.engine.state import NodeState
from ipamd.errors import MaxPodsReached, NoAddressAvailable
from ipamd.model import AddressState, PoolSnapshot
from ipamd.telemetry.catalogue import CATALOGUE, SPECS, MetricSpec
from ipamd.telemetry.totals import total_addresses
from ipamd.version import installed

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""What `exposition` writes: the classic text format, as VPC CNI's Go client serves it."""

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
GO_DEFAULT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""client_golang's `DefBuckets`, which VPC CNI's start-up histograms use."""

DEL_REASON = "PodDeleted"
"""The `reason` VPC CNI's plugin sends with every DEL; ipamd's DEL has no other."""


def _bare_counter(spec: MetricSpec) -> bool:
    """VPC CNI's counters mostly lack the `_total` suffix, which prometheus_client always adds."""
    return spec.type == "counter" and not spec.name.endswith("_total")


class Families:
    """The families of one collection, each declared up front (so that a metric with no series yet
    still shows), samples added by metric name with exactly the catalogue's labels."""

    def __init__(self, names: Iterable[str]) -> None:
        self._families: dict[str, Metric] = {}
        for name in names:
            spec = SPECS[name]
            base = spec.name.removesuffix("_total") if spec.type == "counter" else spec.name
            self._families[name] = Metric(base, spec.help, spec.type)

    def add(self, name: str, value: float, **labels: str) -> None:
        spec = SPECS[name]
        if sorted(labels) != sorted(spec.labels):
            raise ValueError(f"{name} takes labels {spec.labels}, not {tuple(labels)}")
        self._families[name].add_sample(name, labels, value)

    def __iter__(self) -> Iterator[Metric]:
        return iter(self._families.values())


def _histogram(name: str, buckets: tuple[float, ...]) -> Histogram:
    spec = SPECS[name]
    return Histogram(name, spec.help, spec.labels, registry=None, buckets=buckets)


class Recorders:
    """What the daemon records as it goes. `record` is the EC2 adapter's `cloud.calls.CallRecorder`;
    the API's middleware calls `add_done` and `del_done`; `main` calls `started` once and hands
    every engine commit to `note_commit`."""

    def __init__(self) -> None:
        self.ec2_attempts: Counter[tuple[str, str]] = Counter()
        self.ec2_retries: Counter[str] = Counter()
        spec = SPECS["awscni_aws_api_latency_ms"]
        self.ec2_latency = Summary(spec.name, spec.help, spec.labels, registry=None)
        self.add_latency = _histogram("ipamd_add_latency_seconds", LATENCY_BUCKETS_S)
        self.del_latency = _histogram("ipamd_del_latency_seconds", LATENCY_BUCKETS_S)
        self.startup = _histogram("awscni_ipamd_startup_duration_seconds", GO_DEFAULT_BUCKETS_S)
        self.node_init = _histogram(
            "awscni_ipamd_node_initialization_duration_seconds", GO_DEFAULT_BUCKETS_S
        )
        self.add_requests = 0
        self.del_requests: Counter[str] = Counter()
        self.no_address = 0
        self.force_removed_enis = 0
        self.force_removed_ips = 0

    def record(self, operation: str, outcome: str, latency_s: float, attempt: int) -> None:
        self.ec2_attempts[operation, outcome] += 1
        if attempt > 1:
            self.ec2_retries[operation] += 1
        # VPC CNI labels `error` with Go's "true"/"false" and `status` with the HTTP status; the
        # recorder knows the status of a success only, so a failure's is left empty, as VPC CNI
        # leaves it for an error without an HTTP response.
        failed = outcome != OK
        labels = ("true", "") if failed else ("false", "200")
        self.ec2_latency.labels(operation, *labels).observe(latency_s * 1000)

    def add_done(self, latency_s: float, error: BaseException | None) -> None:
        """An ADD answered (or failed) after `latency_s`."""
        self.add_requests += 1
        self.add_latency.observe(latency_s)
        # MaxPodsReached is VPC CNI's case too: its datastore simply has no address left.
        if isinstance(error, NoAddressAvailable | MaxPodsReached):
            self.no_address += 1

    def del_done(self, latency_s: float) -> None:
        self.del_requests[DEL_REASON] += 1
        self.del_latency.observe(latency_s)

    def started(self, ready: bool, startup_s: float, node_init_s: float) -> None:
        """Start-up finished: ready, or given up on (an unusable state file is the only way)."""
        success = "true" if ready else "false"
        reason = "" if ready else "state_unavailable"
        # ipamd never talks to the Kubernetes API server.
        self.startup.labels(success, "false", reason).observe(startup_s)
        self.node_init.labels(success).observe(node_init_s)

    def note_commit(self, state: NodeState, mutation: Mutation) -> None:
        """An engine commit listener's work: units turned `lost` are addresses EC2 took away from
        pods (VPC CNI force-removes them; ipamd keeps them owned until the pod's DEL). An ENI all
        of whose remaining units are lost is an ENI EC2 took away under its pods."""
        lost = [u for u in mutation.put_units if u.state == "lost"]
        if not lost:
            return
        self.force_removed_ips += sum(state.owned_in(u.cidr) for u in lost)
        for eni_id in dict.fromkeys(u.eni_id for u in lost):
            units = state.units_on(eni_id)
            if all(state.units()[c].state == "lost" for c in units if c in state.units()):
                self.force_removed_enis += 1


@dataclass(frozen=True, slots=True)
class Sources:
    snapshot: Callable[[], PoolSnapshot]
    max_enis: int
    max_addresses: int
    job_outcomes: Callable[[], Mapping[tuple[str, str], int]]
    leaks_released: Callable[[], int]
    pool_failures: Callable[[], Mapping[str, int]]
    hostnet_fixes: Callable[[], Mapping[str, int]] = dict
    """The host-network reconcile's repairs by kind (rule_added, rule_removed, ..., snat)."""
    hostnet_add_failures: Callable[[], int] = int
    hostnet_reconciles: Callable[[], Mapping[str, int]] = dict
    """Host-network reconcile rounds by outcome: ok, unreadable, failed."""
    actions_in_progress: Callable[[], Mapping[str, int]] = dict
    """VPC CNI's action names (nodeInit, increaseDatastorePool, ...) → actions running now."""
    connmark_backend: str = ""
    """"nftables" when ipamd's table sets the connmark; "" when nothing does."""
    rp_filter_strict: Callable[[], bool] = bool
    """Whether the primary link's reverse-path filtering is strict while ipamd marks inbound
    connections (`ipamd.hostnet.sysctl`)."""
    subnet_free: Callable[[], int | None] = lambda: None
    """Free addresses in the node's subnets, as the pool last saw them; None: never read."""
    subnet_scarce: Callable[[], bool] = bool
    pool_blocked: Callable[[], str] = str
    """Whether subnet-scarcity mode is on (`ipamd.sizing.scarcity`)."""
    prefix_fallback: Callable[[], bool] = bool
    """Whether prefix mode is falling back to secondary IPs (`ipamd.sizing.prefix_return`)."""
    network_policy_calls: Callable[[], Mapping[tuple[str, str], int]] = dict
    network_policy_enforced: Callable[[], bool] = bool
    """Whether new pods are enforced now (NETWORK_POLICY_ENFORCING_MODE, and with it unset, the
    agent's socket)."""
    """Calls to the network-policy agent: (enforce or delete, ok/refused/unavailable) → calls."""
    max_pods_rule: str = ""
    """The rule that set the node's max pods (`ipamd.sizing.MaxPodsRule`); "" = not known."""


POOL_METRICS = (
    "awscni_assigned_ip_addresses",
    "awscni_total_ip_addresses",
    "awscni_total_ipv4_prefixes",
    "awscni_eni_allocated",
    "awscni_eni_max",
    "awscni_ip_max",
    "awscni_assigned_ip_per_cidr",
    "awscni_assigned_ip_per_eni",
    "ipamd_addresses",
    "ipamd_lost_addresses",
    "ipamd_delete_intents",
    "ipamd_quarantined_allocations",
    "ipamd_enis_blocked",
    "ipamd_max_pods",
)


class PoolCollector(Collector):
    """The pool's gauges, every one from the same single snapshot.

    IPv6 mode (one /80 on the primary ENI): the total is VPC CNI's, 2^48 per /80
    (`ipamd.telemetry.totals`); assigned, per ENI and per CIDR (the /80) count the pods' /128s;
    `awscni_total_ipv4_prefixes` counts /28s only, 0 as in VPC CNI. `awscni_ip_max` is the node's
    max pods in both families: the usable capacity, where VPC CNI has none for IPv6 (its figure
    there is still the IPv4 prefix-mode limit of the instance type). `ipamd_addresses{state="free"}`
    counts the pods max pods still allows, not the /80's 2^48."""

    def __init__(self, sources: Sources) -> None:
        self._sources = sources

    def collect(self) -> Iterator[Metric]:
        snap = self._sources.snapshot()
        counts = snap.counts
        f = Families(POOL_METRICS)
        f.add("awscni_assigned_ip_addresses", counts[AddressState.ASSIGNED])
        f.add("awscni_total_ip_addresses", total_addresses(snap))
        prefixes = sum(1 for eni in snap.enis for unit in eni.units if unit.kind == "prefix")
        f.add("awscni_total_ipv4_prefixes", prefixes)
        f.add("awscni_eni_allocated", len(snap.enis))
        f.add("awscni_eni_max", self._sources.max_enis)
        f.add("awscni_ip_max", self._sources.max_addresses)
        if self._sources.max_pods_rule:
            f.add("ipamd_max_pods", self._sources.max_addresses, rule=self._sources.max_pods_rule)
        for eni in snap.enis:
            f.add("awscni_assigned_ip_per_eni", eni.counts[AddressState.ASSIGNED], eni=eni.eni_id)
            for unit in eni.units:
                assigned = sum(1 for _, s in unit.addresses if s is AddressState.ASSIGNED)
                f.add("awscni_assigned_ip_per_cidr", assigned, cidr=unit.cidr)
        for state in AddressState:
            f.add("ipamd_addresses", counts[state], state=state.value)
        f.add("ipamd_lost_addresses", counts[AddressState.LOST])
        f.add("ipamd_delete_intents", snap.intents)
        f.add("ipamd_quarantined_allocations", snap.quarantined)
        f.add("ipamd_enis_blocked", sum(1 for eni in snap.enis if eni.blocked))
        yield from f


DAEMON_METRICS = (
    "awscni_ipamd_error_count",
    "awscni_ipamd_action_inprogress",
    "awscni_reconcile_count",
    "awscni_connmark_backend",
    "awscni_connmark_reconcile_total",
    "awscni_build_info",
    "ipamd_leaked_allocations_released_total",
    "ipamd_reconcile_runs_total",
    "ipamd_pool_failures_total",
    "ipamd_subnet_free_addresses",
    "ipamd_subnet_scarce",
    "ipamd_prefix_fallback",
    "ipamd_pool_blocked",
    "ipamd_hostnet_fixes_total",
    "ipamd_hostnet_add_failures_total",
    "ipamd_hostnet_rp_filter_strict",
    "ipamd_network_policy_calls_total",
    "ipamd_network_policy_enforced",
)


class DaemonCollector(Collector):
    """Counters the daemon's parts keep (jobs, pool manager, leak GC, datapath), read as they are."""

    def __init__(self, sources: Sources) -> None:
        self._sources = sources
        self._version = installed()

    def collect(self) -> Iterator[Metric]:
        s = self._sources
        f = Families(DAEMON_METRICS)
        outcomes = s.job_outcomes()
        rounds: Counter[str] = Counter()
        failed: Counter[str] = Counter()
        for (job, outcome), n in sorted(outcomes.items()):
            f.add("ipamd_reconcile_runs_total", n, job=job, outcome=outcome)
            rounds[job] += n
            failed[job] += n if outcome != "ok" else 0
        for job, n in sorted(rounds.items()):
            f.add("awscni_reconcile_count", n, fn=job)
        pool_failures = s.pool_failures()
        for code, n in sorted(pool_failures.items()):
            f.add("ipamd_pool_failures_total", n, code=code)
        errors = {"pool": sum(pool_failures.values()), "hostnet_add": s.hostnet_add_failures()}
        free = s.subnet_free()
        if free is not None:  # no series until the subnets were read
            f.add("ipamd_subnet_free_addresses", free)
        f.add("ipamd_subnet_scarce", int(s.subnet_scarce()))
        f.add("ipamd_prefix_fallback", int(s.prefix_fallback()))
        f.add("ipamd_pool_blocked", int(bool(s.pool_blocked())))
        for fn, n in sorted({**errors, **failed}.items()):
            f.add("awscni_ipamd_error_count", n, fn=fn)
        for fn, n in sorted(s.actions_in_progress().items()):
            f.add("awscni_ipamd_action_inprogress", n, fn=fn)
        f.add("awscni_connmark_backend", int(s.connmark_backend == "nftables"), backend="nftables")
        f.add("ipamd_hostnet_rp_filter_strict", int(s.rp_filter_strict()))
        reconciles = s.hostnet_reconciles()
        ok = reconciles.get("ok", 0)
        f.add("awscni_connmark_reconcile_total", ok, result="success")
        f.add("awscni_connmark_reconcile_total", sum(reconciles.values()) - ok, result="error")
        f.add("awscni_build_info", 1, version=self._version)
        f.add("ipamd_leaked_allocations_released_total", s.leaks_released())
        for kind, n in sorted(s.hostnet_fixes().items()):
            f.add("ipamd_hostnet_fixes_total", n, kind=kind)
        f.add("ipamd_hostnet_add_failures_total", s.hostnet_add_failures())
        for (call, outcome), n in sorted(s.network_policy_calls().items()):
            f.add("ipamd_network_policy_calls_total", n, call=call, outcome=outcome)
        f.add("ipamd_network_policy_enforced", int(s.network_policy_enforced()))
        yield from f


RECORDED_METRICS = (
    "awscni_add_ip_req_count",
    "awscni_del_ip_req_count",
    "awscni_no_available_ip_addresses",
    "awscni_aws_api_error_count",
    "awscni_ec2api_req_count",
    "awscni_ec2api_error_count",
    "awscni_force_removed_enis",
    "awscni_force_removed_ips",
    "ipamd_ec2_calls_total",
    "ipamd_ec2_retries_total",
)


class RecordedCollector(Collector):
    """What `Recorders` counted and timed as events happened."""

    def __init__(self, recorders: Recorders) -> None:
        self._r = recorders

    def collect(self) -> Iterator[Metric]:
        r = self._r
        f = Families(RECORDED_METRICS)
        f.add("awscni_add_ip_req_count", r.add_requests)
        f.add("awscni_del_ip_req_count", r.del_requests[DEL_REASON], reason=DEL_REASON)
        f.add("awscni_no_available_ip_addresses", r.no_address)
        f.add("awscni_force_removed_enis", r.force_removed_enis)
        f.add("awscni_force_removed_ips", r.force_removed_ips)
        requests: Counter[str] = Counter()
        errors: Counter[str] = Counter()
        for (op, outcome), n in sorted(r.ec2_attempts.items()):
            f.add("ipamd_ec2_calls_total", n, api=op, outcome=outcome)
            requests[op] += n
            if outcome != OK:
                errors[op] += n
                f.add("awscni_aws_api_error_count", n, api=op, error=outcome)
        for op, n in sorted(requests.items()):
            f.add("awscni_ec2api_req_count", n, fn=op)
            f.add("awscni_ec2api_error_count", errors[op], fn=op)
        for op, n in sorted(r.ec2_retries.items()):
            f.add("ipamd_ec2_retries_total", n, api=op)
        yield from f
        for timed in (r.ec2_latency, r.add_latency, r.del_latency, r.startup, r.node_init):
            for metric in timed.collect():
                # client_golang writes no `_created` series; VPC CNI's dashboards know none.
                metric.samples = [s for s in metric.samples if not s.name.endswith("_created")]
                yield metric


def build_registry(recorders: Recorders, sources: Sources) -> CollectorRegistry:
    """A registry of its own for one daemon: the pool, the daemon's counters, the recordings."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PoolCollector(sources))
    registry.register(DaemonCollector(sources))
    registry.register(RecordedCollector(recorders))
    return registry


_BARE_COUNTERS = tuple(spec.name for spec in CATALOGUE if _bare_counter(spec))


def exposition(registry: CollectorRegistry) -> bytes:
    """The registry in the text format, with VPC CNI's counter names: prometheus_client heads every
    counter family `<name>_total`; VPC CNI's Go client heads `awscni_add_ip_req_count` as it is,
    and its samples (named here as in VPC CNI) must sit under a header of the same name."""
    text = generate_latest(registry)
    for name in _BARE_COUNTERS:
        text = text.replace(f"# HELP {name}_total ".encode(), f"# HELP {name} ".encode(), 1)
        text = text.replace(
            f"# TYPE {name}_total counter\n".encode(), f"# TYPE {name} counter\n".encode(), 1
        )
    return text


def render(recorders: Recorders, sources: Sources) -> str:
    """One scrape's text, as `GET /metrics` serves it."""
    return exposition(build_registry(recorders, sources)).decode()
