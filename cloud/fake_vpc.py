"""The truth of an in-memory EC2 for one instance (`FakeVpc`), under the port double `cloud.fakes.FakeEc2`.

It keeps what EC2 holds: the instance's ENIs, their secondary IPs and /28 prefixes (and IPv6 /80s
from a subnet's /64, `cloud.fake_ipv6`), the per-ENI slot limit, the instance's ENI limit, and
addresses drawn deterministically from each ENI's subnet (the lowest free address, or the lowest
free aligned /28, so a released address is handed out again at once, as EC2 may). The node's subnet
is the first of its VPC; `add_subnet` makes more (in the node's zone or another, with tags),
`tag_subnet` retags one, and an ENI other users of the instance own (EFA, trunk, `no_manage`) is
made with `attach_foreign`.

On top of the truth it models EC2's eventual consistency: Describe may serve, per unit and per ENI
attachment, the state as it was up to `lag_s` seconds ago by the injected clock — an assigned unit
appears late, an unassigned one lingers. The answers to mutations are always current.
The lag must stay within the grace window given to the reconciler: that is the premise ipamd documents
(docs/architecture.md §6.2), and nothing can be right without it.
"""

from __future__ import annotations

import ipaddress
import itertools
import random
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from cloud import fake_ipv6
from cloud.errors import NotFound, SubnetExhausted, SubnetFragmented
from cloud.fake_ipv6 import Ipv6Block
from cloud.models import Ipv4UnitKind, NetworkInterface, Subnet
from cloud.ports import CallUrgency

PREFIX_SIZE = 16


class Clock(Protocol):
    """What the fake reads time from: seconds since the epoch (ipamd's `Clock`, `FakeClock`)."""

    def now(self) -> float: ...


@dataclass(slots=True)
class FakeEni:
    """One ENI as EC2 holds it (the truth)."""

    eni_id: str
    mac: str
    subnet_id: str
    primary_ip: str
    description: str
    tags: dict[str, str]
    device_index: int | None = None
    attachment_id: str | None = None
    units: dict[str, Ipv4UnitKind] = field(default_factory=dict)
    """CIDR -> kind, in the order EC2 assigned them."""
    deleted: bool = False
    last_device_index: int | None = None
    """Where it was last attached: a lagging Describe still shows it there."""
    last_attachment_id: str | None = None
    groups: tuple[str, ...] = ()
    """The security groups it was created with."""
    interface_type: str = "interface"
    ipv6_prefixes: list[str] = field(default_factory=list)
    """Delegated IPv6 /80 prefixes, in the order EC2 assigned them."""
    delete_on_termination: bool = False
    """Of its attachment: false when attached, as EC2 attaches."""


@dataclass(slots=True)
class FakeSubnet:
    """One subnet of the VPC, and which of its addresses are in use."""

    subnet_id: str
    cidr: ipaddress.IPv4Network
    zone: str
    tags: dict[str, str] = field(default_factory=dict)
    used: set[int] = field(default_factory=set)
    first: int = 0
    last: int = 0
    ip_cursor: int = 0
    block_cursor: int = 0
    ipv6: Ipv6Block | None = None
    """The subnet's IPv6 /64 and its /80s in use, if it has one."""

    def __post_init__(self) -> None:
        # EC2 reserves the first four addresses of a subnet and the last one.
        self.first = self.ip_cursor = int(self.cidr.network_address) + 4
        self.last = int(self.cidr.broadcast_address) - 1
        self.block_cursor = int(self.cidr.network_address)

    @property
    def available(self) -> int:
        return self.last - self.first + 1 - len(self.used)

    def draw(self, kind: Ipv4UnitKind) -> str | None:
        """The lowest free address, or the lowest aligned /28 wholly free; None if none is."""
        if kind == "ip":
            value = self.ip_cursor
            while value <= self.last and value in self.used:
                value += 1
            self.ip_cursor = value
            if value > self.last:
                return None
            self.used.add(value)
            return f"{ipaddress.IPv4Address(value)}/32"
        block = self.block_cursor
        while block + PREFIX_SIZE - 1 <= self.last:
            span = range(block, block + PREFIX_SIZE)
            if block >= self.first and not any(a in self.used for a in span):
                self.block_cursor = block
                self.used.update(span)
                return f"{ipaddress.IPv4Address(block)}/28"
            block += PREFIX_SIZE
        return None

    def free(self, cidr: str) -> None:
        net = ipaddress.IPv4Network(cidr)
        for value in range(int(net.network_address), int(net.broadcast_address) + 1):
            self.used.discard(value)
            self.ip_cursor = min(self.ip_cursor, value)
            self.block_cursor = min(self.block_cursor, value - value % PREFIX_SIZE)

    def as_model(self, vpc_id: str) -> Subnet:
        ipv6 = str(self.ipv6.cidr) if self.ipv6 is not None else ""
        return Subnet(
            self.subnet_id, str(self.cidr), self.available, vpc_id, self.zone, dict(self.tags), ipv6
        )


