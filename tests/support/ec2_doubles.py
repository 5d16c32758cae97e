"""Doubles for the EC2 port, for scenario tests: wrappers that pass every call to the real adapter
(`cloud.ec2.Boto3Ec2` on the embedded EC2) and change only *when* a call happens or *what a
Describe shows* — a call held at a gate, a Describe that lags behind the last mutation — plus an
adapter on a fault-injected client that retries without sleeping.

They keep state a test can read (who arrived at a gate, how many stale answers were given); none
of them records call sequences to assert on. Pass a class (or `retrying_on`'s result) to
`open_cloud_node(api_wrapper=...)`.

A double's view under an urgency (`with_urgency`) is a shallow copy of it on the inner adapter's
view: it shares the double's state, so what a double keeps (gates, views, counts) it keeps in
objects a copy shares, never in a plain number or flag it reassigns.
"""

from __future__ import annotations

import asyncio
import copy
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Self, TypeVar

from cloud.ec2 import Boto3Ec2
from cloud.embedded.faults import FaultInjector
from cloud.models import Ipv4UnitKind, NetworkInterface
from cloud.ports import CallUrgency, Ec2Api
from ipamd.engine.invariants import check_invariants
from ipamd.node.cloud_node import FAST, CloudNode

T = TypeVar("T")


class PassThroughEc2:
    """An `Ec2Api` that hands every call to `inner`, through `_around` (the subclasses' hook)."""

    def __init__(self, inner: Ec2Api) -> None:
        self.inner = inner

    def with_urgency(self, urgency: CallUrgency) -> Self:
        view = copy.copy(self)
        view.inner = self.inner.with_urgency(urgency)
        return view

    async def _around(self, operation: str, call: Callable[[], Awaitable[T]]) -> T:
        return await call()

    async def describe_enis(self, instance_id: str) -> tuple[NetworkInterface, ...]:
        return await self._around("describe_enis", lambda: self.inner.describe_enis(instance_id))

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
        return await self._around(
            "create_eni",
            lambda: self.inner.create_eni(
                subnet_id, security_groups, description, tags, kind=kind, count=count
            ),
        )

    async def attach_eni(self, eni_id: str, instance_id: str, device_index: int) -> str:
        return await self._around(
            "attach_eni", lambda: self.inner.attach_eni(eni_id, instance_id, device_index)
        )

    async def set_delete_on_termination(self, eni_id: str, attachment_id: str) -> None:
        await self._around(
            "set_delete_on_termination",
            lambda: self.inner.set_delete_on_termination(eni_id, attachment_id),
        )

    async def detach_eni(self, attachment_id: str) -> None:
        await self._around("detach_eni", lambda: self.inner.detach_eni(attachment_id))

    async def delete_eni(self, eni_id: str) -> None:
        await self._around("delete_eni", lambda: self.inner.delete_eni(eni_id))

    async def assign_units(self, eni_id: str, kind: Ipv4UnitKind, count: int) -> tuple[str, ...]:
        return await self._around(
            "assign_units", lambda: self.inner.assign_units(eni_id, kind, count)
        )

    async def unassign_units(self, eni_id: str, kind: Ipv4UnitKind, cidrs: Sequence[str]) -> None:
        await self._around("unassign_units", lambda: self.inner.unassign_units(eni_id, kind, cidrs))

    async def assign_ipv6_prefix(self, eni_id: str) -> str:
        return await self._around(
            "assign_ipv6_prefix", lambda: self.inner.assign_ipv6_prefix(eni_id)
        )

    async def find_enis(
        self, tags: Mapping[str, str], *, available_only: bool = False
    ) -> tuple[NetworkInterface, ...]:
        return await self._around(
            "find_enis", lambda: self.inner.find_enis(tags, available_only=available_only)
        )


