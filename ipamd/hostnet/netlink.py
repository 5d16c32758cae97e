"""The host-network port over rtnetlink (pyroute2's asyncio API): the daemon's adapter.

Owns: one rtnetlink socket in the calling process's network namespace (or in a named one, for tests),
ipamd's IPv4 rules and routes (every one tagged `RT_PROTO_IPAMD`), and the links `prepare_link` is
given (their MTU, state, IPv4 addresses and the subnet's connected route in main).

Must not: list, change or delete a rule or route of any other protocol (the exceptions: the
kernel's connected route `prepare_link` removes, and VPC CNI's rules and routes the takeover lists
and deletes with `foreign=True`, or replaces in place through `add_routes`); touch a link other than
the one `prepare_link` resolved; shell out; start anything before `open()` or leave anything
running after `close()`; let an exception other than a `HostNetError` out of a port method.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import os
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from contextlib import aclosing, suppress
from socket import AF_INET
from typing import Any, Final

from pyroute2 import AsyncIPRoute
from pyroute2.netlink.exceptions import NetlinkDecodeError, NetlinkError

from ipamd.hostnet.netlink_messages import (
    RTPROT_KERNEL,
    Link,
    describe,
    ipv4_address,
    ipv4_network,
    is_connected_route,
    link_of,
    route_of,
    route_request,
    rule_of,
    rule_request,
)
from ipamd.hostnet.ports import (
    MAIN_TABLE,
    EniLink,
    HostNetError,
    KernelUnreadable,
    LinkNotFound,
    Route,
    Rule,
)

IFA_F_NOPREFIXROUTE: Final = 0x200
NLM_F_DUMP_INTR: Final = 0x10

DEFAULT_IN_FLIGHT: Final = 64
"""Requests awaiting their ack at once. The kernel drops acks that do not fit the socket's receive
buffer and then fails the socket with ENOBUFS (a few thousand unbounded requests do it), so the
window stays far below that."""
DEFAULT_TIMEOUT: Final = 10.0
"""Seconds one request or dump may take: a lost ack must not hang a caller forever."""
DUMP_ATTEMPTS: Final = 3

_GONE: Final = frozenset({errno.ENOENT, errno.ESRCH})
_NO_LINK: Final = {errno.ENODEV: LinkNotFound}

_Call = Callable[[Any], Awaitable[Any]]
"""One request, given the AsyncIPRoute socket (pyroute2 is untyped: `Any`)."""

_SOCKET_FAILURES: Final = (NetlinkDecodeError, OSError, RuntimeError, ValueError, KeyError)
"""What pyroute2 raises besides NetlinkError: socket errors (ENOBUFS, timeouts, a namespace that
cannot be entered), undecodable answers, a netns helper process that died, exhausted sequence
numbers. After any of these the socket is not trusted again."""


class NetlinkHostNetwork:
    """`HostNetwork` on one rtnetlink socket, opened by `open()` and closed by `close()`.

    `netns` names a namespace under /run/netns to act in instead of the caller's (the socket is
    created there; a missing namespace is an error, never created)."""

    def __init__(
        self,
        netns: str | None = None,
        *,
        in_flight: int = DEFAULT_IN_FLIGHT,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self._netns = netns
        self._timeout = timeout
        self._slots = asyncio.Semaphore(in_flight)
        # The kernel runs one dump per netlink socket at a time and refuses a second (EBUSY).
        self._dump_lock = asyncio.Lock()
        self._connect_lock = asyncio.Lock()
        self._ipr: Any = None
        self._opened = False

    async def open(self) -> None:
        """Create the socket; raises `HostNetError` if it cannot be had."""
        self._opened = True
        try:
            await self._socket(HostNetError)
        except HostNetError:
            self._opened = False
            raise

    async def close(self) -> None:
        """Close the socket. Requests still in flight fail (after their timeout)."""
        self._opened = False
        self._discard(self._ipr)
        # The transport closes its socket in a loop callback: let it run before returning.
        await asyncio.sleep(0)

    async def __aenter__(self) -> NetlinkHostNetwork:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- the port -------------------------------------------------------------------------------

    async def prepare_link(self, link: EniLink) -> str:
        address = ipv4_address(link.address)
        subnet = ipv4_network(link.subnet_cidr)
        found = await self._link_by_mac(link.mac, link.eni_id)
        if found.mtu != link.mtu:
            await self._request(
                f"set the MTU of {found.name} to {link.mtu}",
                _call("link", "set", index=found.index, mtu=link.mtu),
                raises=_NO_LINK,
            )
        if not found.up:
            await self._request(
                f"set {found.name} up",
                _call("link", "set", index=found.index, state="up"),
                raises=_NO_LINK,
            )
        await self._own_address(found, str(address), link.prefixlen)
        await self._drop_connected_route(found, subnet)
        return found.name

    async def link_names(self) -> dict[str, str]:
        names: dict[str, str] = {}
        # Links can share a MAC (VLANs, bond slaves): the lowest index, the one made first, wins.
        for found in sorted(await self._links(), key=lambda x: x.index):
            if found.mac:
                names.setdefault(found.mac, found.name)
        return names

    async def add_rules(self, rules: Collection[Rule]) -> None:
        requests = [(rule, rule_request(rule)) for rule in rules]
        await self._all(
            self._request(
                f"add rule {rule}",
                _call("rule", "add", **req),
                tolerate=frozenset({errno.EEXIST}),
            )
            for rule, req in requests
        )

    async def delete_rules(self, rules: Collection[Rule], *, foreign: bool = False) -> None:
        requests = [(rule, rule_request(rule, foreign=foreign)) for rule in rules]
        await self._all(
            self._request(
                f"delete rule {rule}",
                _call("rule", "del", **req),
                tolerate=_GONE,
            )
            for rule, req in requests
        )

    async def add_routes(self, routes: Collection[Route]) -> None:
        if not routes:
            return
        oifs = await self._oifs()
        missing = sorted({route.ifname for route in routes} - oifs.keys())
        if missing:
            raise LinkNotFound(f"no link named {', '.join(missing)}")
        requests = [(route, route_request(route, oifs[route.ifname])) for route in routes]
        # The kernel checks a gateway is reachable when a route via it goes in, so the link-scope
        # routes (the gateway's own among them) go in first.
        for via_gateway in (False, True):
            await self._all(
                self._request(
                    f"add route {route}",
                    _call("route", "replace", **req),
                    raises=_NO_LINK,
                )
                for route, req in requests
                if bool(route.gateway) is via_gateway
            )

    async def delete_routes(self, routes: Collection[Route], *, foreign: bool = False) -> None:
        if not routes:
            return
        oifs = await self._oifs()
        # A link that is gone took its routes with it.
        requests = [
            (route, route_request(route, oifs[route.ifname], foreign=foreign))
            for route in routes
            if route.ifname in oifs
        ]
        for via_gateway in (True, False):
            await self._all(
                self._request(
                    f"delete route {route}",
                    _call("route", "del", **req),
                    tolerate=_GONE | {errno.ENODEV},
                )
                for route, req in requests
                if bool(route.gateway) is via_gateway
            )

    async def list_rules(self, *, foreign: bool = False) -> frozenset[Rule]:
        messages = await self._dump("rules", _call("rule", "dump", family=AF_INET))
        rules = (rule_of(msg, foreign=foreign) for msg in messages)
        return frozenset(rule for rule in rules if rule is not None)

    async def list_routes(self, *, foreign: bool = False) -> frozenset[Route]:
        messages = await self._dump("routes", _call("route", "dump", family=AF_INET))
        # Links after routes: a route whose index is unknown then belongs to a link that is gone.
        names = {found.index: found.name for found in await self._links()}
        routes = (route_of(msg, names, foreign=foreign) for msg in messages)
        return frozenset(route for route in routes if route is not None)

    # -- prepare_link's steps -------------------------------------------------------------------

    async def _link_by_mac(self, mac: str, eni_id: str) -> Link:
        wanted = mac.lower()
        candidates = [found for found in await self._links() if found.mac == wanted]
        if not candidates:
            raise LinkNotFound(f"no link has MAC {wanted} (ENI {eni_id})")
        return min(candidates, key=lambda x: x.index)

    async def _own_address(self, link: Link, address: str, prefixlen: int) -> None:
        wanted = (address, prefixlen)
        present = await self._addresses(link.index)
        stale = [pair for pair in present if pair != wanted]
        # Deleting a primary address deletes its subnet's secondaries too (unless
        # promote_secondaries), so the stale ones go first and the wanted one is checked after.
        for stale_address, stale_len in stale:
            await self._request(
                f"delete address {stale_address}/{stale_len} from {link.name}",
                _call("addr", "del", index=link.index, address=stale_address, prefixlen=stale_len),
                tolerate=frozenset({errno.EADDRNOTAVAIL}),
                raises=_NO_LINK,
            )
        if stale:
            present = await self._addresses(link.index)
        if wanted not in present:
            # No prefix route: the subnet's route belongs in the ENI's table, never in main, and
            # the kernel would put it back in main each time the link comes up.
            await self._request(
                f"add address {address}/{prefixlen} to {link.name}",
                _call(
                    "addr",
                    "add",
                    index=link.index,
                    address=address,
                    prefixlen=prefixlen,
                    flags=IFA_F_NOPREFIXROUTE,
                ),
                tolerate=frozenset({errno.EEXIST}),
                raises=_NO_LINK,
            )

    async def _drop_connected_route(self, link: Link, subnet: ipaddress.IPv4Network) -> None:
        messages = await self._dump("routes", _call("route", "dump", family=AF_INET))
        for msg in messages:
            if not is_connected_route(msg, link.index, subnet):
                continue
            await self._request(
                f"delete the connected route {subnet} dev {link.name} from main",
                _call(
                    "route",
                    "del",
                    table=MAIN_TABLE,
                    dst=str(subnet.network_address),
                    dst_len=subnet.prefixlen,
                    oif=link.index,
                    proto=RTPROT_KERNEL,
                    scope=int(msg["scope"]),
                ),
                tolerate=_GONE | {errno.ENODEV},
            )

    # -- reading the kernel ---------------------------------------------------------------------

    async def _links(self) -> list[Link]:
        messages = await self._dump("links", _call("link", "dump"))
        return [link_of(msg) for msg in messages]

    async def _oifs(self) -> dict[str, int]:
        return {found.name: found.index for found in await self._links()}

    async def _addresses(self, index: int) -> list[tuple[str, int]]:
        messages = await self._dump("addresses", _call("addr", "dump", family=AF_INET))
        return [
            (str(msg.get_attr("IFA_LOCAL") or msg.get_attr("IFA_ADDRESS")), int(msg["prefixlen"]))
            for msg in messages
            if msg["index"] == index  # the kernel answers an AF_INET dump with IPv4 only
        ]

    # -- the socket -----------------------------------------------------------------------------

    async def _socket(self, error: type[HostNetError]) -> Any:
        if not self._opened:
            raise error("the netlink adapter is not open")
        async with self._connect_lock:
            if self._ipr is None:
                # groups=0: no multicast subscription, whose messages nobody here would read.
                # flags=0: a missing namespace is an error, not one to create.
                ipr = AsyncIPRoute(groups=0, netns=self._netns, flags=0)
                try:
                    await ipr.setup_endpoint()
                except (NetlinkError, *_SOCKET_FAILURES) as exc:
                    self._discard(ipr)
                    where = f"namespace {self._netns}" if self._netns else "this namespace"
                    raise error(f"cannot open a netlink socket in {where}: {exc}") from exc
                self._ipr = ipr
            return self._ipr

    def _discard(self, ipr: Any) -> None:
        if ipr is None:
            return
        if ipr is self._ipr:
            self._ipr = None
        # Closing a socket that already failed can fail again; it is dropped either way.
        with suppress(*_SOCKET_FAILURES):
            ipr.close()

    async def _request(
        self,
        what: str,
        call: _Call,
        *,
        tolerate: frozenset[int] = frozenset(),
        raises: Mapping[int, type[HostNetError]] | None = None,
    ) -> None:
        async with self._slots:
            ipr = await self._socket(HostNetError)
            try:
                async with asyncio.timeout(self._timeout):
                    await call(ipr)
            except NetlinkError as exc:
                if exc.code in tolerate:
                    return
                error = (raises or {}).get(exc.code, HostNetError)
                raise error(f"{what}: {_strerror(exc)}") from exc
            except _SOCKET_FAILURES as exc:
                self._discard(ipr)
                raise HostNetError(f"{what}: {describe(exc)}") from exc

    async def _dump(self, what: str, call: _Call) -> list[Any]:
        async with self._dump_lock:
            for _ in range(DUMP_ATTEMPTS):
                messages = await self._dump_once(what, call)
                # A dump the kernel marks inconsistent (the set changed under it) is read again.
                if not any(msg["header"]["flags"] & NLM_F_DUMP_INTR for msg in messages):
                    return messages
            raise KernelUnreadable(f"dump of {what}: interrupted {DUMP_ATTEMPTS} times in a row")

    async def _dump_once(self, what: str, call: _Call) -> list[Any]:
        async with self._slots:
            ipr = await self._socket(KernelUnreadable)
            try:
                async with asyncio.timeout(self._timeout):
                    async with aclosing(await call(ipr)) as stream:
                        return [msg async for msg in stream]
            except NetlinkError as exc:
                raise KernelUnreadable(f"dump of {what}: {_strerror(exc)}") from exc
            except _SOCKET_FAILURES as exc:
                self._discard(ipr)
                raise KernelUnreadable(f"dump of {what}: {describe(exc)}") from exc

    @staticmethod
    async def _all(requests: Iterable[Awaitable[None]]) -> None:
        """Run the requests together (the semaphore bounds them); every one runs to its end, then
        the first failure is raised."""
        results = await asyncio.gather(*requests, return_exceptions=True)
        failures = [result for result in results if isinstance(result, BaseException)]
        if not failures:
            return
        first = failures[0]
        if len(failures) > 1:
            first.add_note(f"{len(failures) - 1} more of {len(results)} requests failed")
        raise first


def _call(kind: str, command: str, **request: object) -> _Call:
    """`ipr.<kind>(command, **request)` on the socket it is later given (`kind`: link, addr, rule
    or route), its arguments bound now."""
    return lambda ipr: getattr(ipr, kind)(command, **request)


def _strerror(exc: NetlinkError) -> str:
    return f"{os.strerror(exc.code)} (errno {exc.code})" if exc.code > 0 else str(exc)