@dataclass(slots=True)
class _Pending:
    """A value whose recent changes Describe does not show yet: `base` before them, then each
    change with the instant it becomes visible (non-decreasing)."""

    base: object
    changes: list[tuple[float, object]]

    def seen(self, now: float) -> object:
        value = self.base
        for visible_from, changed in self.changes:
            if visible_from > now:
                break
            value = changed
        return value


class _Lagged:
    """Per key (a unit's CIDR, an ENI's ID), what a lagging Describe sees of its value."""

    def __init__(self) -> None:
        self._pending: dict[str, _Pending] = {}

    def changed(self, key: str, before: object, after: object, now: float, lag_s: float) -> None:
        pending = self._pending.get(key)
        if pending is None:
            if lag_s <= 0:
                return
            pending = self._pending[key] = _Pending(before, [])
        # Never earlier than the previous change: a view moves forward, it does not reorder.
        last = pending.changes[-1][0] if pending.changes else now
        pending.changes.append((max(now + lag_s, last), after))

    def settle(self, now: float) -> None:
        """Forget what every view shows by now."""
        done = [k for k, p in self._pending.items() if p.changes[-1][0] <= now]
        for key in done:
            del self._pending[key]

    def items(self, now: float) -> Iterator[tuple[str, object]]:
        return ((k, p.seen(now)) for k, p in self._pending.items())

    def __contains__(self, key: str) -> bool:
        return key in self._pending


