"""In-memory fakes with state for one node: EC2 (`FakeEc2`), the instance metadata service
(`FakeImds`) and the container runtime (`FakeRuntime`), fast enough for thousands of reconcile rounds.

`FakeEc2` keeps the truth for one instance: its ENIs, their secondary IPs and /28 prefixes, the
per-ENI slot limit, the instance's ENI limit, and addresses drawn deterministically from each ENI's
subnet (the lowest free address, or the lowest free aligned /28, so a released address is handed out
again at once, as EC2 may). The node's subnet is the first of its VPC; `add_subnet` makes more (in the
node's zone or another, with tags), `tag_subnet` retags one, and an ENI other users of the instance
own (EFA, trunk, `no_manage`) is made with `attach_foreign`.

On top of the truth it models EC2's eventual consistency: Describe may serve, per unit and per ENI
attachment, the state as it was up to `lag_s` seconds ago by the injected clock — an assigned unit
appears late, an unassigned one lingers. The answers to mutations are always current.
The lag must stay within the grace window given to the reconciler: that is the premise ipamd documents
(docs/architecture.md §6.2), and nothing can be right without it.

`FakeImds` serves the truth through knobs that make it stale in both directions, per unit and for as
long as a test likes (seed 001: IMDS was wrong for hours): `keep` a released unit listed, `hide` an
assigned one, `hide_enis` a whole ENI. It never lists a unit EC2 never had.

`FakeRuntime` is the set of live pod sandboxes, and may be unreachable.

They keep state a test can read (the truth, the units ever unassigned, call counts); none records
call sequences to assert on. Failures are the cloud's typed errors, as the real adapters raise them.
"""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import random
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from cloud.errors import (
    AddressLimitExceeded,
    AttachmentLimitExceeded,
    CallTimeout,
    InUse,
    NotFound,
    Rejected,
    ServiceUnavailable,
    SubnetExhausted,
)
from cloud.models import InstanceLimits, NetworkInterface, Subnet, UnitKind
from cloud.ports import ImdsIdentity, ImdsInterface, Instance
from ipamd.awsnode.checkpoint import CheckpointFile
from ipamd.clock import Clock, FakeClock
from ipamd.config.settings import Config
from ipamd.node.daemon import Daemon, build_daemon
from ipamd.runtime.ports import RuntimeUnavailable, Sandbox

