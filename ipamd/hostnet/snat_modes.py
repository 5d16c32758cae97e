"""What the datapath does on a node of each address family, chosen once by the composition
(`Datapath.mode`, docs/architecture.md §7.4): the datapath asks it a pod's policy rules,
whether ipamd's SNAT table marks connections and what plan to apply, and never tests the family
itself.

- `VpcSnat` (IPv4): pods' traffic leaving the VPC is marked and SNATed to the primary ENI's
  address unless AWS_VPC_K8S_CNI_EXTERNALSNAT, with the VPC's CIDRs and
  AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS exempt; with AWS_VPC_CNI_NODE_PORT_SUPPORT, connections to the
  node arriving on the primary ENI are marked too.
- `EgressSnat` (IPv6): only the pods' IPv4 egress range is SNATed to the node's IPv4 address, with
  no mark: a pod's IPv6 traffic leaves with its own address and is never NATed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from datastore.records import EniRecord
from ipamd.hostnet.kernel_plan import pod_rules
from ipamd.hostnet.ports import Rule
from ipamd.hostnet.snat import Randomize, SnatPlan
from ipamd.wire.pod import V4_EGRESS_CIDR


class SnatKnobs(Protocol):
    """The settings a mode reads (the datapath group, `ipamd.config.groups.DatapathSettings`, has
    them): VPC CNI's SNAT knobs."""

    @property
    def external_snat(self) -> bool: ...

    @property
    def node_port_support(self) -> bool: ...

    @property
    def randomize_snat(self) -> Randomize: ...


Exempt = Callable[[], Awaitable[tuple[str, ...]]]
"""Reads the destinations never SNATed: the VPC's CIDRs and the excluded ones."""


@dataclass(frozen=True, slots=True)
class SnatLinks:
    """The links a plan is made for: the primary ENI's, and every ENI link set up now."""

    primary_ip: str
    primary_ifname: str
    eni_ifnames: Sequence[str]


@dataclass(frozen=True, slots=True)
class VpcSnat:
    """IPv4's table: marks, SNAT out of the VPC, node port marks."""

    def marks_connections(self, s: SnatKnobs) -> bool:
        """Pods' traffic leaving the VPC without external SNAT, or inbound connections to the
        node with node port support."""
        return not s.external_snat or s.node_port_support

    def inbound_marked(self, s: SnatKnobs) -> bool:
        return s.node_port_support

    def keeps_table(self, s: SnatKnobs) -> bool:
        """With external SNAT and without node port support the table has nothing to do."""
        return self.marks_connections(s)

    def pod_rules(self, address: str, eni: EniRecord | None) -> tuple[Rule, ...]:
        """A pod's policy rules: to it by main, from it by its ENI's table (`kernel_plan.pod_rules`)."""
        return pod_rules(address, eni)

    async def plan(self, links: SnatLinks, exempt: Exempt, s: SnatKnobs) -> SnatPlan:
        return SnatPlan(
            primary_ip=links.primary_ip,
            primary_ifname=links.primary_ifname,
            eni_ifnames=tuple(sorted({links.primary_ifname, *links.eni_ifnames})),
            exempt_cidrs=await exempt(),
            randomize=s.randomize_snat,
            snat=not s.external_snat,
            node_port=s.node_port_support,
        )


@dataclass(frozen=True, slots=True)
class EgressSnat:
    """IPv6's table: the pods' IPv4 egress range (`egress_cidr`) SNATed to the node's IPv4, no
    mark; the external SNAT, exclusion and node port settings are IPv4's and do not apply."""

    egress_cidr: str

    def marks_connections(self, s: SnatKnobs) -> bool:
        return False

    def pod_rules(self, address: str, eni: EniRecord | None) -> tuple[Rule, ...]:
        """None: a pod lives on the primary ENI, in main, where the interface plugin's /128 route
        to its veth is all it needs."""
        return ()

    def inbound_marked(self, s: SnatKnobs) -> bool:
        return False

    def keeps_table(self, s: SnatKnobs) -> bool:
        """Always: the pods' IPv4 egress needs it whatever the IPv4 settings say."""
        return True

    async def plan(self, links: SnatLinks, exempt: Exempt, s: SnatKnobs) -> SnatPlan:
        """No destination is exempt (`exempt` is never read): the range is routable nowhere."""
        return SnatPlan(
            primary_ip=links.primary_ip,
            primary_ifname=links.primary_ifname,
            eni_ifnames=(links.primary_ifname,),
            exempt_cidrs=(),
            randomize=s.randomize_snat,
            egress_cidr=self.egress_cidr,
        )


SnatMode = VpcSnat | EgressSnat

VPC_SNAT = VpcSnat()
"""An IPv4 node's."""
EGRESS_SNAT = EgressSnat(V4_EGRESS_CIDR)
"""An IPv6 node's: its pods' IPv4 egress range (`ipamd.wire.pod.V4_EGRESS_CIDR`)."""
