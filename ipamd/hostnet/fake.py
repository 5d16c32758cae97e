"""Fakes of the host-network ports, with state, for tests of everything above them.

`FakeHostNetwork`: a kernel with state.

It holds links (by MAC), ipamd's rules and routes, rules and routes of others (the kernel's
defaults, and those a test puts there as aws-node leaves them), and what `prepare_link` made of each
link, and behaves as the netlink adapter does (idempotent adds and deletes, `LinkNotFound`, only
ipamd's own entries listed unless `foreign=True` asks for the others, routes replaced in place by
table and destination). Knobs make it fail the way a kernel can: `unreadable` (listing fails;
`unreadable_foreign`: only the listing of others' rules and routes), `fail_writes` (every change is
refused), and links that appear only when a test plugs them.

`FakeSnatTable`: the SNAT table. It holds the plan the "kernel" table was last made from (None: no
table), compares plans by their rendered script as `NftSnatTable` does, and misbehaves on demand:
`unreadable` (every call raises `KernelUnreadable`), `fail_apply` (`apply` raises, the table left as it
was), and `tamper()` (someone edited the table by hand).

`FakeAwsNodeSnat`: aws-node's SNAT and connmark chains, as names of what is there; `remove` takes
them all unless `fail` names why it cannot. None of the fakes touches a kernel.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from ipamd.hostnet.aws_snat import Removal
from ipamd.hostnet.ports import (
    RESERVED_TABLES,
    TAKEOVER_PRIORITIES,
    EniLink,
    HostNetError,
    KernelUnreadable,
    LinkNotFound,
    Route,
    Rule,
)
from ipamd.hostnet.snat import SnatPlan, render_ruleset


@dataclass(slots=True)
class FakeLink:
    ifname: str
    mtu: int = 1500
    up: bool = False
    addresses: set[str] = field(default_factory=set)
    """CIDR form (`10.0.1.20/24`)."""
    connected_route: bool = True
    """Whether main still holds the subnet's connected route for this link."""


class FakeHostNetwork:
    def __init__(self, *, auto_links: bool = False) -> None:
        self.auto_links = auto_links
        """Every MAC asked for has a link (named eth0, eth1, ... in the order asked): a kernel that
        shows each ENI the moment it is attached (the cluster simulator's nodes)."""
        self.links: dict[str, FakeLink] = {}
        """MAC → link."""
        self.rules: set[Rule] = set()
        self.routes: set[Route] = set()
        self.foreign_rules: set[Rule] = {Rule(0, 255), Rule(32766, 254), Rule(32767, 253)}
        """Rules ipamd did not make (the kernel's defaults, VPC CNI's): listed and deleted only with
        `foreign=True`, and then only those at `TAKEOVER_PRIORITIES`."""
        self.foreign_routes: set[Route] = set()
        """Routes ipamd did not make (VPC CNI's): listed and deleted only with `foreign=True`, and
        replaced in place (they become ipamd's) by an `add_routes` of the same table and
        destination."""
        self.unreadable = False
        self.unreadable_foreign = False
        """Only the listings with `foreign=True` fail."""
        self.fail_writes = False
        self.calls = 0

    def plug(self, mac: str, ifname: str) -> FakeLink:
        """The kernel shows a new link (the hypervisor attached the ENI)."""
        link = FakeLink(ifname)
        self.links[mac.lower()] = link
        return link

    def unplug(self, mac: str) -> None:
        link = self.links.pop(mac.lower(), None)
        if link is not None:
            self.routes = {r for r in self.routes if r.ifname != link.ifname}
            self.foreign_routes = {r for r in self.foreign_routes if r.ifname != link.ifname}

    def _write(self) -> None:
        self.calls += 1
        if self.fail_writes:
            raise HostNetError("injected: the kernel refused the change")

    async def prepare_link(self, link: EniLink) -> str:
        self._write()
        found = self.links.get(link.mac.lower())
        if found is None and self.auto_links:
            found = self.plug(link.mac, f"eth{len(self.links)}")
        if found is None:
            raise LinkNotFound(f"no link with MAC {link.mac}")
        found.mtu = link.mtu
        found.up = True
        found.addresses = {f"{link.address}/{link.prefixlen}"}
        found.connected_route = False
        return found.ifname

    async def link_names(self) -> dict[str, str]:
        self._read()
        return {mac: link.ifname for mac, link in self.links.items()}

    async def add_rules(self, rules: Collection[Rule]) -> None:
        self._write()
        self.rules.update(rules)

    async def delete_rules(self, rules: Collection[Rule], *, foreign: bool = False) -> None:
        self._write()
        if foreign:
            self.foreign_rules.difference_update(
                r for r in rules if r.priority in TAKEOVER_PRIORITIES
            )
        else:
            self.rules.difference_update(rules)

    async def add_routes(self, routes: Collection[Route]) -> None:
        self._write()
        names = {link.ifname for link in self.links.values()}
        for route in routes:
            if route.ifname not in names:
                raise LinkNotFound(f"no link {route.ifname}")
        keys = {(route.table, route.dst) for route in routes}
        self.foreign_routes = {r for r in self.foreign_routes if (r.table, r.dst) not in keys}
        self.routes.update(routes)

    async def delete_routes(self, routes: Collection[Route], *, foreign: bool = False) -> None:
        self._write()
        (self.foreign_routes if foreign else self.routes).difference_update(routes)

    def _read(self, foreign: bool = False) -> None:
        self.calls += 1
        if self.unreadable or (foreign and self.unreadable_foreign):
            raise KernelUnreadable("injected: the kernel cannot be read")

    async def list_rules(self, *, foreign: bool = False) -> frozenset[Rule]:
        self._read(foreign)
        if foreign:
            return frozenset(r for r in self.foreign_rules if r.priority in TAKEOVER_PRIORITIES)
        return frozenset(self.rules)

    async def list_routes(self, *, foreign: bool = False) -> frozenset[Route]:
        self._read(foreign)
        if foreign:
            return frozenset(r for r in self.foreign_routes if r.table not in RESERVED_TABLES)
        return frozenset(self.routes)


