"""What the node's kernel must hold for the state ipamd has: pure functions, no I/O.

Numbering follows VPC CNI, so an operator's `ip rule` / `ip route show table N` reads the same: the
route table of the ENI at device index d (network card 0) is d + 1; the primary ENI uses main.

Per allocation (every address it owns):
- `to <address> lookup main` at 512: replies and VPC traffic to the pod go down its veth, whose /32
  route the main plugin (`ptp`) put in main;
- for an address on a secondary ENI, `from <address> lookup <table>` at 1536: the pod's traffic
  leaves by the ENI that owns its address, so EC2's source/destination check lets it through.

Per secondary ENI, once its link is set up: in its table, the subnet's gateway as a link-scope route
and the default route through it; `from <ENI primary address> lookup <table>` at 32765.

With SNAT on (not `AWS_VPC_K8S_CNI_EXTERNALSNAT`): `fwmark 0x80/0x80 lookup main` at 1024, so pod
connections to outside the VPC (marked by ipamd's nftables table) leave by the primary ENI.

Taking a node over from aws-node (`plan_takeover`): VPC CNI's rules are of these very shapes without
ipamd's protocol, and its routes are these routes. ipamd's own go in first (the reconcile), then the
foreign twins go; routes are replaced in place rather than deleted and added.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from datastore.records import AllocationKey, AllocationRecord, EniRecord
from ipamd.hostnet.ports import (
    CONNMARK,
    MAIN_TABLE,
    PRIORITY_CONNMARK,
    PRIORITY_FROM_ENI,
    PRIORITY_FROM_POD,
    PRIORITY_TO_POD,
    Route,
    Rule,
)

DEFAULT_ROUTE = "0.0.0.0/0"


def table_of(eni: EniRecord) -> int:
    """VPC CNI's numbering (device index + 1 on network card 0); main for the primary ENI."""
    return MAIN_TABLE if eni.is_primary else eni.device_index + 1


@functools.lru_cache(maxsize=256)
def gateway_of(subnet_cidr: str) -> str:
    """The VPC router's address in a subnet: its base address + 1, as EC2 reserves it."""
    return str(ipaddress.IPv4Network(subnet_cidr).network_address + 1)


@functools.lru_cache(maxsize=256)
def prefix_length(subnet_cidr: str) -> int:
    return ipaddress.IPv4Network(subnet_cidr).prefixlen


def host_cidr(address: str) -> str:
    return f"{address}/32"


def pod_rules(address: str, eni: EniRecord | None) -> tuple[Rule, ...]:
    """The rules of one IPv4 pod address on `eni` (None: its ENI is unknown, only the 512 rule).
    An IPv6 node's datapath asks for none (`ipamd.hostnet.snat_modes.EgressSnat.pod_rules`)."""
    to_pod = Rule(PRIORITY_TO_POD, MAIN_TABLE, dst=host_cidr(address))
    if eni is None or eni.is_primary:
        return (to_pod,)
    return (to_pod, Rule(PRIORITY_FROM_POD, table_of(eni), src=host_cidr(address)))


def eni_rule(eni: EniRecord) -> Rule:
    return Rule(PRIORITY_FROM_ENI, table_of(eni), src=host_cidr(eni.primary_ip))


def eni_routes(eni: EniRecord, ifname: str, subnet_cidr: str) -> tuple[Route, ...]:
    gateway = gateway_of(subnet_cidr)
    table = table_of(eni)
    return (
        Route(table, host_cidr(gateway), ifname),
        Route(table, DEFAULT_ROUTE, ifname, gateway),
    )


CONNMARK_RULE = Rule(PRIORITY_CONNMARK, MAIN_TABLE, fwmark=CONNMARK, fwmask=CONNMARK)


@dataclass(frozen=True, slots=True)
class ReadyEni:
    """A secondary ENI whose link is set up: its record, link name and subnet."""

    record: EniRecord
    ifname: str
    subnet_cidr: str


@dataclass(frozen=True, slots=True)
class KernelPlan:
    rules: frozenset[Rule]
    routes: frozenset[Route]