PREFIX_SIZE = 16


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
    units: dict[str, UnitKind] = field(default_factory=dict)
    """CIDR -> kind, in the order EC2 assigned them."""
    deleted: bool = False
    last_device_index: int | None = None
    """Where it was last attached: a lagging Describe still shows it there."""
    last_attachment_id: str | None = None
    groups: tuple[str, ...] = ()
    """The security groups it was created with."""
    interface_type: str = "interface"
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

    def __post_init__(self) -> None:
        # EC2 reserves the first four addresses of a subnet and the last one.
        self.first = self.ip_cursor = int(self.cidr.network_address) + 4
        self.last = int(self.cidr.broadcast_address) - 1
        self.block_cursor = int(self.cidr.network_address)

    @property
    def available(self) -> int:
        return self.last - self.first + 1 - len(self.used)

    def draw(self, kind: UnitKind) -> str | None:
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
        return Subnet(
            self.subnet_id, str(self.cidr), self.available, vpc_id, self.zone, dict(self.tags)
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


class FakeEc2:
    """`cloud.ports.Ec2Api` and `Ec2Catalog` for one instance, in memory."""

    def __init__(
        self,
        clock: Clock,
        *,
        instance_id: str = "i-0fake0000000001",
        instance_type: str = "m5.large",
        subnet_cidr: str = "10.0.0.0/16",
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
            self.subnet_id: FakeSubnet(self.subnet_id, self.subnet_cidr, self.zone)
        }
        self.max_enis = max_enis
        self.ipv4_per_eni = ipv4_per_eni
        self.lag_s = lag_s
        """Describe shows each change at most this long after it happened."""
        self.lag_rng = lag_rng
        """Draws each change's lag in [0, lag_s]; None: every change lags exactly `lag_s`."""
        self.enis: dict[str, FakeEni] = {}
        self.calls: Counter[str] = Counter()
        self.unassigned: list[tuple[float, str, str]] = []
        """(when, ENI, CIDR) of every unit that left an ENI: unassigned, or deleted with it."""
        self.last_eni: dict[str, str] = {}
        """The ENI each unit was last assigned to (what a stale IMDS keeps it on)."""
        self._kind: dict[str, UnitKind] = {}
        self._unit_eni: dict[str, str] = {}
        self._unit_view = _Lagged()
        self._eni_view = _Lagged()
        self._ids = itertools.count(1)
        self._faults: list[tuple[str, bool]] = []
        primary = self._new_eni(self.subnet_id, "primary network interface", {}, ("sg-0fake",))
        self._attach(primary, 0, lag_s=0.0)

    # -- the VPC, for tests ------------------------------------------------------------------------

    def add_subnet(
        self, cidr: str, tags: Mapping[str, str] | None = None, zone: str = "us-west-2a"
    ) -> str:
        """Another subnet of the VPC (in the node's zone unless `zone` says otherwise); its ID."""
        subnet_id = f"subnet-{len(self.subnets):04x}fake"
        net = ipaddress.IPv4Network(cidr)
        self.subnets[subnet_id] = FakeSubnet(subnet_id, net, zone, dict(tags or {}))
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

    def fail_next(self, operation: str, after_acting: bool) -> None:
        """The next call of `operation` (a port method name) times out, before EC2 acted or after."""
        self._faults.append((operation, after_acting))

    def clear_faults(self) -> None:
        self._faults.clear()

    # -- Ec2Api ------------------------------------------------------------------------------------

    async def describe_enis(self, instance_id: str) -> tuple[NetworkInterface, ...]:
        self._fault("describe_enis", after=False)
        self.calls["describe_enis"] += 1
        if instance_id != self.instance_id:
            return ()
        now = self.clock.now()
        self._unit_view.settle(now)
        self._eni_view.settle(now)
        lagging = dict(self._unit_view.items(now))
        units_on: dict[str, list[str]] = {}
        for eni in self.enis.values():
            units = list(eni.units)
            units_on[eni.eni_id] = [c for c in units if c not in lagging] if lagging else units
        for cidr, seen in lagging.items():
            if isinstance(seen, str):
                units_on.setdefault(seen, []).append(cidr)
        attached = [e for e in self.enis.values() if e.eni_id not in self._eni_view]
        attached = [e for e in attached if e.device_index is not None]
        attached += [self.enis[k] for k, seen in self._eni_view.items(now) if seen is True]
        return tuple(
            self._as_model(eni, units_on.get(eni.eni_id, []), True)
            for eni in sorted(attached, key=lambda e: e.last_device_index or 0)
        )

    async def create_eni(
        self,
        subnet_id: str,
        security_groups: Sequence[str],
        description: str,
        tags: Mapping[str, str],
        *,
        kind: UnitKind = "ip",
        count: int = 0,
    ) -> NetworkInterface:
        self._fault("create_eni", after=False)
        self.calls["create_eni"] += 1
        if subnet_id not in self.subnets:
            raise NotFound("CreateNetworkInterface", "InvalidSubnetID.NotFound", subnet_id)
        if count > 0 and 1 + count > self.ipv4_per_eni:
            raise AddressLimitExceeded(
                "CreateNetworkInterface", "PrivateIpAddressLimitExceeded", subnet_id
            )
        eni = self._new_eni(subnet_id, description, dict(tags), tuple(security_groups))
        if count > 0:
            try:
                self._draw_units("CreateNetworkInterface", eni, kind, count)
            except SubnetExhausted:
                # EC2 creates nothing when it cannot give the addresses asked for.
                self.subnets[subnet_id].free(f"{eni.primary_ip}/32")
                del self.enis[eni.eni_id]
                raise
        self._fault("create_eni", after=True)
        return self._as_model(eni, list(eni.units), attached=False)

    async def attach_eni(self, eni_id: str, instance_id: str, device_index: int) -> str:
        self._fault("attach_eni", after=False)
        self.calls["attach_eni"] += 1
        eni = self._eni("AttachNetworkInterface", eni_id)
        if instance_id != self.instance_id:
            raise NotFound("AttachNetworkInterface", "InvalidInstanceID.NotFound", instance_id)
        if eni.device_index is not None:
            raise InUse("AttachNetworkInterface", "InvalidNetworkInterface.InUse", eni_id)
        if self.subnets[eni.subnet_id].zone != self.zone:
            raise Rejected("AttachNetworkInterface", "InvalidParameterCombination", eni_id)
        attached = [e for e in self.enis.values() if e.device_index is not None]
        if any(e.device_index == device_index for e in attached):
            raise Rejected("AttachNetworkInterface", "InvalidParameterValue", str(device_index))
        if len(attached) >= self.max_enis:
            raise AttachmentLimitExceeded("AttachNetworkInterface", "AttachmentLimitExceeded")
        self._attach(eni, device_index, self._draw_lag())
        self._fault("attach_eni", after=True)
        assert eni.attachment_id is not None
        return eni.attachment_id

    async def set_delete_on_termination(self, eni_id: str, attachment_id: str) -> None:
        self._fault("set_delete_on_termination", after=False)
        self.calls["set_delete_on_termination"] += 1
        eni = self._eni("ModifyNetworkInterfaceAttribute", eni_id)
        if eni.attachment_id != attachment_id:
            raise NotFound(
                "ModifyNetworkInterfaceAttribute", "InvalidAttachmentID.NotFound", attachment_id
            )
        eni.delete_on_termination = True
        self._fault("set_delete_on_termination", after=True)

    async def detach_eni(self, attachment_id: str) -> None:
        self._fault("detach_eni", after=False)
        self.calls["detach_eni"] += 1
        eni = next((e for e in self.enis.values() if e.attachment_id == attachment_id), None)
        if eni is None:
            raise NotFound("DetachNetworkInterface", "InvalidAttachmentID.NotFound", attachment_id)
        eni.device_index = eni.attachment_id = None
        eni.delete_on_termination = False
        self._eni_view.changed(eni.eni_id, True, False, self.clock.now(), self._draw_lag())
        self._fault("detach_eni", after=True)

    async def delete_eni(self, eni_id: str) -> None:
        self._fault("delete_eni", after=False)
        self.calls["delete_eni"] += 1
        eni = self._eni("DeleteNetworkInterface", eni_id)
        if eni.device_index is not None:
            raise InUse("DeleteNetworkInterface", "InvalidNetworkInterface.InUse", eni_id)
        self._remove_units(eni, list(eni.units))
        self.subnets[eni.subnet_id].free(f"{eni.primary_ip}/32")
        eni.deleted = True
        self._fault("delete_eni", after=True)

    async def assign_units(self, eni_id: str, kind: UnitKind, count: int) -> tuple[str, ...]:
        self._fault("assign_units", after=False)
        self.calls["assign_units"] += 1
        eni = self._eni("AssignPrivateIpAddresses", eni_id)
        if count < 1:
            return ()
        if 1 + len(eni.units) + count > self.ipv4_per_eni:
            raise AddressLimitExceeded(
                "AssignPrivateIpAddresses", "PrivateIpAddressLimitExceeded", eni_id
            )
        new = self._draw_units("AssignPrivateIpAddresses", eni, kind, count)
        self._fault("assign_units", after=True)
        return new

    def _draw_units(
        self, operation: str, eni: FakeEni, kind: UnitKind, count: int
    ) -> tuple[str, ...]:
        """`count` units of `kind` from the ENI's subnet onto it, or none and `SubnetExhausted`."""
        subnet = self.subnets[eni.subnet_id]
        drawn = [subnet.draw(kind) for _ in range(count)]
        if None in drawn:
            for cidr in drawn:
                if cidr is not None:
                    subnet.free(cidr)
            code = "InsufficientCidrBlocks" if kind == "prefix" else "InsufficientFreeAddresses"
            raise SubnetExhausted(operation, code, eni.subnet_id)
        new = tuple(c for c in drawn if c is not None)
        now = self.clock.now()
        for cidr in new:
            self._put_unit(eni, cidr, kind, now, self._draw_lag())
        return new

    async def unassign_units(self, eni_id: str, kind: UnitKind, cidrs: Sequence[str]) -> None:
        self._fault("unassign_units", after=False)
        self.calls["unassign_units"] += 1
        eni = self._eni("UnassignPrivateIpAddresses", eni_id)
        if any(eni.units.get(c) != kind for c in cidrs):
            # EC2 changes nothing when one of the named addresses is not the ENI's.
            raise Rejected(
                "UnassignPrivateIpAddresses", "InvalidParameterValue", f"not all on {eni_id}"
            )
        self._remove_units(eni, list(cidrs))
        self._fault("unassign_units", after=True)

    async def find_enis(
        self, tags: Mapping[str, str], *, available_only: bool = False
    ) -> tuple[NetworkInterface, ...]:
        self.calls["find_enis"] += 1
        if not tags:
            raise ValueError("find_enis needs at least one tag: an untagged query scans the VPC")
        return tuple(
            self._as_model(e, list(e.units), e.device_index is not None)
            for e in self.enis.values()
            if not e.deleted
            and all(e.tags.get(k) == v for k, v in tags.items())
            and not (available_only and e.device_index is not None)
        )

    # -- Ec2Catalog ------------------------------------------------------------------------------

    async def describe_instance(self, instance_id: str) -> Instance:
        self._fault("describe_instance", after=False)
        self.calls["describe_instance"] += 1
        if instance_id != self.instance_id:
            raise NotFound("DescribeInstances", "InvalidInstanceID.NotFound", instance_id)
        primary = next(e for e in self.enis.values() if e.device_index == 0)
        return Instance(
            instance_id,
            self.instance_type,
            self.subnet_id,
            primary.groups,
            self.zone,
            primary.primary_ip,
            self.vpc_id,
        )

    async def instance_limits(self, instance_type: str) -> InstanceLimits:
        return InstanceLimits(instance_type, self.max_enis, self.ipv4_per_eni)

    async def subnet(self, subnet_id: str) -> Subnet:
        self.calls["subnet"] += 1
        if subnet_id not in self.subnets:
            raise NotFound("DescribeSubnets", "InvalidSubnetID.NotFound", subnet_id)
        return self.subnets[subnet_id].as_model(self.vpc_id)

    async def subnets_in(self, vpc_id: str, availability_zone: str) -> tuple[Subnet, ...]:
        self._fault("subnets_in", after=False)
        self.calls["subnets_in"] += 1
        if vpc_id != self.vpc_id:
            return ()
        return tuple(
            s.as_model(self.vpc_id)
            for _, s in sorted(self.subnets.items())
            if s.zone == availability_zone
        )

    # -- inside EC2 ------------------------------------------------------------------------------

    def _fault(self, operation: str, after: bool) -> None:
        for i, (op, after_acting) in enumerate(self._faults):
            if op == operation and after_acting == after:
                del self._faults[i]
                # An answer lost after EC2 acted, or a request that never reached it: either way a
                # timeout, whose outcome the caller does not know.
                raise CallTimeout(operation, "ReadTimeout", "injected")

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

    def _put_unit(self, eni: FakeEni, cidr: str, kind: UnitKind, now: float, lag_s: float) -> None:
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
            tags=dict(eni.tags),
            delete_on_termination=attached and eni.delete_on_termination,
            interface_type=eni.interface_type,
        )


