"""Prometheus metrics: the `awscni_*` names VPC CNI users already chart, with VPC CNI's meanings, plus
ipamd's own (`ipamd_*`). Everything published is read from one engine snapshot per scrape.

Recorders here are bounded (fixed histogram buckets, counters), so a daemon that runs for months
does not grow with the calls it makes.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from ipamd.model import AddressState, PoolSnapshot

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Histogram:
    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS_S) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: str = "") -> Iterable[str]:
        sep = "," if labels else ""
        running = 0
        for bound, n in zip(self.buckets, self.counts, strict=False):
            running += n
            yield f'{name}_bucket{{{labels}{sep}le="{bound}"}} {running}'
        yield f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.count}'
        braces = f"{{{labels}}}" if labels else ""
        yield f"{name}_sum{braces} {self.sum}"
        yield f"{name}_count{braces} {self.count}"


class Recorders:
    """What the daemon records as it goes: EC2 calls (a `cloud.calls.CallRecorder`), ADD/DEL latency."""

    def __init__(self) -> None:
        self.ec2_calls: Counter[tuple[str, str]] = Counter()
        self.ec2_latency: dict[str, Histogram] = {}
        self.ec2_retries: Counter[str] = Counter()
        self.add_latency = Histogram()
        self.del_latency = Histogram()

    def record(self, operation: str, outcome: str, latency_s: float, attempt: int) -> None:
        self.ec2_calls[operation, outcome] += 1
        self.ec2_latency.setdefault(operation, Histogram()).observe(latency_s)
        if attempt > 1:
            self.ec2_retries[operation] += 1


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


def render(recorders: Recorders, sources: Sources) -> str:
    snap = sources.snapshot()
    counts = snap.counts
    total = sum(counts.values())
    lines = [
        "# HELP awscni_assigned_ip_addresses IP addresses assigned to pods",
        "# TYPE awscni_assigned_ip_addresses gauge",
        f"awscni_assigned_ip_addresses {counts[AddressState.ASSIGNED]}",
        "# HELP awscni_total_ip_addresses IP addresses on the node's ENIs",
        "# TYPE awscni_total_ip_addresses gauge",
        f"awscni_total_ip_addresses {total}",
        "# HELP awscni_eni_allocated ENIs attached and managed",
        "# TYPE awscni_eni_allocated gauge",
        f"awscni_eni_allocated {len(snap.enis)}",
        "# TYPE awscni_eni_max gauge",
        f"awscni_eni_max {sources.max_enis}",
        "# TYPE awscni_ip_max gauge",
        f"awscni_ip_max {sources.max_addresses}",
        "# HELP ipamd_addresses Addresses by state (one snapshot)",
        "# TYPE ipamd_addresses gauge",
        *(f'ipamd_addresses{{state="{s.value}"}} {counts[s]}' for s in AddressState),
        "# TYPE ipamd_lost_addresses gauge",
        f"ipamd_lost_addresses {counts[AddressState.LOST]}",
        "# TYPE ipamd_delete_intents gauge",
        f"ipamd_delete_intents {snap.intents}",
        "# TYPE ipamd_quarantined_allocations gauge",
        f"ipamd_quarantined_allocations {snap.quarantined}",
        "# TYPE ipamd_leaked_allocations_released_total counter",
        f"ipamd_leaked_allocations_released_total {sources.leaks_released()}",
        *_ec2_lines(recorders),
        "# TYPE ipamd_reconcile_runs_total counter",
        *(
            f'ipamd_reconcile_runs_total{{job="{job}",outcome="{outcome}"}} {n}'
            for (job, outcome), n in sorted(sources.job_outcomes().items())
        ),
        "# TYPE ipamd_pool_failures_total counter",
        *(
            f'ipamd_pool_failures_total{{code="{code}"}} {n}'
            for code, n in sorted(sources.pool_failures().items())
        ),
        "# HELP ipamd_enis_blocked ENIs whose addresses are held back: host link not set up yet",
        "# TYPE ipamd_enis_blocked gauge",
        f"ipamd_enis_blocked {sum(1 for eni in snap.enis if eni.blocked)}",
        "# HELP ipamd_hostnet_fixes_total Host-network reconcile repairs by kind",
        "# TYPE ipamd_hostnet_fixes_total counter",
        *(
            f'ipamd_hostnet_fixes_total{{kind="{kind}"}} {n}'
            for kind, n in sorted(sources.hostnet_fixes().items())
        ),
        "# HELP ipamd_hostnet_add_failures_total ADDs undone: the pod's rules could not be set",
        "# TYPE ipamd_hostnet_add_failures_total counter",
        f"ipamd_hostnet_add_failures_total {sources.hostnet_add_failures()}",
        "# TYPE ipamd_add_latency_seconds histogram",
        *recorders.add_latency.lines("ipamd_add_latency_seconds"),
        "# TYPE ipamd_del_latency_seconds histogram",
        *recorders.del_latency.lines("ipamd_del_latency_seconds"),
    ]
    return "\n".join(lines) + "\n"


def _ec2_lines(recorders: Recorders) -> list[str]:
    lines = [
        "# HELP awscni_aws_api_error_count EC2 API errors by operation and code",
        "# TYPE awscni_aws_api_error_count counter",
    ]
    lines += [
        f'awscni_aws_api_error_count{{api="{op}",error="{outcome}"}} {n}'
        for (op, outcome), n in sorted(recorders.ec2_calls.items())
        if outcome != "ok"
    ]
    lines += ["# TYPE ipamd_ec2_calls_total counter"]
    lines += [
        f'ipamd_ec2_calls_total{{api="{op}",outcome="{outcome}"}} {n}'
        for (op, outcome), n in sorted(recorders.ec2_calls.items())
    ]
    lines += ["# TYPE ipamd_ec2_retries_total counter"]
    lines += [
        f'ipamd_ec2_retries_total{{api="{op}"}} {n}'
        for op, n in sorted(recorders.ec2_retries.items())
    ]
    lines += [
        "# HELP awscni_aws_api_latency_ms EC2 API latency (milliseconds)",
        "# TYPE awscni_aws_api_latency_ms summary",
    ]
    for op, hist in sorted(recorders.ec2_latency.items()):
        lines.append(f'awscni_aws_api_latency_ms_sum{{api="{op}"}} {hist.sum * 1000:.3f}')
        lines.append(f'awscni_aws_api_latency_ms_count{{api="{op}"}} {hist.count}')
    return lines
