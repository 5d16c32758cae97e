"""The host-network owner on the fakes: ENI setup before an ENI's addresses are handed out, a pod's
rules before its ADD is answered and gone after every release path, reconcile by content, and a
kernel that cannot be read deleting nothing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest

from datastore.records import EniRecord
from ipamd.api import views
from ipamd.cli.ipamctl import render_status
from ipamd.clock import FakeClock
from ipamd.config.groups import DatapathSettings
from ipamd.engine.engine import Engine
from ipamd.errors import DatapathUnavailable, DeleteIntentActive, NoAddressAvailable
from ipamd.hostnet.datapath import BLOCKED_NEW, Datapath
from ipamd.hostnet.fake import FakeHostNetwork, FakeSnatTable
from ipamd.hostnet.kernel_plan import CONNMARK_RULE
from ipamd.hostnet.ports import (
    MAIN_TABLE,
    PRIORITY_FROM_ENI,
    PRIORITY_FROM_POD,
    PRIORITY_TO_POD,
    KernelUnreadable,
    Route,
    Rule,
)
from ipamd.reconcile.leaks import release_invalid_attachments
from ipamd.reconcile.repair import apply_repair, plan_repair
from ipamd.telemetry.metrics import Recorders, Sources, render
from tests.support.node import NodeFixture, key

SUBNET = "10.0.0.0/24"
GATEWAY = "10.0.0.1"
PRIMARY_MAC = "02:00:00:00:00:00"
SECONDARY_MAC = "02:00:00:00:00:01"
NODE_IP = "10.0.0.5"


def to_pod(address: str) -> Rule:
    return Rule(PRIORITY_TO_POD, MAIN_TABLE, dst=f"{address}/32")


def from_pod(address: str, table: int) -> Rule:
    return Rule(PRIORITY_FROM_POD, table, src=f"{address}/32")


@dataclass
class Host:
    engine: Engine
    datapath: Datapath
    kernel: FakeHostNetwork
    snat: FakeSnatTable
    clock: FakeClock
    subnet_lookups: list[str]


async def _vpc_cidrs(mac: str) -> tuple[str, ...]:
    assert mac == PRIMARY_MAC, "the VPC's CIDRs are read by the primary ENI's MAC"
    return ("10.0.0.0/16",)


async def _seed(engine: Engine, now: float) -> None:
    await engine.add_eni(
        EniRecord("eni-0", 0, "subnet-1", True, now, mac=PRIMARY_MAC, primary_ip=NODE_IP)
    )
    await engine.add_units("eni-0", ["10.0.0.10/32", "10.0.0.11/32"], "ip")
    await engine.add_eni(
        EniRecord("eni-1", 1, "subnet-1", False, now, mac=SECONDARY_MAC, primary_ip="10.0.0.20")
    )
    await engine.add_units("eni-1", ["10.0.0.21/32", "10.0.0.22/32"], "ip")


def _datapath(
    engine: Engine,
    kernel: FakeHostNetwork,
    snat: FakeSnatTable,
    clock: FakeClock,
    lookups: list[str],
    rp_filter: Callable[[str], int] | None = None,
    **settings: object,
) -> Datapath:
    async def subnet_cidr(subnet_id: str) -> str:
        lookups.append(subnet_id)
        return SUBNET

    return Datapath(
        engine,
        kernel,
        snat,
        DatapathSettings(**settings),  # type: ignore[arg-type]
        node_ip=NODE_IP,
        subnet_cidr=subnet_cidr,
        vpc_cidrs=_vpc_cidrs,
        clock=clock,
        rp_filter=rp_filter,
    )


@pytest.fixture
async def host(node: NodeFixture) -> AsyncIterator[Host]:
    engine = await node.open()
    kernel, snat, lookups = FakeHostNetwork(), FakeSnatTable(), list[str]()
    kernel.plug(PRIMARY_MAC, "eth0")
    datapath = _datapath(engine, kernel, snat, node.clock, lookups)
    await _seed(engine, node.clock.now())
    yield Host(engine, datapath, kernel, snat, node.clock, lookups)


async def _fill_primary(host: Host) -> None:
    for n in range(2):
        record = await host.datapath.add(key(f"p{n}"), None)
        assert record.eni_id == "eni-0"


async def test_a_secondary_enis_addresses_wait_for_its_link(host: Host) -> None:
    await _fill_primary(host)
    assert host.engine.blocked_enis == {"eni-1": BLOCKED_NEW}
    with pytest.raises(NoAddressAvailable):
        await host.datapath.add(key("waits"), None)

    await host.datapath.setup_enis()  # the kernel does not show the link yet
    assert "eni-1" in host.engine.blocked_enis
    assert "no link with MAC" in host.engine.blocked_enis["eni-1"]
    view = {e.eni_id: e.blocked for e in host.engine.snapshot().enis}
    assert view == {"eni-0": "", "eni-1": host.engine.blocked_enis["eni-1"]}

    host.kernel.plug(SECONDARY_MAC, "eth1")
    await host.datapath.setup_enis()
    assert "eni-1" in host.engine.blocked_enis, "retried with backoff, not at once"
    host.clock.advance(60)
    await host.datapath.setup_enis()

    assert host.engine.blocked_enis == {}
    link = host.kernel.links[SECONDARY_MAC]
    assert (link.mtu, link.up, link.addresses) == (9001, True, {"10.0.0.20/24"})
    assert not link.connected_route, "main's connected route for the subnet left the link"
    assert host.kernel.routes == {
        Route(2, f"{GATEWAY}/32", "eth1"),
        Route(2, "0.0.0.0/0", "eth1", GATEWAY),
    }
    assert Rule(PRIORITY_FROM_ENI, 2, src="10.0.0.20/32") in host.kernel.rules
    record = await host.datapath.add(key("served"), None)
    assert record.eni_id == "eni-1"
    address = record.addresses[0]
    assert {to_pod(address), from_pod(address, 2)} <= host.kernel.rules
    assert host.subnet_lookups == ["subnet-1"], "the subnet's CIDR is read once"


async def test_an_add_answers_only_with_its_rules_in_place(host: Host) -> None:
    record = await host.datapath.add(key("a"), None)
    assert record.eni_id == "eni-0"
    assert to_pod(record.addresses[0]) in host.kernel.rules
    assert not any(r.priority == PRIORITY_FROM_POD for r in host.kernel.rules), (
        "a pod on the primary ENI leaves by main"
    )


async def test_an_add_whose_rules_fail_leaves_no_allocation_and_can_be_retried(
    host: Host,
) -> None:
    host.kernel.fail_writes = True
    with pytest.raises(DatapathUnavailable) as caught:
        await host.datapath.add(key("a"), None)
    assert caught.value.retryable and caught.value.code == "datapath_unavailable"
    assert host.engine.state.allocations() == {}
    assert host.engine.state.intents() == {}, "no delete intent: the same ADD may come again"
    assert host.engine.state.cooldowns() == {}, "no pod used the address: no cooldown"

    host.kernel.fail_writes = False
    again = await host.datapath.add(key("a"), None)
    assert to_pod(again.addresses[0]) in host.kernel.rules


async def _on_secondary(host: Host, container: str) -> str:
    await host.datapath.reconcile()
    while True:
        record = await host.datapath.add(key(container), None)
        if record.eni_id == "eni-1":
            return record.addresses[0]
        container += "+"


async def test_del_removes_the_pods_rules_before_answering(host: Host) -> None:
    host.kernel.plug(SECONDARY_MAC, "eth1")
    address = await _on_secondary(host, "s")
    (container,) = [
        k.container_id
        for k, a in host.engine.state.allocations().items()
        if a.addresses == (address,)
    ]
    await host.datapath.release(key(container))
    assert to_pod(address) not in host.kernel.rules
    assert from_pod(address, 2) not in host.kernel.rules
    with pytest.raises(DeleteIntentActive):
        await host.datapath.add(key(container), None)


async def test_leak_gc_cni_gc_and_repair_remove_rules_too(host: Host) -> None:
    host.kernel.plug(SECONDARY_MAC, "eth1")
    await host.datapath.reconcile()
    records = [await host.datapath.add(key(f"c{n}"), None) for n in range(4)]
    addresses = {r.key.container_id: r.addresses[0] for r in records}
    host.clock.advance(1000)

    await host.engine.release(key("c0"))  # as the runtime leak GC releases
    await release_invalid_attachments(  # CNI GC: only c2 and c3 are valid
        host.engine, "k8s-pod-network", [("c2", "eth0"), ("c3", "eth0")], 0.0, host.clock
    )
    plan = plan_repair(host.engine.state, frozenset({"c3"}), host.clock.now())
    await apply_repair(host.engine, plan)
    await host.datapath.settle()

    gone = {addresses["c0"], addresses["c1"], addresses["c2"]}
    assert not {r for r in host.kernel.rules if r.src[:-3] in gone or r.dst[:-3] in gone}
    assert to_pod(addresses["c3"]) in host.kernel.rules


async def test_reconcile_makes_the_kernel_exactly_the_plan_by_content(host: Host) -> None:
    host.kernel.plug(SECONDARY_MAC, "eth1")
    address = await _on_secondary(host, "s")
    planned = set(host.kernel.rules)
    routes = set(host.kernel.routes)
    stale = from_pod("10.0.0.250", 2)
    host.kernel.rules.discard(from_pod(address, 2))
    host.kernel.rules.add(stale)
    host.kernel.routes.add(Route(7, "0.0.0.0/0", "eth1", GATEWAY))
    foreign = set(host.kernel.foreign_rules)
    fixed_before = dict(host.datapath.health.fixes)

    diff = await host.datapath.reconcile()
    assert diff.add_rules == {from_pod(address, 2)}
    assert diff.delete_rules == {stale}
    assert diff.delete_routes == {Route(7, "0.0.0.0/0", "eth1", GATEWAY)}
    assert host.kernel.rules == planned and host.kernel.routes == routes
    assert host.kernel.foreign_rules == foreign
    assert CONNMARK_RULE in host.kernel.rules
    fixes = host.datapath.health.fixes
    assert fixes["rule_added"] == fixed_before.get("rule_added", 0) + 1
    assert fixes["rule_removed"] == fixed_before.get("rule_removed", 0) + 1

    again = await host.datapath.reconcile()
    assert again.is_empty(), "a second round changes nothing"


async def test_a_kernel_that_cannot_be_read_deletes_nothing(host: Host) -> None:
    await host.datapath.reconcile()
    stale = to_pod("10.0.0.99")
    host.kernel.rules.add(stale)
    host.kernel.unreadable = True
    with pytest.raises(KernelUnreadable):
        await host.datapath.reconcile()
    assert stale in host.kernel.rules
    assert host.datapath.health.reconciles["failed"] == 1
    host.kernel.unreadable = False
    await host.datapath.reconcile()
    assert stale not in host.kernel.rules


async def test_a_detached_eni_takes_its_table_and_rule_away(host: Host) -> None:
    host.kernel.plug(SECONDARY_MAC, "eth1")
    await host.datapath.reconcile()
    assert Rule(PRIORITY_FROM_ENI, 2, src="10.0.0.20/32") in host.kernel.rules
    await host.engine.eni_gone("eni-1")
    await host.datapath.settle()
    assert Rule(PRIORITY_FROM_ENI, 2, src="10.0.0.20/32") not in host.kernel.rules
    host.kernel.unplug(SECONDARY_MAC)
    await host.datapath.reconcile()
    assert not any(r.table == 2 for r in host.kernel.rules)
    assert not any(r.table == 2 for r in host.kernel.routes)


async def test_snat_follows_the_settings(node: NodeFixture) -> None:
    engine = await node.open()
    await _seed(engine, node.clock.now())
    kernel, snat = FakeHostNetwork(), FakeSnatTable()
    kernel.plug(PRIMARY_MAC, "eth0")
    kernel.plug(SECONDARY_MAC, "eth1")
    datapath = _datapath(
        engine, kernel, snat, node.clock, [], exclude_snat_cidrs=("192.168.0.0/16",)
    )
    await datapath.reconcile()
    assert snat.plan is not None
    assert snat.plan.primary_ip == NODE_IP and snat.plan.primary_ifname == "eth0"
    assert set(snat.plan.eni_ifnames) == {"eth0", "eth1"}
    assert snat.plan.exempt_cidrs == ("10.0.0.0/16", "192.168.0.0/16")
    snat.tamper()
    await datapath.reconcile()
    assert snat.changes == 2, "a hand-edited table is replaced"

    assert snat.plan.snat and snat.plan.node_port, "AWS_VPC_CNI_NODE_PORT_SUPPORT defaults to true"

    external = _datapath(engine, kernel, snat, node.clock, [], external_snat=True)
    await external.reconcile()
    inbound_only = snat.plan
    assert inbound_only is not None and snat.removes == 0
    assert not inbound_only.snat and inbound_only.node_port, "external SNAT: inbound marks only"
    assert CONNMARK_RULE in kernel.rules, "marked replies still route by main"

    unmarked = _datapath(
        engine, kernel, snat, node.clock, [], external_snat=True, node_port_support=False
    )
    await unmarked.reconcile()
    assert snat.removes == 1, "external SNAT without node port support: no table"
    assert CONNMARK_RULE not in kernel.rules


async def test_strict_reverse_path_filtering_is_said_while_inbound_is_marked(
    node: NodeFixture, caplog: pytest.LogCaptureFixture
) -> None:
    engine = await node.open()
    await _seed(engine, node.clock.now())
    kernel, snat = FakeHostNetwork(), FakeSnatTable()
    kernel.plug(PRIMARY_MAC, "eth0")
    filtering = {"eth0": 1}
    datapath = _datapath(engine, kernel, snat, node.clock, [], rp_filter=filtering.__getitem__)
    await datapath.reconcile()
    assert datapath.health.rp_filter_strict == "eth0"
    (reason,) = datapath.health.degraded()
    assert "rp_filter" in reason and "eth0" in reason
    assert sum("hostnet.rp_filter_strict" in r.message for r in caplog.records) == 1
    await datapath.reconcile()
    assert sum("hostnet.rp_filter_strict" in r.message for r in caplog.records) == 1, "said once"
    filtering["eth0"] = 2
    await datapath.reconcile()
    assert datapath.health.rp_filter_strict == "" and datapath.health.degraded() == ()

    filtering["eth0"] = 1
    off = _datapath(
        engine,
        kernel,
        snat,
        node.clock,
        [],
        rp_filter=filtering.__getitem__,
        node_port_support=False,
    )
    await off.reconcile()
    assert off.health.degraded() == (), "nothing inbound is marked: strict filtering breaks nothing"


async def test_a_blocked_eni_shows_in_the_api_ipamctl_and_metrics(host: Host) -> None:
    snapshot = host.engine.snapshot()
    listed = views.enis(snapshot)["enis"]
    assert isinstance(listed, list)
    enis = {e["eni_id"]: e for e in listed}
    assert enis["eni-0"]["datapath"] == "ready" and enis["eni-0"]["mac"] == PRIMARY_MAC
    assert enis["eni-1"]["datapath"] == "blocked"
    assert enis["eni-1"]["datapath_reason"] == BLOCKED_NEW
    status = render_status(views.pool(snapshot))
    assert "blocked ENIs" in status and f"eni-1: {BLOCKED_NEW}" in status
    sources = Sources(
        snapshot=host.engine.snapshot,
        max_enis=3,
        max_addresses=29,
        job_outcomes=dict,
        leaks_released=int,
        pool_failures=dict,
        hostnet_fixes=lambda: host.datapath.health.fixes,
    )
    assert "ipamd_enis_blocked 1.0\n" in render(Recorders(), sources)

    host.kernel.plug(SECONDARY_MAC, "eth1")
    await host.datapath.reconcile()
    text = render(Recorders(), sources)
    assert "ipamd_enis_blocked 0.0\n" in text
    assert 'ipamd_hostnet_fixes_total{kind="rule_added"} 1.0\n' in text  # the connmark rule


async def test_the_loop_sets_up_an_attached_eni_at_once_and_then_sleeps(host: Host) -> None:
    """An ENI attached while the loop runs is set up without waiting for the reconcile, and with
    nothing pending the loop waits instead of spinning."""
    host.kernel.plug(SECONDARY_MAC, "eth1")
    loop = asyncio.create_task(host.datapath.run())
    try:
        for _ in range(50):
            if not host.engine.blocked_enis:
                break
            await asyncio.sleep(0)
        assert host.engine.blocked_enis == {}
        calls = host.kernel.calls
        for _ in range(50):
            await asyncio.sleep(0)
        assert host.kernel.calls == calls, "nothing to do: the loop is idle"
        mac = "02:00:00:00:00:02"
        host.kernel.plug(mac, "eth2")
        await host.engine.add_eni(
            EniRecord(
                "eni-2", 2, "subnet-1", False, host.clock.now(), mac=mac, primary_ip="10.0.0.30"
            )
        )
        assert "eni-2" in host.engine.blocked_enis, "blocked from the commit that brings it in"
        for _ in range(50):
            if "eni-2" not in host.engine.blocked_enis:
                break
            await asyncio.sleep(0)
        assert "eni-2" not in host.engine.blocked_enis
        assert Route(3, "0.0.0.0/0", "eth2", GATEWAY) in host.kernel.routes
    finally:
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop
