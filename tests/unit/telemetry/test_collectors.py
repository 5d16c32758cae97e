"""The collectors over an engine on a real state file: every catalogued metric is published with its
type and labels, the pool's gauges come from one snapshot, and VPC CNI's counter names survive the
exposition."""

from __future__ import annotations

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from ipamd.engine.engine import Engine
from ipamd.model import PoolSnapshot
from ipamd.telemetry.catalogue import CATALOGUE, SPECS
from ipamd.telemetry.metrics import Recorders, Sources, render
from tests.support.node import NodeFixture, key


def sources(engine: Engine, **extra: object) -> Sources:
    fields: dict[str, object] = {
        "snapshot": engine.snapshot,
        "max_enis": 3,
        "max_addresses": 29,
        "job_outcomes": dict,
        "leaks_released": int,
        "pool_failures": dict,
    }
    fields.update(extra)
    return Sources(**fields)  # type: ignore[arg-type]


def family_name(name: str) -> str:
    """The name prometheus_client's parser gives the family of a catalogued metric."""
    return name.removesuffix("_total") if SPECS[name].type == "counter" else name


def scrape(recorders: Recorders, src: Sources) -> dict[str, Metric]:
    return {f.name: f for f in text_string_to_metric_families(render(recorders, src))}


def value(families: dict[str, Metric], name: str, **labels: str) -> float:
    family = families[family_name(name)]
    wanted = name if SPECS[name].type != "counter" else family.name + "_total"
    found = [s.value for s in family.samples if s.name == wanted and s.labels == labels]
    assert len(found) == 1, (name, labels, family.samples)
    return found[0]


async def test_every_catalogued_metric_is_published_with_its_type_and_labels(
    node: NodeFixture,
) -> None:
    await node.seed(enis=1, per_eni=2)
    engine = node.engine
    assert engine is not None
    await engine.assign(key("a"))
    recorders = Recorders()
    recorders.record("AssignPrivateIpAddresses", "ok", 0.01, 1)
    recorders.record("AssignPrivateIpAddresses", "RequestLimitExceeded", 0.01, 2)
    recorders.add_done(0.002, None)
    recorders.del_done(0.001)
    recorders.started(True, 3.0, 1.0)
    src = sources(
        engine,
        job_outcomes=lambda: {("ec2_drift", "ok"): 1},
        pool_failures=lambda: {"InsufficientFreeAddressesInSubnet": 1},
        hostnet_fixes=lambda: {"rule_added": 1},
        actions_in_progress=lambda: {"nodeInit": 0},
        subnet_free=lambda: 40,
        network_policy_calls=lambda: {("enforce", "ok"): 1},
        max_pods_rule="kubelet",
    )
    families = scrape(recorders, src)
    assert set(families) == {family_name(s.name) for s in CATALOGUE}, "nothing else, no _created"
    for spec in CATALOGUE:
        family = families[family_name(spec.name)]
        assert family.type == spec.type, spec.name
        assert family.samples, f"{spec.name} has a series in this scrape"
        for sample in family.samples:
            assert set(sample.labels) - {"le", "quantile"} == set(spec.labels), sample


async def test_pool_gauges_count_one_snapshot(node: NodeFixture) -> None:
    layout = await node.seed(enis=2, per_eni=3)
    engine = node.engine
    assert engine is not None
    first = await engine.assign(key("a"))
    await engine.assign(key("b"))
    await engine.assign(key("c"))
    await engine.release(key("c"))  # cooling: on the node, not assigned
    taken: list[PoolSnapshot] = []

    def snapshot() -> PoolSnapshot:
        taken.append(engine.snapshot())
        return taken[-1]

    families = scrape(Recorders(), sources(engine, snapshot=snapshot))
    assert len(taken) == 1, "one snapshot per scrape"
    assert value(families, "awscni_assigned_ip_addresses") == 2
    assert value(families, "awscni_total_ip_addresses") == 6
    assert value(families, "awscni_eni_allocated") == 2
    assert value(families, "awscni_total_ipv4_prefixes") == 0
    assert value(families, "awscni_eni_max") == 3 and value(families, "awscni_ip_max") == 29
    assert "ipamd_max_pods" not in families or not families["ipamd_max_pods"].samples
    ruled = scrape(Recorders(), sources(engine, max_pods_rule="secondary-ip-formula"))
    assert value(ruled, "ipamd_max_pods", rule="secondary-ip-formula") == 29
    per_eni = {
        eni: value(families, "awscni_assigned_ip_per_eni", eni=eni)
        for eni in ("eni-0000", "eni-0001")
    }
    assert sum(per_eni.values()) == 2
    per_cidr = {c: value(families, "awscni_assigned_ip_per_cidr", cidr=c) for c in layout[0]}
    assert per_cidr[first.unit_cidrs[0]] == 1
    assert value(families, "ipamd_addresses", state="cooling") == 1
    assert value(families, "ipamd_addresses", state="free") == 3
    assert value(families, "ipamd_delete_intents") == 1


