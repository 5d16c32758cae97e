"""The `subnet_takeover` run: the nodes share one small subnet that runs dry, and a pod subnet tagged
`kubernetes.io/role/cni=1` on a secondary VPC CIDR block takes over, by subnet discovery
(ENABLE_SUBNET_DISCOVERY, on by default).

The VPC (`TakeoverCluster`): 10.1.0.0/16 holds the node subnet, sized by `node_subnet_cidr` so that
every node's own address fits but not every node's primary ENI filled (m5.large: 9 secondary
addresses, which WARM_ENI_TARGET=1 asks for at start); 100.64.0.0/16 is associated with the VPC and
made one pod subnet in the nodes' zone, tagged for discovery (`cloud.embedded.world_layout`). The
nodes join over two minutes: the first fill their primary ENIs from the node subnet, the later ones
find it dry, and their assign there fails once; from then on that subnet's ENIs grow no more and
every new ENI goes to the pod subnet, which has the most free addresses
(docs/architecture.md §5.8). An ENI's secondary addresses come from its own subnet, so the pods'
addresses beyond the primary ENI's are pod-subnet addresses.

The workload is the steady one at `PODS_PER_NODE`: a node whose primary ENI got nothing from the node
subnet still holds 18 pod addresses on its two other ENIs, fewer than its max pods (29), which
counts all three; past that its pods would wait for addresses whatever ipamd did.

Besides the figures of every run (`bench.cluster.report`), this one reports (`RunResult.extra`):

- `nodes`: its cluster size (at most `DEFAULT_NODES`, whatever `--nodes` says);
- `node_subnet_free_min`: the fewest free addresses the node subnet had (DescribeSubnets' count),
  read before the first node joins, every `READ_EVERY_S` from then on, and every sample and check;
- `primaries_short`: nodes whose primary ENI holds fewer addresses than it has room for, at the end;
- `pod_subnet_enis`: ENIs in the pod subnet at the end, and `pod_subnet_enis_after_dry`: how many
  more than at the first reading that found the node subnet dry (too few free addresses to fill a
  primary ENI);
- `pods_on_pod_subnet_share`: the share of the pods' addresses on pod-subnet ENIs, at the last check.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from bench.cluster.moto_client import MotoEc2Client
from bench.cluster.runner import Progress, run_spec
from bench.cluster.sim import Cluster, RunResult, RunSpec
from cloud.embedded.subnet_space import RESERVED_AT_END, RESERVED_AT_START
from cloud.embedded.world import EmbeddedEc2
from cloud.embedded.world_layout import CNI_ROLE_TAG, Layout, SubnetSpec, build_layout

NAME = "subnet_takeover"
DEFAULT_NODES = 100
"""The run's cluster size at most: 100 nodes keep it near a minute of wall time."""
PODS_PER_NODE = 12.0
VPC_CIDR = "10.1.0.0/16"
POD_BLOCK = "100.64.0.0/16"
"""The VPC's secondary CIDR block, all of it the pod subnet."""
ADDRESSES_PER_PRIMARY = 10
"""An m5.large ENI holds 10 addresses: its own and 9 secondaries."""
DRY_BELOW = ADDRESSES_PER_PRIMARY - 1
"""The node subnet is dry with fewer free addresses than a primary ENI's secondaries."""
READ_EVERY_S = 5.0
"""How often the node subnet's free count is read from the first join on (besides every sample and
check): new ENIs may go to the pod subnet within seconds of the nodes joining."""
NODE_SUBNET_SHARE = 0.6
"""The node subnet has fewer usable addresses than this share of what the nodes' primary ENIs hold
when full."""


def node_subnet_cidr(nodes: int) -> str:
    """The largest subnet at the start of `VPC_CIDR` with fewer usable addresses than
    `NODE_SUBNET_SHARE` of the nodes' full primary ENIs, and room for every node's own address."""
    limit = NODE_SUBNET_SHARE * ADDRESSES_PER_PRIMARY * nodes
    vpc = ipaddress.IPv4Network(VPC_CIDR)
    for prefix in range(vpc.prefixlen, 29):
        usable = 2 ** (32 - prefix) - RESERVED_AT_START - RESERVED_AT_END
        if nodes <= usable < limit:
            return str(next(vpc.subnets(new_prefix=prefix)))
    raise ValueError(f"no subnet of {VPC_CIDR} suits {nodes} nodes")


def takeover_spec(base: RunSpec, nodes: int) -> RunSpec:
    """`base`'s steady workload (its measured window, seed, budget) on at most `DEFAULT_NODES`
    nodes, at `PODS_PER_NODE`."""
    return replace(
        base, name=NAME, nodes=min(nodes, DEFAULT_NODES), pods_per_node=PODS_PER_NODE, burst_pods=0
    )


