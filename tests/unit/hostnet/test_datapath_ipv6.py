"""The host-network owner in IPv6 mode, on the fakes: IPv6 pods need no policy rule and no connmark
(they live on the primary ENI, in main), and the SNAT table only takes IPv6 pods' IPv4 egress range
to the node's IPv4, whatever the IPv4 SNAT settings say; a restart's first reconcile puts it back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

import pytest

from datastore.records import EniRecord
from ipamd.config.groups import DatapathSettings
from ipamd.engine.engine import Engine
from ipamd.engine.pick_v6 import pick_v6_addresses
from ipamd.hostnet.datapath import Datapath
from ipamd.hostnet.fake import FakeHostNetwork, FakeSnatTable
from ipamd.hostnet.snat_modes import EGRESS_SNAT
from ipamd.wire.pod import V4_EGRESS_CIDR
from tests.support.node import NodeFixture, key

PRIMARY_MAC = "02:00:00:00:00:00"
NODE_IP = "10.0.0.5"
PREFIX = "2600:1f14:abc:d00:1234::/80"


@dataclass
class Host:
    engine: Engine
    datapath: Datapath
    kernel: FakeHostNetwork
    snat: FakeSnatTable


async def _no_subnet(subnet_id: str) -> str:
    raise AssertionError("IPv6 mode sets up no secondary ENI")


async def _no_vpc_cidrs(mac: str) -> tuple[str, ...]:
    raise AssertionError("IPv6 mode's SNAT exempts nothing: the VPC's CIDRs are not read")


def _datapath(
    engine: Engine, kernel: FakeHostNetwork, snat: FakeSnatTable, node: NodeFixture, **kw: bool
) -> Datapath:
    settings = DatapathSettings(**kw)  # type: ignore[arg-type]
    return Datapath(
        engine,
        kernel,
        snat,
        settings,
        mode=EGRESS_SNAT,
        node_ip=NODE_IP,
        subnet_cidr=_no_subnet,
        vpc_cidrs=_no_vpc_cidrs,
        clock=node.clock,
    )


@pytest.fixture
async def host(node: NodeFixture) -> AsyncIterator[Host]:
    node.settings = replace(node.settings, pick=pick_v6_addresses)  # an IPv6 node's pick
    engine = await node.open()
    kernel, snat = FakeHostNetwork(), FakeSnatTable()
    kernel.plug(PRIMARY_MAC, "eth0")
    primary = EniRecord("eni-0", 0, "subnet-1", True, 0.0, mac=PRIMARY_MAC, primary_ip=NODE_IP)
    await engine.add_eni(primary)
    await engine.add_units("eni-0", [PREFIX], "ipv6_prefix")
    yield Host(engine, _datapath(engine, kernel, snat, node), kernel, snat)


async def test_an_ipv6_pod_is_answered_with_no_policy_rule_and_no_connmark(host: Host) -> None:
    await host.datapath.reconcile()

    record = await host.datapath.add(key("pod"), None)
    await host.datapath.reconcile()

    assert ":" in record.addresses[0]
    assert host.kernel.rules == set(), "main holds the pod's /128 route; no rule is ipamd's"
    assert await host.datapath.release(key("pod"))
    assert host.kernel.rules == set()


async def test_the_snat_table_takes_only_the_egress_range_to_the_node_ipv4(host: Host) -> None:
    await host.datapath.reconcile()

    plan = host.snat.plan
    assert plan is not None
    assert (plan.egress_cidr, plan.primary_ip, plan.exempt_cidrs) == (V4_EGRESS_CIDR, NODE_IP, ())


async def test_external_snat_does_not_remove_ipv6_pods_egress(node: NodeFixture) -> None:
    engine = await node.open()
    kernel, snat = FakeHostNetwork(), FakeSnatTable()
    kernel.plug(PRIMARY_MAC, "eth0")
    await engine.add_eni(
        EniRecord("eni-0", 0, "subnet-1", True, 0.0, mac=PRIMARY_MAC, primary_ip=NODE_IP)
    )
    datapath = _datapath(engine, kernel, snat, node, external_snat=True)

    await datapath.reconcile()

    assert snat.plan is not None and snat.plan.egress_cidr == V4_EGRESS_CIDR
    assert snat.removes == 0


async def test_a_restart_puts_a_vanished_egress_table_back_on_its_first_reconcile(
    host: Host, node: NodeFixture
) -> None:
    await host.datapath.reconcile()
    await host.datapath.add(key("pod"), None)
    gone = FakeSnatTable()  # a reboot: the kernel's table is gone
    engine = await node.restart()

    await _datapath(engine, host.kernel, gone, node).reconcile()

    assert gone.plan is not None and gone.plan.egress_cidr == V4_EGRESS_CIDR
    assert gone.changes == 1
