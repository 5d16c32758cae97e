"""In-memory doubles of the cloud's ports (`cloud.ports`) for one node, with state, fast enough for
thousands of reconcile rounds: EC2 (`FakeEc2`, on the truth `cloud.fake_vpc.FakeVpc` keeps) and the
instance metadata service (`FakeImds`).

`FakeEc2.fail_next` makes the next call of an operation time out, before EC2 acted or after.
`FakeEc2.with_urgency` gives a view that passes each call to the fake as it is then (its knobs, a
method a test replaced) and counts it under its urgency (`calls_under`); the fake has no
retries, so the urgency changes nothing else.

`FakeImds` serves the truth through knobs that make it stale in both directions, per unit and for as
long as a test likes (seed 001: IMDS was wrong for hours): `keep` a released unit listed, `hide` an
assigned one, `hide_enis` a whole ENI. It never lists a unit EC2 never had.

They keep state a test can read (the truth, the units ever unassigned, call counts); none records
call sequences to assert on. Failures are the cloud's typed errors, as the real adapters raise them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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
from cloud.fake_vpc import FakeEni, FakeSubnet, FakeVpc
from cloud.models import InstanceLimits, Ipv4UnitKind, NetworkInterface, Subnet
from cloud.ports import CallUrgency, ImdsIdentity, ImdsInterface, Instance

__all__ = ["FakeEc2", "FakeEc2View", "FakeEni", "FakeImds", "FakeSubnet"]


class FakeEc2(FakeVpc):
    """`cloud.ports.Ec2Api` and `Ec2Catalog` for one instance, in memory."""

    def with_urgency(self, urgency: CallUrgency) -> FakeEc2View:
        return FakeEc2View(self, urgency)

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
        kind: Ipv4UnitKind = "ip",
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
        block = self.subnets[eni.subnet_id].ipv6
        if block is not None:
            for prefix in eni.ipv6_prefixes:
                block.free(prefix)
        eni.deleted = True
        self._fault("delete_eni", after=True)

    async def assign_units(self, eni_id: str, kind: Ipv4UnitKind, count: int) -> tuple[str, ...]:
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

    async def unassign_units(self, eni_id: str, kind: Ipv4UnitKind, cidrs: Sequence[str]) -> None:
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

    async def assign_ipv6_prefix(self, eni_id: str) -> str:
        self._fault("assign_ipv6_prefix", after=False)
        self.calls["assign_ipv6_prefix"] += 1
        prefix = self._draw_ipv6_prefix(
            "AssignIpv6Addresses", self._eni("AssignIpv6Addresses", eni_id)
        )
        self._fault("assign_ipv6_prefix", after=True)
        return prefix

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


class FakeEc2View:
    """A `FakeEc2` under an urgency: each call counted in `calls_under`, then passed on."""

    def __init__(self, fake: FakeEc2, urgency: CallUrgency) -> None:
        self.fake = fake
        self.urgency = urgency

    def with_urgency(self, urgency: CallUrgency) -> FakeEc2View:
        return FakeEc2View(self.fake, urgency)

    def _count(self, operation: str) -> FakeEc2:
        self.fake.calls_under[(operation, self.urgency)] += 1
        return self.fake

    async def describe_enis(self, instance_id: str) -> tuple[NetworkInterface, ...]:
        return await self._count("describe_enis").describe_enis(instance_id)

    async def create_eni(
        self,
        subnet_id: str,
        security_groups: Sequence[str],
        description: str,
        tags: Mapping[str, str],
        *,
        kind: Ipv4UnitKind = "ip",
        count: int = 0,
    ) -> NetworkInterface:
        return await self._count("create_eni").create_eni(
            subnet_id, security_groups, description, tags, kind=kind, count=count
        )

    async def attach_eni(self, eni_id: str, instance_id: str, device_index: int) -> str:
        return await self._count("attach_eni").attach_eni(eni_id, instance_id, device_index)

    async def set_delete_on_termination(self, eni_id: str, attachment_id: str) -> None:
        fake = self._count("set_delete_on_termination")
        await fake.set_delete_on_termination(eni_id, attachment_id)

    async def detach_eni(self, attachment_id: str) -> None:
        await self._count("detach_eni").detach_eni(attachment_id)

    async def delete_eni(self, eni_id: str) -> None:
        await self._count("delete_eni").delete_eni(eni_id)

    async def assign_units(self, eni_id: str, kind: Ipv4UnitKind, count: int) -> tuple[str, ...]:
        return await self._count("assign_units").assign_units(eni_id, kind, count)

    async def unassign_units(self, eni_id: str, kind: Ipv4UnitKind, cidrs: Sequence[str]) -> None:
        await self._count("unassign_units").unassign_units(eni_id, kind, cidrs)

    async def assign_ipv6_prefix(self, eni_id: str) -> str:
        return await self._count("assign_ipv6_prefix").assign_ipv6_prefix(eni_id)

    async def find_enis(
        self, tags: Mapping[str, str], *, available_only: bool = False
    ) -> tuple[NetworkInterface, ...]:
        return await self._count("find_enis").find_enis(tags, available_only=available_only)

    async def describe_instance(self, instance_id: str) -> Instance:
        return await self._count("describe_instance").describe_instance(instance_id)

    async def instance_limits(self, instance_type: str) -> InstanceLimits:
        return await self._count("instance_limits").instance_limits(instance_type)

    async def subnet(self, subnet_id: str) -> Subnet:
        return await self._count("subnet").subnet(subnet_id)

    async def subnets_in(self, vpc_id: str, availability_zone: str) -> tuple[Subnet, ...]:
        return await self._count("subnets_in").subnets_in(vpc_id, availability_zone)


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
