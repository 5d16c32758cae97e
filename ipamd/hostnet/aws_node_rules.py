"""The kernel side of taking a node over from aws-node (VPC CNI), run by every datapath reconcile:
VPC CNI's rules, routes and SNAT go once ipamd's own are in place.

Order, which is what keeps a live pod routed throughout:
- Rules: the reconcile installs ipamd's rules from the state first; `replace` then removes VPC CNI's
  twins (`ipamd.hostnet.kernel_plan.plan_takeover` decides which), in the same locked round, from a listing
  taken in that round. A listing that fails proves nothing: that round removes nothing of VPC CNI's.
- Routes of ENI tables are claimed in place by the reconcile's `add_routes` (a replace: the route
  becomes ipamd's, the table never lacks it); only stale ones are deleted here.
- SNAT (`snat`): aws-node's chains go only after the reconcile made ipamd's nft table live (or,
  with AWS_VPC_K8S_CNI_EXTERNALSNAT, once ipamd's table is confirmed absent: aws-node's still go).
  aws-node's marks of inbound connections (NodePort, hostPort) go only when ipamd's live table
  marks them itself (AWS_VPC_CNI_NODE_PORT_SUPPORT), so they never lapse.

Nothing here fails a reconcile: a failure is logged (`hostnet.takeover_failed`), counted in
`DatapathHealth.takeover_failures`, and the next reconcile tries again. What goes is counted in
`DatapathHealth.fixes` under `takeover_*` kinds (so `ipamd_hostnet_fixes_total{kind=...}`) and logged
as `hostnet.takeover_rules_removed`, `hostnet.takeover_routes_claimed`,
`hostnet.takeover_routes_removed` and `hostnet.takeover_snat_removed`. On a node aws-node never ran
on, each reconcile costs one more rule and route listing and the SNAT adapter's listings.

Must not: touch a rule or route `plan_takeover` did not name, or run SNAT removal before the caller
saw ipamd's table live.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from ipamd.engine.state import NodeState
from ipamd.hostnet.aws_snat import AwsNodeSnat
from ipamd.hostnet.kernel_plan import KernelPlan, plan_takeover
from ipamd.hostnet.ports import HostNetError, HostNetwork, Route, Rule

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Foreign:
    """The rules and routes of others that a takeover may concern, as listed this round."""

    rules: frozenset[Rule]
    routes: frozenset[Route]


class AwsNodeRules:
    """aws-node's rules, routes and SNAT on this node, removed as ipamd's own take their place."""

    def __init__(
        self,
        host: HostNetwork,
        aws_node_snat: AwsNodeSnat | None,
        fixes: Counter[str],
        failures: Counter[str],
    ) -> None:
        self._host = host
        self._snat = aws_node_snat
        self._fixes = fixes
        self._failures = failures

    async def read(self) -> Foreign | None:
        """VPC CNI-shaped rules and routes without ipamd's protocol; None when they cannot be
        listed (then nothing of theirs is removed this round)."""
        try:
            rules = await self._host.list_rules(foreign=True)
            routes = await self._host.list_routes(foreign=True)
        except HostNetError as err:
            self._failed("unreadable", err)
            return None
        return Foreign(rules, routes)

    async def replace(
        self, plan: KernelPlan, adding: Iterable[Route], foreign: Foreign, state: NodeState
    ) -> None:
        """Remove VPC CNI's rules and stale routes that ipamd's now stand in for. Call with the
        datapath's lock held, right after the reconcile made ipamd's rules and routes `plan`
        (`adding`: the routes it added, which replaced foreign ones in place)."""
        if not (foreign.rules or foreign.routes):
            return
        inventory = frozenset(
            address for cidr in state.units() for address in state.addresses_of(cidr)
        )
        todo = plan_takeover(
            plan,
            adding,
            foreign.rules,
            foreign.routes,
            owned=state.owned_addresses(),
            inventory=inventory,
        )
        if todo.is_empty():
            return
        try:
            if todo.delete_rules:
                await self._host.delete_rules(todo.delete_rules, foreign=True)
            if todo.delete_routes:
                await self._host.delete_routes(todo.delete_routes, foreign=True)
        except HostNetError as err:
            self._failed("rules", err)
            return
        self._count("takeover_rule_removed", "hostnet.takeover_rules_removed", todo.delete_rules)
        self._count("takeover_route_claimed", "hostnet.takeover_routes_claimed", todo.claim_routes)
        self._count("takeover_route_removed", "hostnet.takeover_routes_removed", todo.delete_routes)

    async def snat(self, *, inbound: bool) -> None:
        """Remove aws-node's SNAT and connmark chains, and its marks of inbound connections when
        ipamd's table marks them (`inbound`). Call only once ipamd's own table is live."""
        if self._snat is None:
            return
        removal = await self._snat.remove(inbound=inbound)
        for failure in removal.failed:
            self._failed("snat", failure)
        if removal.removed:
            self._fixes["takeover_snat_removed"] += len(removal.removed)
            logger.warning(
                "hostnet.takeover_snat_removed count=%d removed=%s",
                len(removal.removed),
                "; ".join(removal.removed),
            )

    def _count(self, kind: str, event: str, what: frozenset[Rule] | frozenset[Route]) -> None:
        if not what:
            return
        self._fixes[kind] += len(what)
        logger.warning("%s count=%d", event, len(what))
        for item in sorted(what, key=str):
            logger.info("%s item=%s", event, item)

    def _failed(self, step: str, err: object) -> None:
        self._failures[step] += 1
        logger.warning(
            "hostnet.takeover_failed step=%s error=%s (the next reconcile retries)", step, err
        )