PodRulesMemo = dict[tuple[str, int | None], tuple[Rule, ...]]
"""(pod address, its ENI's table, None on the primary or an unknown ENI) → its `pod_rules`."""

PodRules = Callable[[str, EniRecord | None], tuple[Rule, ...]]
"""A pod address's rules on its ENI: `pod_rules` on an IPv4 node, none on an IPv6 one."""


def plan_kernel(
    allocations: Iterable[AllocationRecord],
    enis: Mapping[str, EniRecord],
    ready: Iterable[ReadyEni],
    snat: bool,
    memo: PodRulesMemo | None = None,
    rules_of: PodRules = pod_rules,
) -> KernelPlan:
    """Every ipamd rule and route the kernel must hold for this state, and nothing else. With
    `memo`, a pod's rules are taken from it when its address and table are the same as last time,
    and it is left holding this plan's pods alone."""
    rules: set[Rule] = {CONNMARK_RULE} if snat else set()
    routes: set[Route] = set()
    for link in ready:
        rules.add(eni_rule(link.record))
        routes.update(eni_routes(link.record, link.ifname, link.subnet_cidr))
    known = memo or {}
    fresh: PodRulesMemo = {}
    for alloc in allocations:
        eni = enis.get(alloc.eni_id)
        table = None if eni is None or eni.is_primary else table_of(eni)
        for address in alloc.addresses:
            key = (address, table)
            pods = known.get(key)
            if pods is None:
                pods = rules_of(address, eni)
            fresh[key] = pods
            rules.update(pods)
    if memo is not None:
        memo.clear()
        memo.update(fresh)
    return KernelPlan(frozenset(rules), frozenset(routes))


class NodeStateView(Protocol):
    """What a kernel plan is made from (`ipamd.engine.state.NodeState`)."""

    @property
    def revision(self) -> int: ...

    def allocations(self) -> Mapping[AllocationKey, AllocationRecord]: ...

    def enis(self) -> Mapping[str, EniRecord]: ...


class KernelPlanner:
    """`plan_kernel` for one datapath that asks again every reconcile: the plan is kept while the
    state's revision, the ready links and SNAT are the same, and otherwise made again with each
    pod's rules taken from the last plan where its address and table are the same."""

    def __init__(self) -> None:
        self._for: tuple[object, ...] | None = None
        self._plan = KernelPlan(frozenset(), frozenset())
        self._pod_rules: PodRulesMemo = {}

    def plan(
        self,
        state: NodeStateView,
        ready: tuple[ReadyEni, ...],
        snat: bool,
        rules_of: PodRules = pod_rules,
    ) -> KernelPlan:
        key = (state, state.revision, ready, snat, rules_of)
        kept = self._for
        if kept is None or kept[0] is not state or kept[1:] != key[1:]:
            allocations = state.allocations().values()
            self._plan = plan_kernel(
                allocations, state.enis(), ready, snat, self._pod_rules, rules_of
            )
            self._for = key
        return self._plan


@dataclass(frozen=True, slots=True)
class KernelDiff:
    add_rules: frozenset[Rule]
    delete_rules: frozenset[Rule]
    add_routes: frozenset[Route]
    delete_routes: frozenset[Route]

    def is_empty(self) -> bool:
        return not (self.add_rules or self.delete_rules or self.add_routes or self.delete_routes)


def diff_kernel(plan: KernelPlan, rules: frozenset[Rule], routes: frozenset[Route]) -> KernelDiff:
    """By content: what to add (planned, absent) and remove (ipamd's, not planned)."""
    return KernelDiff(
        add_rules=plan.rules - rules,
        delete_rules=rules - plan.rules,
        add_routes=plan.routes - routes,
        delete_routes=routes - plan.routes,
    )


# -- taking over from aws-node (VPC CNI) ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TakeoverPlan:
    """What of VPC CNI's rules and routes goes, once ipamd's own are its plan."""

    delete_rules: frozenset[Rule]
    claim_routes: frozenset[Route]
    """Replaced in place by the reconcile's `add_routes` of the same table and destination: they
    become ipamd's with no moment the table lacks them. Nothing to do; counted."""
    delete_routes: frozenset[Route]

    def is_empty(self) -> bool:
        return not (self.delete_rules or self.claim_routes or self.delete_routes)