class FakeVpc:
    """One instance's VPC as EC2 holds it, with the knobs tests turn and the truth they read;
    `FakeEc2` serves the EC2 port on it."""

    def __init__(
        self,
        clock: Clock,
        *,
        instance_id: str = "i-0fake0000000001",
        instance_type: str = "m5.large",
        subnet_cidr: str = "10.0.0.0/16",
        subnet_ipv6_cidr: str = "",
        max_enis: int = 3,
        ipv4_per_eni: int = 10,
        lag_s: float = 0.0,
        lag_rng: random.Random | None = None,
    ) -> None:
        self.clock = clock
        self.instance_id = instance_id
        self.instance_type = instance_type
        self.subnet_id = "subnet-0fake"
        self.subnet_cidr = ipaddress.IPv4Network(subnet_cidr)
        self.vpc_id = "vpc-0fake"
        self.zone = "us-west-2a"
        self.subnets: dict[str, FakeSubnet] = {
            self.subnet_id: FakeSubnet(
                self.subnet_id, self.subnet_cidr, self.zone, ipv6=fake_ipv6.block(subnet_ipv6_cidr)
            )
        }
        self.max_enis = max_enis
        self.ipv4_per_eni = ipv4_per_eni
        self.lag_s = lag_s
        """Describe shows each change at most this long after it happened."""
        self.lag_rng = lag_rng
        """Draws each change's lag in [0, lag_s]; None: every change lags exactly `lag_s`."""
        self.enis: dict[str, FakeEni] = {}
        self.calls: Counter[str] = Counter()
        """Calls per port operation, as `FakeEc2` counts them."""
        self.calls_under: Counter[tuple[str, CallUrgency]] = Counter()
        """Calls per port operation and urgency, made through a view (`FakeEc2.with_urgency`)."""
        self.unassigned: list[tuple[float, str, str]] = []
        """(when, ENI, CIDR) of every unit that left an ENI: unassigned, or deleted with it."""
        self.last_eni: dict[str, str] = {}
        """The ENI each unit was last assigned to (what a stale IMDS keeps it on)."""
        self._kind: dict[str, Ipv4UnitKind] = {}
        self._unit_eni: dict[str, str] = {}
        self._unit_view = _Lagged()
        self._eni_view = _Lagged()
        self._ids = itertools.count(1)
        self._faults: list[tuple[str, bool]] = []
        """(operation, after acting) of the timeouts `FakeEc2.fail_next` has queued."""
        primary = self._new_eni(self.subnet_id, "primary network interface", {}, ("sg-0fake",))
        self._attach(primary, 0, lag_s=0.0)

    # -- the VPC, for tests ------------------------------------------------------------------------

    def add_subnet(
        self,
        cidr: str,
        tags: Mapping[str, str] | None = None,
        zone: str = "us-west-2a",
        ipv6_cidr: str = "",
    ) -> str:
        """Another subnet of the VPC (in the node's zone unless `zone` says otherwise, with an IPv6
        /64 if `ipv6_cidr` names one); its ID."""
        subnet_id = f"subnet-{len(self.subnets):04x}fake"
        net = ipaddress.IPv4Network(cidr)
        subnet = FakeSubnet(subnet_id, net, zone, dict(tags or {}), ipv6=fake_ipv6.block(ipv6_cidr))
        self.subnets[subnet_id] = subnet
        return subnet_id

    def tag_subnet(self, subnet_id: str, tags: Mapping[str, str]) -> None:
        """Add or overwrite tags of a subnet, as CreateTags does."""
        self.subnets[subnet_id].tags.update(tags)

    def untag_subnet(self, subnet_id: str, *keys: str) -> None:
        for key in keys:
            self.subnets[subnet_id].tags.pop(key, None)

    def attach_foreign(
        self,
        device_index: int,
        *,
        interface_type: str = "interface",
        tags: Mapping[str, str] | None = None,
    ) -> str:
        """An ENI someone else attached (an EFA or trunk interface, or one tagged `no_manage`),
        with one secondary address; its ID."""
        eni = self._new_eni(self.subnet_id, "someone else's", dict(tags or {}), ())
        eni.interface_type = interface_type
        self._attach(eni, device_index, lag_s=0.0)
        cidr = self.subnets[self.subnet_id].draw("ip")
        assert cidr is not None
        self._put_unit(eni, cidr, "ip", self.clock.now(), lag_s=0.0)
        return eni.eni_id

    # -- the truth, for tests --------------------------------------------------------------------

    def truth(self) -> dict[str, set[str]]:
        """Units per attached ENI, as EC2 holds them now."""
        return {e.eni_id: set(e.units) for e in self.enis.values() if e.device_index is not None}

    def eni_of(self, cidr: str) -> str | None:
        """The ENI that holds `cidr` now, attached or not."""
        return self._unit_eni.get(cidr)

    def attached_eni_of(self, cidr: str) -> str | None:
        """The ENI that holds `cidr` now, if it is attached to the instance."""
        eni_id = self._unit_eni.get(cidr)
        if eni_id is None or self.enis[eni_id].device_index is None:
            return None
        return eni_id

    def ever_assigned(self) -> list[str]:
        return sorted(self.last_eni)

    # -- inside EC2 ------------------------------------------------------------------------------

    def _draw_lag(self) -> float:
        if self.lag_rng is None:
            return self.lag_s
        return self.lag_rng.uniform(0.0, self.lag_s)

    def _eni(self, operation: str, eni_id: str) -> FakeEni:
        eni = self.enis.get(eni_id)
        if eni is None or eni.deleted:
            raise NotFound(operation, "InvalidNetworkInterfaceID.NotFound", eni_id)
        return eni

    def _new_eni(
        self, subnet_id: str, description: str, tags: dict[str, str], groups: tuple[str, ...]
    ) -> FakeEni:
        n = next(self._ids)
        primary = self.subnets[subnet_id].draw("ip")
        if primary is None:
            raise SubnetExhausted("CreateNetworkInterface", "InsufficientFreeAddresses", subnet_id)
        eni = FakeEni(
            eni_id=f"eni-{n:017x}",
            mac=f"02:00:00:{n >> 16 & 0xFF:02x}:{n >> 8 & 0xFF:02x}:{n & 0xFF:02x}",
            subnet_id=subnet_id,
            primary_ip=primary.removesuffix("/32"),
            description=description,
            tags=tags,
            groups=groups,
        )
        self.enis[eni.eni_id] = eni
        return eni

    def _attach(self, eni: FakeEni, device_index: int, lag_s: float) -> None:
        eni.device_index = eni.last_device_index = device_index
        eni.attachment_id = eni.last_attachment_id = f"eni-attach-{next(self._ids):017x}"
        self._eni_view.changed(eni.eni_id, False, True, self.clock.now(), lag_s)

    def _put_unit(
        self, eni: FakeEni, cidr: str, kind: Ipv4UnitKind, now: float, lag_s: float
    ) -> None:
        eni.units[cidr] = kind
        self._kind[cidr] = kind
        self._unit_eni[cidr] = eni.eni_id
        self.last_eni[cidr] = eni.eni_id
        self._unit_view.changed(cidr, None, eni.eni_id, now, lag_s)

    def _remove_units(self, eni: FakeEni, cidrs: list[str]) -> None:
        now = self.clock.now()
        for cidr in cidrs:
            del eni.units[cidr]
            del self._unit_eni[cidr]
            self.subnets[eni.subnet_id].free(cidr)
            self.unassigned.append((now, eni.eni_id, cidr))
            self._unit_view.changed(cidr, eni.eni_id, None, now, self._draw_lag())

    def _as_model(self, eni: FakeEni, units: list[str], attached: bool) -> NetworkInterface:
        return NetworkInterface(
            eni_id=eni.eni_id,
            subnet_id=eni.subnet_id,
            status="in-use" if attached else "available",
            mac=eni.mac,
            device_index=eni.last_device_index if attached else None,
            attachment_id=eni.last_attachment_id if attached else None,
            instance_id=self.instance_id if attached else None,
            primary_ip=eni.primary_ip,
            secondary_ips=tuple(c.removesuffix("/32") for c in units if self._kind[c] == "ip"),
            prefixes=tuple(c for c in units if self._kind[c] == "prefix"),
            ipv6_prefixes=tuple(eni.ipv6_prefixes),
            tags=dict(eni.tags),
            delete_on_termination=attached and eni.delete_on_termination,
            interface_type=eni.interface_type,
        )

    def _draw_units(
        self, operation: str, eni: FakeEni, kind: Ipv4UnitKind, count: int
    ) -> tuple[str, ...]:
        """`count` units of `kind` from the ENI's subnet onto it, or none and `SubnetExhausted`."""
        subnet = self.subnets[eni.subnet_id]
        drawn = [subnet.draw(kind) for _ in range(count)]
        if None in drawn:
            for cidr in drawn:
                if cidr is not None:
                    subnet.free(cidr)
            if kind == "prefix":
                raise SubnetFragmented(operation, "InsufficientCidrBlocks", eni.subnet_id)
            raise SubnetExhausted(operation, "InsufficientFreeAddresses", eni.subnet_id)
        new = tuple(c for c in drawn if c is not None)
        now = self.clock.now()
        for cidr in new:
            self._put_unit(eni, cidr, kind, now, self._draw_lag())
        return new

    def _draw_ipv6_prefix(self, operation: str, eni: FakeEni) -> str:
        """One /80 of the ENI's subnet onto it (`cloud.fake_ipv6.draw_prefix`)."""
        prefix = fake_ipv6.draw_prefix(operation, eni.subnet_id, self.subnets[eni.subnet_id].ipv6)
        eni.ipv6_prefixes.append(prefix)
        return prefix
