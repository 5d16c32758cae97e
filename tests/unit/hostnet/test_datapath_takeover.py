"""The datapath taking a node over from aws-node, on the fakes: the engine's state already holds the
adopted pods; the fake kernel holds VPC CNI's rules, routes and SNAT chains as aws-node leaves them.
A reconcile installs ipamd's rules, then removes VPC CNI's twins (never leaving a live pod without a
rule), claims the ENI table's routes, removes aws-node's chains only once ipamd's table is live, and
a second reconcile changes nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass

import pytest

from datastore.records import EniRecord
from ipamd.config.groups import DatapathSettings
from ipamd.engine.engine import Engine
from ipamd.hostnet.datapath import Datapath
from ipamd.hostnet.fake import INBOUND_MARK, FakeAwsNodeSnat, FakeHostNetwork, FakeSnatTable
from ipamd.hostnet.kernel_plan import CONNMARK_RULE
from ipamd.hostnet.ports import (
    MAIN_TABLE,
    PRIORITY_FROM_ENI,
    PRIORITY_FROM_POD,
    PRIORITY_TO_POD,
    HostNetError,
    Route,
    Rule,
)
from tests.support.node import NodeFixture, key

SUBNET = "10.0.0.0/24"
PRIMARY_MAC = "02:00:00:00:00:00"
SECONDARY_MAC = "02:00:00:00:00:01"
NODE_IP = "10.0.0.5"
ENI_IP = "10.0.0.20"
KERNEL_DEFAULTS = {Rule(0, 255), Rule(32766, 254), Rule(32767, 253)}
SOMEONE_ELSES = Rule(PRIORITY_TO_POD, MAIN_TABLE, dst="192.168.5.5/32")
INBOUND = f"{INBOUND_MARK}: iifname eth0 fib daddr . iif type local ct mark set ct mark or 0x80"
"""aws-node's mark of connections to the node arriving on the primary ENI (NodePort, hostPort)."""
CHAINS = ("ip nat chain AWS-SNAT-CHAIN-0", "ip nat chain AWS-CONNMARK-CHAIN-0", INBOUND)


def to_pod(address: str) -> Rule:
    return Rule(PRIORITY_TO_POD, MAIN_TABLE, dst=f"{address}/32")


def from_pod(address: str) -> Rule:
    return Rule(PRIORITY_FROM_POD, 2, src=f"{address}/32")


ENI_ROUTES = {Route(2, "10.0.0.1/32", "eth1"), Route(2, "0.0.0.0/0", "eth1", "10.0.0.1")}
FROM_ENI = Rule(PRIORITY_FROM_ENI, 2, src=f"{ENI_IP}/32")


class WatchedKernel(FakeHostNetwork):
    """A fake kernel that checks, after every change, that every live pod still has a rule to it
    (ipamd's or VPC CNI's): the moment without one is what the takeover must never make."""

    def __init__(self) -> None:
        super().__init__()
        self.live: set[str] = set()
        self.gaps: list[str] = []

    async def delete_rules(self, rules: Collection[Rule], *, foreign: bool = False) -> None:
        await super().delete_rules(rules, foreign=foreign)
        present = self.rules | self.foreign_rules
        self.gaps += [a for a in sorted(self.live) if to_pod(a) not in present]


@dataclass
class Node:
    engine: Engine
    datapath: Datapath
    kernel: WatchedKernel
    snat: FakeSnatTable
    aws: FakeAwsNodeSnat
    pods: dict[str, str]
    """Container ID → address, of the adopted pods."""


async def _subnet(_: str) -> str:
    return SUBNET


async def _vpc(_: str) -> tuple[str, ...]:
    return ("10.0.0.0/16",)


async def _node(node: NodeFixture, **settings: object) -> Node:
    engine = await node.open()
    kernel, snat, aws = WatchedKernel(), FakeSnatTable(), FakeAwsNodeSnat(*CHAINS)
    kernel.plug(PRIMARY_MAC, "eth0")
    kernel.plug(SECONDARY_MAC, "eth1")
    datapath = Datapath(
        engine,
        kernel,
        snat,
        DatapathSettings(**settings),  # type: ignore[arg-type]
        node_ip=NODE_IP,
        subnet_cidr=_subnet,
        vpc_cidrs=_vpc,
        clock=node.clock,
        aws_node_snat=aws,
    )
    now = node.clock.now()
    await engine.add_eni(EniRecord("eni-0", 0, "s", True, now, mac=PRIMARY_MAC, primary_ip=NODE_IP))
    await engine.add_units("eni-0", ["10.0.0.10/32"], "ip")
    await engine.add_eni(
        EniRecord("eni-1", 1, "s", False, now, mac=SECONDARY_MAC, primary_ip=ENI_IP)
    )
    await engine.add_units("eni-1", ["10.0.0.21/32", "10.0.0.22/32"], "ip")
    await datapath.setup_enis(force=True)
    # The adopted pods: allocations in the state, no rule of ipamd's yet (the lead's adoption).
    pods = {}
    for name in ("on-primary", "on-secondary"):
        record = await engine.assign(key(name))
        pods[name] = record.addresses[0]
    assert pods == {"on-primary": "10.0.0.10", "on-secondary": "10.0.0.21"}
    kernel.rules.clear()
    kernel.routes.clear()
    # What aws-node leaves: its rules (10.0.0.22's pod is gone), routes and chains.
    kernel.foreign_rules |= {
        to_pod("10.0.0.10"),
        to_pod("10.0.0.21"),
        from_pod("10.0.0.21"),
        to_pod("10.0.0.22"),
        from_pod("10.0.0.22"),
        CONNMARK_RULE,
        FROM_ENI,
        SOMEONE_ELSES,
    }
    kernel.foreign_routes |= ENI_ROUTES
    kernel.live = set(pods.values())
    return Node(engine, datapath, kernel, snat, aws, pods)