class GatedEc2(PassThroughEc2):
    """Holds calls to chosen operations before they reach EC2, until the test opens the gate.

    `hold("unassign_units")` closes the gate of that operation and returns it; `arrived(op)` is set
    once a call to `op` has come in (and, if held, is waiting). Operation names are the port's
    method names."""

    def __init__(self, inner: Ec2Api) -> None:
        super().__init__(inner)
        self._gates: dict[str, asyncio.Event] = {}
        self._arrived: dict[str, asyncio.Event] = {}

    def hold(self, operation: str) -> asyncio.Event:
        gate = self._gates[operation] = asyncio.Event()
        return gate

    def arrived(self, operation: str) -> asyncio.Event:
        return self._arrived.setdefault(operation, asyncio.Event())

    async def wait_arrival(self, operation: str, timeout_s: float = 10.0) -> None:
        async with asyncio.timeout(timeout_s):
            await self.arrived(operation).wait()

    async def _around(self, operation: str, call: Callable[[], Awaitable[T]]) -> T:
        self.arrived(operation).set()
        gate = self._gates.get(operation)
        if gate is not None:
            await gate.wait()
        return await call()


_MUTATIONS = frozenset(
    {"create_eni", "attach_eni", "detach_eni", "delete_eni", "assign_units", "unassign_units"}
)


class LaggingEc2(PassThroughEc2):
    """DescribeNetworkInterfaces one mutation behind: once a mutation has been sent, Describe for
    an instance answers with what EC2 held just before the most recent mutation (EC2's eventual
    consistency at its worst that still moves forward). The mutations' own answers are current."""

    def __init__(self, inner: Ec2Api) -> None:
        super().__init__(inner)
        self._instances: set[str] = set()
        self._views: dict[str, tuple[NetworkInterface, ...]] = {}
        self._stale = [0]

    @property
    def stale_answers(self) -> int:
        """Describe answers served from an older view."""
        return self._stale[0]

    async def describe_enis(self, instance_id: str) -> tuple[NetworkInterface, ...]:
        self._instances.add(instance_id)
        view = self._views.get(instance_id)
        if view is None:  # nothing mutated since this instance was first described: current
            return await self.inner.describe_enis(instance_id)
        self._stale[0] += 1
        return view

    async def _around(self, operation: str, call: Callable[[], Awaitable[T]]) -> T:
        if operation in _MUTATIONS:
            for instance_id in sorted(self._instances):
                self._views[instance_id] = await self.inner.describe_enis(instance_id)
        return await call()


async def _no_sleep(_seconds: float) -> None:
    await asyncio.sleep(0)


def retrying_on(faults: FaultInjector, seed: int = 5) -> Callable[[Boto3Ec2], Ec2Api]:
    """An `api_wrapper` for `open_cloud_node`: the real adapter on the node's own boto3 client with
    `faults` attached (no rules yet: add them once the node is open), sharing the node's `CallLog`,
    whose retries back off by the seeded jitter without really sleeping."""

    def wrap(ec2: Boto3Ec2) -> Ec2Api:
        # The node's client: the world exists by now, and the adapter has no public accessor.
        client: Any = ec2._client
        faults.attach(client)
        return Boto3Ec2(
            client, recorder=ec2.recorder, limits=FAST, sleep=_no_sleep, rng=random.Random(seed)
        )

    return wrap


def ec2_units_of_both_kinds(node: CloudNode) -> dict[str, set[str]]:
    """EC2's view with secondary IPs and prefixes together (prefix mode falling back to IPs)."""
    backend: Any = node.world.backend()
    instance = backend.get_instance(node.world.instance_id)
    return {
        eni.id: {p["Ipv4Prefix"] for p in getattr(eni, "ipv4_prefixes", [])}
        | {f"{a['PrivateIpAddress']}/32" for a in eni.private_ip_addresses if not a.get("Primary")}
        for eni in instance.nics.values()
    }


def check_mixed(node: CloudNode) -> None:
    """`CloudNode.check` for a pool holding units of both kinds."""
    check_invariants(node.engine, node.path, node.clock.now())
    assert ec2_units_of_both_kinds(node) == node.ipamd_units(), "EC2 equals what ipamd believes"