class FakeImds:
    """`cloud.ports.Imds` over a `FakeEc2`'s truth, stale on request. Every knob is off at first."""

    def __init__(self, ec2: FakeEc2, region: str = "us-west-2") -> None:
        self._ec2 = ec2
        self._region = region
        self.kept: set[str] = set()
        """Units IMDS keeps listing on the ENI they were last on, after EC2 released them."""
        self.hidden: set[str] = set()
        """Units IMDS does not list although EC2 has them."""
        self.hidden_enis: set[str] = set()
        """ENIs IMDS does not list at all yet."""
        self.available = True
        self.reads = 0

    def stale(self) -> bool:
        return bool(self.kept or self.hidden or self.hidden_enis)

    def heal(self) -> None:
        """IMDS catches up with EC2."""
        self.kept.clear()
        self.hidden.clear()
        self.hidden_enis.clear()

    async def identity(self) -> ImdsIdentity:
        self._read()
        ec2 = self._ec2
        macs = tuple(e.mac for e in ec2.enis.values() if e.device_index is not None)
        return ImdsIdentity(ec2.instance_id, ec2.instance_type, self._region, "us-west-2a", macs)

    async def interfaces(self) -> tuple[ImdsInterface, ...]:
        self._read()
        ec2 = self._ec2
        attached = [e for e in ec2.enis.values() if e.device_index is not None]
        kept_on: dict[str, list[str]] = {}
        for cidr in self.kept:
            eni_id = ec2.last_eni.get(cidr)
            if eni_id is not None and ec2.eni_of(cidr) != eni_id:
                kept_on.setdefault(eni_id, []).append(cidr)
        answer: list[ImdsInterface] = []
        for eni in sorted(attached, key=lambda e: e.device_index or 0):
            if eni.eni_id in self.hidden_enis:
                continue
            units = [c for c in (*eni.units, *kept_on.get(eni.eni_id, ())) if c not in self.hidden]
            prefixes = tuple(c for c in units if c.endswith("/28"))
            secondaries = tuple(c.removesuffix("/32") for c in units if c.endswith("/32"))
            answer.append(
                ImdsInterface(
                    mac=eni.mac,
                    eni_id=eni.eni_id,
                    device_number=eni.device_index or 0,
                    subnet_id=eni.subnet_id,
                    local_ipv4s=(eni.primary_ip, *secondaries),
                    ipv4_prefixes=prefixes,
                )
            )
        return tuple(answer)

    def _read(self) -> None:
        self.reads += 1
        if not self.available:
            raise ServiceUnavailable("ImdsGet", "503", "injected")