async def test_prefixes_are_counted_and_their_addresses_per_cidr(node: NodeFixture) -> None:
    [cidrs] = await node.seed(enis=1, per_eni=2, kind="prefix")
    engine = node.engine
    assert engine is not None
    record = await engine.assign(key("a"))
    families = scrape(Recorders(), sources(engine))
    assert value(families, "awscni_total_ipv4_prefixes") == 2
    assert value(families, "awscni_total_ip_addresses") == 32
    other = next(c for c in cidrs if c != record.unit_cidrs[0])
    assert value(families, "awscni_assigned_ip_per_cidr", cidr=record.unit_cidrs[0]) == 1
    assert value(families, "awscni_assigned_ip_per_cidr", cidr=other) == 0


async def test_vpc_cni_counters_keep_their_names(node: NodeFixture) -> None:
    await node.seed()
    assert node.engine is not None
    recorders = Recorders()
    recorders.add_done(0.001, None)
    text = render(recorders, sources(node.engine))
    assert "# TYPE awscni_add_ip_req_count counter\n" in text
    assert "\nawscni_add_ip_req_count 1.0\n" in text
    assert "awscni_add_ip_req_count_total" not in text
    assert "# TYPE ipamd_leaked_allocations_released_total counter\n" in text
    assert "_created" not in text


async def test_daemon_counters_map_to_vpc_cni_names(node: NodeFixture) -> None:
    await node.seed()
    assert node.engine is not None
    outcomes = {("ec2_drift", "ok"): 3, ("ec2_drift", "CloudError"): 1, ("leak_gc", "ok"): 2}
    src = sources(
        node.engine,
        job_outcomes=lambda: outcomes,
        pool_failures=lambda: {"RequestLimitExceeded": 2, "InsufficientCidrBlocks": 1},
        hostnet_add_failures=lambda: 4,
        hostnet_reconciles=lambda: {"ok": 5, "failed": 1, "unreadable": 1},
        actions_in_progress=lambda: {"nodeInit": 1, "increaseDatastorePool": 0},
        connmark_backend="nftables",
        network_policy_calls=lambda: {("enforce", "ok"): 2, ("delete", "unavailable"): 1},
    )
    families = scrape(Recorders(), src)
    assert value(families, "awscni_reconcile_count", fn="ec2_drift") == 4
    assert value(families, "awscni_reconcile_count", fn="leak_gc") == 2
    assert value(families, "awscni_ipamd_error_count", fn="ec2_drift") == 1
    assert value(families, "awscni_ipamd_error_count", fn="leak_gc") == 0
    assert value(families, "awscni_ipamd_error_count", fn="pool") == 3
    assert value(families, "awscni_ipamd_error_count", fn="hostnet_add") == 4
    assert value(families, "awscni_ipamd_action_inprogress", fn="nodeInit") == 1
    assert value(families, "awscni_connmark_backend", backend="nftables") == 1
    assert value(families, "awscni_connmark_reconcile_total", result="success") == 5
    assert value(families, "awscni_connmark_reconcile_total", result="error") == 2
    assert value(families, "ipamd_reconcile_runs_total", job="ec2_drift", outcome="CloudError") == 1
    np_calls = "ipamd_network_policy_calls_total"
    assert value(families, np_calls, call="enforce", outcome="ok") == 2
    assert value(families, np_calls, call="delete", outcome="unavailable") == 1
    [build] = families["awscni_build_info"].samples
    assert build.value == 1 and build.labels["version"]


async def test_whether_new_pods_are_enforced_is_a_gauge(node: NodeFixture) -> None:
    await node.seed()
    assert node.engine is not None
    enforced = {"now": False}
    src = sources(node.engine, network_policy_enforced=lambda: enforced["now"])
    assert value(scrape(Recorders(), src), "ipamd_network_policy_enforced") == 0
    enforced["now"] = True  # the agent's socket appeared, read at the next scrape
    assert value(scrape(Recorders(), src), "ipamd_network_policy_enforced") == 1


async def test_each_daemon_has_its_own_registry(node: NodeFixture) -> None:
    await node.seed()
    assert node.engine is not None
    one, two = Recorders(), Recorders()
    one.record("DescribeNetworkInterfaces", "ok", 0.01, 1)
    src = sources(node.engine)
    assert value(scrape(one, src), "awscni_ec2api_req_count", fn="DescribeNetworkInterfaces") == 1
    assert not scrape(two, src)["awscni_ec2api_req_count"].samples


async def test_the_pools_modes_are_gauges_and_the_free_count_shows_once_read(
    node: NodeFixture,
) -> None:
    await node.seed()
    assert node.engine is not None
    unread = scrape(Recorders(), sources(node.engine))
    assert unread["ipamd_subnet_free_addresses"].samples == [], "no series before a reading"
    assert value(unread, "ipamd_subnet_scarce") == 0
    assert value(unread, "ipamd_prefix_fallback") == 0
    src = sources(
        node.engine,
        subnet_free=lambda: 17,
        subnet_scarce=lambda: True,
        prefix_fallback=lambda: True,
    )
    families = scrape(Recorders(), src)
    assert value(families, "ipamd_subnet_free_addresses") == 17
    assert value(families, "ipamd_subnet_scarce") == 1
    assert value(families, "ipamd_prefix_fallback") == 1
