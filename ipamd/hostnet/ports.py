"""The host-network port: the few things ipamd asks of the node's kernel, over its own models.

Adapters: `ipamd.hostnet.netlink.NetlinkHostNetwork` (pyroute2, the daemon's), and
`ipamd.hostnet.fake.FakeHostNetwork` (a kernel with state, for unit tests). Every method raises only
`HostNetError` subclasses.

Ownership: every rule and route ipamd adds carries `RT_PROTO_IPAMD` as its protocol, and listing
returns only those, so nothing of anyone else's (the kernel's, kube-proxy's, a node's own policy
routing) is ever listed as stale or removed. Two exceptions: `prepare_link` owns the ENI's link
outright (it removes the subnet's connected route the kernel adds for that link in main), and the
takeover from aws-node (VPC CNI) lists and removes rules and routes of VPC CNI's shapes that carry no
ipamd protocol (`foreign=True`), as `ipamd.hostnet.kernel_plan.plan_takeover` decides.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol

RT_PROTO_IPAMD = 0xA7
"""The routing protocol number on ipamd's rules and routes (`ip rule` / `ip route` show `proto 167`).
Outside the numbers iproute2's rt_protos names, so no routing daemon claims it."""

MAIN_TABLE = 254

PRIORITY_TO_POD = 512
"""`to <pod> lookup main`: traffic to a pod goes down its veth, whatever other rules say."""
PRIORITY_CONNMARK = 1024
"""`fwmark 0x80/0x80 lookup main`: pod traffic leaving the VPC (marked) goes out the primary ENI,
where it is SNATed."""
PRIORITY_FROM_POD = 1536
"""`from <pod> lookup N`: a pod on a secondary ENI leaves through that ENI."""
PRIORITY_FROM_ENI = 32765
"""`from <ENI primary address> lookup N`: the node's own traffic from a secondary ENI's address."""
CONNMARK = 0x80

TAKEOVER_PRIORITIES = frozenset(
    {PRIORITY_TO_POD, PRIORITY_CONNMARK, PRIORITY_FROM_POD, PRIORITY_FROM_ENI}
)
"""The priorities of VPC CNI's rules, which are ipamd's too: the only ones `foreign=True` lists."""

RESERVED_TABLES = frozenset({0, 253, 254, 255})
"""unspec, default, main, local: never an ENI's table, so `foreign=True` never lists their routes."""


@dataclass(frozen=True, slots=True, order=True)
class Rule:
    """One policy routing rule (IPv4). Empty `src` / `dst` mean "all"; `fwmask` 0 means no mark match."""

    priority: int
    table: int
    src: str = ""
    """CIDR, e.g. `10.0.1.23/32`."""
    dst: str = ""
    fwmark: int = 0
    fwmask: int = 0


@dataclass(frozen=True, slots=True, order=True)
class Route:
    """One route in a table of ipamd's: a link-scope route when `gateway` is empty."""

    table: int
    dst: str
    """CIDR; `0.0.0.0/0` for the default route."""
    ifname: str
    gateway: str = ""


@dataclass(frozen=True, slots=True)
class EniLink:
    """What the host side of one secondary ENI is made of."""

    eni_id: str
    mac: str
    """As EC2 gives it: lower-case, colon-separated."""
    address: str
    """The ENI's primary private address."""
    prefixlen: int
    """The subnet's mask length."""
    subnet_cidr: str
    mtu: int


class HostNetError(Exception):
    """The kernel refused or could not be asked."""

    code = "hostnet_error"


class LinkNotFound(HostNetError):
    """No link carries the ENI's MAC yet: EC2 attached it, the kernel does not show it (yet)."""

    code = "link_not_found"


class KernelUnreadable(HostNetError):
    """A listing failed: the round that wanted it proves nothing and must delete nothing."""

    code = "kernel_unreadable"


class HostNetwork(Protocol):
    async def prepare_link(self, link: EniLink) -> str:
        """Find the link by MAC, set its MTU, bring it up, make the ENI's primary address (with the
        subnet's mask) its only IPv4 address, and remove the subnet's connected route for it from
        main. Idempotent. Returns the link's name; raises `LinkNotFound`."""
        ...

    async def link_names(self) -> dict[str, str]:
        """MAC (lower-case) → link name, for every link the kernel shows. Raises `KernelUnreadable`."""
        ...

    async def add_rules(self, rules: Collection[Rule]) -> None:
        """Add, tagged `RT_PROTO_IPAMD`; one already there is not an error. A rule of the same
        content without ipamd's protocol (VPC CNI's) does not stop it: the kernel keeps both."""
        ...

    async def delete_rules(self, rules: Collection[Rule], *, foreign: bool = False) -> None:
        """Delete ipamd's rules; one already gone is not an error. With `foreign`, delete rules of
        this content that are not ipamd's (VPC CNI's carry no protocol, so the kernel is asked with
        none and removes the first rule of that content in its list: when ipamd's twin is there,
        it is normally the later one, and if ever the twin goes instead, the foreign rule left is
        identical and the next reconcile adds the twin back)."""
        ...

    async def add_routes(self, routes: Collection[Route]) -> None:
        """Add or replace, tagged `RT_PROTO_IPAMD`: a route of the same table and destination that
        is not ipamd's (VPC CNI's) is replaced in place, so the table never lacks it. Raises
        `LinkNotFound` for an unknown `ifname`."""
        ...

    async def delete_routes(self, routes: Collection[Route], *, foreign: bool = False) -> None:
        """Delete ipamd's routes; one already gone (or whose link is gone) is not an error. With
        `foreign`, delete routes of this content that are not ipamd's."""
        ...

    async def list_rules(self, *, foreign: bool = False) -> frozenset[Rule]:
        """Every IPv4 rule tagged `RT_PROTO_IPAMD`; with `foreign`, instead every IPv4 lookup rule
        not tagged so at `TAKEOVER_PRIORITIES` that a `Rule` describes whole (a rule with other
        selectors, such as an input interface, is not listed). Raises `KernelUnreadable`."""
        ...

    async def list_routes(self, *, foreign: bool = False) -> frozenset[Route]:
        """Every IPv4 route tagged `RT_PROTO_IPAMD`, in any table; with `foreign`, instead every
        IPv4 unicast route not tagged so in a table outside `RESERVED_TABLES`. Raises
        `KernelUnreadable`."""
        ...