class FakeRuntime:
    """`ipamd.runtime.ports.RuntimeApi`: the live pod sandboxes, by ID."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self.sandboxes: dict[str, Sandbox] = {}
        self.reachable = True
        self.listings = 0

    def start(self, sandbox_id: str) -> None:
        self.sandboxes[sandbox_id] = Sandbox(sandbox_id, "ready", self._clock.now())

    def stop(self, sandbox_id: str) -> None:
        """The sandbox is gone (removed by the runtime, with or without a DEL to ipamd)."""
        self.sandboxes.pop(sandbox_id, None)

    async def list_sandboxes(self) -> tuple[Sandbox, ...]:
        if not self.reachable:
            raise RuntimeUnavailable("injected: the runtime's socket does not answer")
        self.listings += 1
        return tuple(self.sandboxes.values())

    async def version(self) -> str:
        if not self.reachable:
            raise RuntimeUnavailable("injected: the runtime's socket does not answer")
        return "fake-runtime 1.0"


class NoSandboxAddresses:
    """Repair's evidence source for daemons that never repair: asking is an unreachable runtime."""

    async def sandbox_addresses(self, sandbox_id: str) -> tuple[str, ...]:
        raise RuntimeUnavailable("this test's runtime records no sandbox addresses")


async def fake_daemon(
    config: Config,
    ec2: FakeEc2,
    clock: FakeClock,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    *,
    runtime: FakeRuntime | None = None,
    checkpoint: CheckpointFile | None = None,
) -> Daemon:
    """The daemon's parts, built by `build_daemon` itself, on the in-memory EC2 and IMDS (`sleep`:
    how its start-up waits; `checkpoint`: aws-node's checkpoint file, to take over and keep)."""
    return await build_daemon(
        config,
        ec2=ec2,
        imds=FakeImds(ec2),
        runtime=runtime or FakeRuntime(clock),
        addresses=NoSandboxAddresses(),
        clock=clock,
        checkpoint=checkpoint,
        sleep=sleep,
    )