@pytest.fixture
async def taken(node: NodeFixture) -> AsyncIterator[Node]:
    yield await _node(node)


OURS = {
    to_pod("10.0.0.10"),
    to_pod("10.0.0.21"),
    from_pod("10.0.0.21"),
    CONNMARK_RULE,
    FROM_ENI,
}


async def test_a_reconcile_replaces_vpc_cnis_rules_routes_and_chains(taken: Node) -> None:
    await taken.datapath.reconcile()

    assert taken.kernel.rules == OURS
    assert taken.kernel.foreign_rules == KERNEL_DEFAULTS | {SOMEONE_ELSES}
    assert taken.kernel.routes == ENI_ROUTES
    assert taken.kernel.foreign_routes == set(), "claimed in place: ipamd's now"
    assert taken.kernel.gaps == [], "a live pod was left without a rule to it"
    assert taken.snat.plan is not None
    assert taken.aws.chains == set()
    assert taken.datapath.health.fixes["takeover_rule_removed"] == 7
    assert taken.datapath.health.fixes["takeover_snat_removed"] == len(CHAINS)
    assert not taken.datapath.health.takeover_failures

    before = (set(taken.kernel.rules), set(taken.kernel.foreign_rules), set(taken.kernel.routes))
    fixes = dict(taken.datapath.health.fixes)
    diff = await taken.datapath.reconcile()
    assert diff.is_empty()
    after = (set(taken.kernel.rules), set(taken.kernel.foreign_rules), set(taken.kernel.routes))
    assert after == before
    assert dict(taken.datapath.health.fixes) == fixes, "a second pass changes nothing"


async def test_a_foreign_listing_that_fails_removes_nothing_of_vpc_cnis(taken: Node) -> None:
    taken.kernel.unreadable_foreign = True
    await taken.datapath.reconcile()
    assert taken.kernel.rules == OURS, "ipamd's own go in all the same"
    assert to_pod("10.0.0.22") in taken.kernel.foreign_rules
    assert taken.datapath.health.takeover_failures["unreadable"] == 1

    taken.kernel.unreadable_foreign = False
    await taken.datapath.reconcile()
    assert taken.kernel.foreign_rules == KERNEL_DEFAULTS | {SOMEONE_ELSES}


async def test_aws_nodes_chains_stay_until_ipamds_table_is_live(taken: Node) -> None:
    taken.snat.fail_apply = True
    with pytest.raises(HostNetError):
        await taken.datapath.reconcile()
    assert taken.aws.chains == set(CHAINS)
    assert taken.aws.passes == 0, "not even looked at before ipamd's table is there"

    taken.snat.fail_apply = False
    await taken.datapath.reconcile()
    assert taken.snat.plan is not None
    assert taken.aws.chains == set()


async def test_a_failed_removal_is_logged_and_retried_by_the_next_reconcile(taken: Node) -> None:
    taken.aws.fail = "injected: nft refused"
    await taken.datapath.reconcile()  # does not fail: ipamd's own side is done
    assert taken.aws.chains == set(CHAINS)
    assert taken.datapath.health.takeover_failures["snat"] == 1

    taken.aws.fail = ""
    await taken.datapath.reconcile()
    assert taken.aws.chains == set()


async def test_with_external_snat_aws_nodes_chains_go_and_inbound_stays_marked(
    node: NodeFixture,
) -> None:
    taken = await _node(node, external_snat=True)
    await taken.datapath.reconcile()
    assert taken.snat.plan is not None and not taken.snat.plan.snat, "ipamd installs no SNAT"
    assert taken.snat.plan.node_port, "but marks inbound connections, as aws-node did"
    assert taken.aws.chains == set()
    assert CONNMARK_RULE in taken.kernel.rules and CONNMARK_RULE not in taken.kernel.foreign_rules
    assert taken.kernel.gaps == []


async def test_with_external_snat_and_no_node_port_support_no_connmark_is_left(
    node: NodeFixture,
) -> None:
    taken = await _node(node, external_snat=True, node_port_support=False)
    await taken.datapath.reconcile()
    assert taken.snat.plan is None, "ipamd has no table"
    assert taken.aws.chains == {INBOUND}, "only what ipamd's table now does goes"
    assert CONNMARK_RULE not in taken.kernel.rules | taken.kernel.foreign_rules
    assert taken.kernel.gaps == []


async def test_without_node_port_support_aws_nodes_inbound_mark_stays(node: NodeFixture) -> None:
    kept = await _node(node, node_port_support=False)
    await kept.datapath.reconcile()
    assert kept.snat.plan is not None and not kept.snat.plan.node_port
    assert kept.aws.chains == {INBOUND}, "NodePort keeps aws-node's mark: ipamd has none"