def _selector(rule: Rule) -> tuple[int, str, str, int, int]:
    """What a rule matches and where it sits, whatever table it sends to."""
    return (rule.priority, rule.src, rule.dst, rule.fwmark, rule.fwmask)


def _host(cidr: str) -> str | None:
    address, _, length = cidr.partition("/")
    return address if length == "32" else None


def is_vpc_cni_rule(rule: Rule) -> bool:
    """One of the four rule shapes VPC CNI installs (`to <pod> lookup main` at 512, `fwmark
    0x80/0x80 lookup main` at 1024, `from <pod> lookup N` at 1536, `from <ENI address> lookup N` at
    32765): a rule of any other shape at those priorities is someone else's and stays."""
    marked = rule.fwmark or rule.fwmask
    if rule.priority == PRIORITY_TO_POD:
        return bool(_host(rule.dst)) and not rule.src and not marked and rule.table == MAIN_TABLE
    if rule.priority == PRIORITY_CONNMARK:
        return (
            (rule.fwmark, rule.fwmask) == (CONNMARK, CONNMARK)
            and not (rule.src or rule.dst)
            and rule.table == MAIN_TABLE
        )
    if rule.priority in (PRIORITY_FROM_POD, PRIORITY_FROM_ENI):
        return bool(_host(rule.src)) and not rule.dst and not marked and rule.table != MAIN_TABLE
    return False


def _is_vpc_cni_route(route: Route) -> bool:
    """`default via <gw> dev ethX` or `<gw>/32 dev ethX scope link`: what VPC CNI puts in an ENI's
    table."""
    if route.dst == DEFAULT_ROUTE:
        return bool(route.gateway)
    return _host(route.dst) is not None and not route.gateway


def plan_takeover(
    plan: KernelPlan,
    adding: Iterable[Route],
    foreign_rules: Iterable[Rule],
    foreign_routes: Iterable[Route],
    *,
    owned: Container[str],
    inventory: Container[str],
) -> TakeoverPlan:
    """Which of VPC CNI's rules and routes go, for a kernel whose ipamd rules and routes are
    `plan` once the reconcile has added `adding` (its routes not yet in the kernel). Pure.

    A foreign rule of VPC CNI's shapes goes when ipamd's plan holds a rule of the same priority and
    selector (replaced: the kernel keeps the first of equals, so a pod is never without one); when
    it is the connmark rule and the plan has none (AWS_VPC_K8S_CNI_EXTERNALSNAT: the marks it
    routes are aws-node's, which go with its chains); or when it is a pod rule (512, 1536) of an
    address in `inventory` that no allocation owns (`owned`): no live pod uses it. Any other stays
    (an owned address whose rule ipamd has not planned yet keeps VPC CNI's meanwhile).

    A foreign route of VPC CNI's shapes in a table the plan fills is claimed when `adding` has a
    route of its table and destination (replaced in place), and otherwise goes (stale, or a twin
    of ipamd's). Routes in other tables stay."""
    own = {_selector(rule) for rule in plan.rules}
    connmark = CONNMARK_RULE in plan.rules
    gone: set[Rule] = set()
    for rule in foreign_rules:
        if not is_vpc_cni_rule(rule):
            continue
        if _selector(rule) in own or (rule.priority == PRIORITY_CONNMARK and not connmark):
            gone.add(rule)
        elif rule.priority in (PRIORITY_TO_POD, PRIORITY_FROM_POD):
            address = _host(rule.dst or rule.src)
            if address is not None and address in inventory and address not in owned:
                gone.add(rule)
    tables = {route.table for route in plan.routes}
    replaced = {(route.table, route.dst) for route in adding}
    claimed: set[Route] = set()
    stale: set[Route] = set()
    for route in foreign_routes:
        if route.table not in tables or not _is_vpc_cni_route(route):
            continue
        (claimed if (route.table, route.dst) in replaced else stale).add(route)
    return TakeoverPlan(frozenset(gone), frozenset(claimed), frozenset(stale))