@dataclass
class TakeoverFigures:
    nodes: int
    node_subnet_free_min: int | None = None
    enis_when_dry: int | None = None
    """Pod-subnet ENIs at the first reading that found the node subnet dry."""
    primaries_short: int = 0
    pod_subnet_enis: int = 0
    pod_addresses: int = 0
    addresses: int = 0

    def as_extra(self) -> dict[str, float]:
        after_dry = (
            self.pod_subnet_enis - self.enis_when_dry if self.enis_when_dry is not None else 0
        )
        return {
            "nodes": float(self.nodes),
            "node_subnet_free_min": float(self.node_subnet_free_min or 0),
            "primaries_short": float(self.primaries_short),
            "pod_subnet_enis": float(self.pod_subnet_enis),
            "pod_subnet_enis_after_dry": float(after_dry),
            "pods_on_pod_subnet_share": self.pod_addresses / self.addresses
            if self.addresses
            else 0,
        }


class TakeoverCluster(Cluster):
    """`Cluster` whose nodes all launch into one small subnet of a VPC that also holds a tagged pod
    subnet (module docstring)."""

    def __init__(self, spec: RunSpec, host: EmbeddedEc2, workdir: Path) -> None:
        super().__init__(spec, host, workdir)
        client, world = self._client, self.world
        node_cidr = node_subnet_cidr(spec.nodes)
        layout = Layout(
            secondary_cidrs=(POD_BLOCK,),
            subnets=(SubnetSpec(POD_BLOCK, tags={CNI_ROLE_TAG: "1"}),),
        )
        layout.check_against(ipaddress.IPv4Network(node_cidr), ipaddress.IPv4Network(VPC_CIDR))
        vpc = str(client.create_vpc(CidrBlock=VPC_CIDR)["Vpc"]["VpcId"])
        zone = world.availability_zone
        answer = client.create_subnet(VpcId=vpc, CidrBlock=node_cidr, AvailabilityZone=zone)
        self.node_subnet = str(answer["Subnet"]["SubnetId"])
        made = build_layout(
            client,
            layout,
            vpc_id=vpc,
            node_subnet_id=self.node_subnet,
            region=world.region,
            node_zone=zone,
        )
        self.pod_subnet = made[0].subnet_id
        self._group = str(
            client.create_security_group(
                GroupName="ipamd-takeover-nodes", Description="cluster nodes", VpcId=vpc
            )["GroupId"]
        )
        self.figures = TakeoverFigures(spec.nodes)
        self._reader: asyncio.Task[None] | None = None

    def join(self, instance_ids: Sequence[str], spread_s: float, client: MotoEc2Client) -> None:
        if self._reader is None:
            self._read()  # before any node joined: the node subnet is not dry yet
            self._reader = asyncio.get_running_loop().create_task(self._read_every())
        super().join(instance_ids, spread_s, client)

    async def _read_every(self) -> None:
        while True:
            await asyncio.sleep(READ_EVERY_S)
            self._read()

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        await super().close()

    def _subnet_for(self, index: int) -> tuple[str, str]:
        return self.node_subnet, self._group

    def node_subnet_free(self) -> int:
        """The node subnet's free addresses, as DescribeSubnets counts them."""
        return int(self.backend.get_subnet(self.node_subnet).available_ip_address_count)

    def pod_subnet_enis(self) -> int:
        return sum(1 for eni in self.backend.enis.values() if eni.subnet.id == self.pod_subnet)

    def sample(self, t_s: float) -> None:
        super().sample(t_s)
        self._read()

    def check(self, now: float) -> None:
        super().check(now)
        self._read()
        self._count_addresses()
        self.result.extra = self.figures.as_extra()

    def _read(self) -> None:
        figures, free = self.figures, self.node_subnet_free()
        low = figures.node_subnet_free_min
        figures.node_subnet_free_min = free if low is None else min(low, free)
        if free < DRY_BELOW and figures.enis_when_dry is None:
            figures.enis_when_dry = self.pod_subnet_enis()

    def _count_addresses(self) -> None:
        """The pods' addresses by the subnet of their ENI, and the primary ENIs left short."""
        figures = self.figures
        figures.pod_addresses = figures.addresses = figures.primaries_short = 0
        for node in self.nodes:
            state = node.engine.state
            for alloc in state.allocations().values():
                for cidr in alloc.unit_cidrs:
                    unit = state.unit(cidr)
                    eni = state.eni(unit.eni_id) if unit is not None else None
                    figures.addresses += 1
                    figures.pod_addresses += eni is not None and eni.subnet_id == self.pod_subnet
            primary = self.instances[node.instance_id].nics[0]
            figures.primaries_short += len(primary.private_ip_addresses) < ADDRESSES_PER_PRIMARY
        figures.pod_subnet_enis = self.pod_subnet_enis()


def run_takeover(spec: RunSpec, host: EmbeddedEc2, progress: Progress) -> RunResult:
    """`spec` on a `TakeoverCluster` (`bench.cluster.runner.run_spec`)."""
    return run_spec(spec, host, progress, cluster_type=TakeoverCluster)