class FakeSnatTable:
    def __init__(self, plan: SnatPlan | None = None) -> None:
        self.plan = plan
        """The plan the table was made from; None when there is no table."""
        self.unreadable = False
        self.fail_apply = False
        self.applies = 0
        """`apply` calls that succeeded, whether or not they changed the table."""
        self.changes = 0
        """`apply` calls that changed the table."""
        self.removes = 0
        """`remove` calls that removed a table."""
        self._tampered = False

    def tamper(self) -> None:
        """Someone edited the table by hand: it no longer matches any plan until the next apply."""
        if self.plan is None:
            raise AssertionError("there is no table to tamper with")
        self._tampered = True

    async def apply(self, plan: SnatPlan) -> bool:
        script = render_ruleset(plan)
        self._check_readable()
        if self.fail_apply:
            raise HostNetError("injected: nft refused ipamd's table")
        changed = self._tampered or self.plan is None or render_ruleset(self.plan) != script
        self.plan = plan
        self._tampered = False
        self.applies += 1
        self.changes += changed
        return changed

    async def remove(self) -> bool:
        self._check_readable()
        was_there = self.plan is not None
        self.plan = None
        self._tampered = False
        self.removes += was_there
        return was_there

    async def matches(self, plan: SnatPlan) -> bool:
        script = render_ruleset(plan)
        self._check_readable()
        return self.plan is not None and not self._tampered and render_ruleset(self.plan) == script

    def _check_readable(self) -> None:
        if self.unreadable:
            raise KernelUnreadable("injected: nft could not list table ip ipamd")


INBOUND_MARK = "ip mangle PREROUTING"
"""How the fake names aws-node's marks of inbound connections, which go only with `inbound`."""


class FakeAwsNodeSnat:
    def __init__(self, *chains: str) -> None:
        self.chains: set[str] = set(chains)
        """What of aws-node's is left, e.g. `ip nat chain AWS-SNAT-CHAIN-0`, or
        `ip mangle PREROUTING: ...` for an inbound mark."""
        self.fail = ""
        """Non-empty: every `remove` fails with this reason and removes nothing."""
        self.passes = 0
        """`remove` calls, whatever they found."""

    async def remove(self, *, inbound: bool) -> Removal:
        self.passes += 1
        if self.fail:
            return Removal(failed=(self.fail,))
        going = {c for c in self.chains if inbound or not c.startswith(INBOUND_MARK)}
        self.chains -= going
        return Removal(removed=tuple(sorted(going)))
