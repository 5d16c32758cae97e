"""`Boto3Ec2`: the EC2 adapter behind both `Ec2Api` and `Ec2Catalog`, and the only home of boto3.

It owns: running the synchronous boto3 client off the event loop (a worker thread per call, at most
`max_concurrent_calls` at once, each attempt bounded by `call_timeout_s`), translating every botocore
exception into a `cloud.errors.CloudError` by AWS error code (never by message text; which code is
which error is `cloud.ec2_codes`), the call budget
and retries (`cloud.ratelimit.Retrier`: what is retried and why is written there), recording every
attempt (`cloud.calls.CallRecorder`), and turning EC2's dictionaries into `cloud.models` values.
An adapter makes its calls under one `cloud.ports.CallUrgency` (foreground when built); `with_urgency`
gives a view of it under another, sharing the client, the call slots, the token buckets, the limits
cache and the ENI locks, so views of one adapter compete for one budget.
It must not: keep any view of the inventory between calls, decide anything about pools, or let a
botocore exception or a boto3 dictionary out of this module.

The client is injected (`make_client` builds the production one) with botocore's own retries off, so
backoff happens at one level only, ours.

The deadline of an EC2 call is here and only here, so that every caller (the pool manager, the
reconcilers, the datapath, start-up) gets the same one: each attempt, from waiting for a call slot
to the answer, has `call_timeout_s` (IPAMD_EC2_CALL_TIMEOUT); one that misses it is a `CallTimeout`
whose outcome is unknown unless the request never went out, and is retried as `cloud.ratelimit`
says. A call is therefore bounded by its attempts (`RetryPolicy.max_attempts`) and the capped
backoff between them; only its turn for a token, which `cloud.ratelimit`'s buckets hand out in
arrival order at their refill rate, is outside the deadline. botocore's connect and read timeouts
(HTTP_TIMEOUT) sit below it: they say which side failed, whether EC2 may have acted.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import boto3
from botocore import xform_name
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    HTTPClientError,
    ReadTimeoutError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from cloud.calls import CallLog, CallRecorder
from cloud.ec2_answers import (
    assigned_ipv6_prefix,
    assigned_units,
    host_address,
    parse_eni,
    parse_instance,
    parse_limits,
    parse_subnet,
)
from cloud.ec2_codes import error_for_code
from cloud.errors import CallTimeout, NotFound, Rejected, ServiceUnavailable
from cloud.limits import FALLBACK_LIMITS, InstanceLimitsCache
from cloud.models import InstanceLimits, Ipv4UnitKind, NetworkInterface, Subnet
from cloud.ports import CallUrgency, Instance
from cloud.ratelimit import (
    AttemptFailed,
    MonotonicClock,
    RateLimits,
    Retrier,
    RetryPolicy,
    Sleep,
)

logger = logging.getLogger(__name__)

Ec2Client = Any
"""A boto3 EC2 client (boto3 ships no types)."""
Response = dict[str, Any]
"""A boto3 answer; read only through the typed parsers of `cloud.ec2_answers`."""


def client_config(timeout_s: float = 10.0) -> Config:
    """botocore connect and read timeouts of `timeout_s`, and botocore's retries off: backoff happens
    at one level only, ours (`cloud.ratelimit`)."""
    return Config(
        connect_timeout=timeout_s,
        read_timeout=timeout_s,
        # botocore's `max_attempts` counts retries (1 would mean two attempts); `total_max_attempts`
        # counts attempts, and 1 turns botocore's retries off.
        retries={"total_max_attempts": 1, "mode": "standard"},
        user_agent_extra="ipamd",
    )


def make_client(region: str, endpoint_url: str | None = None, timeout_s: float = 10.0) -> Ec2Client:
    """The production EC2 client (`client_config`), credentials from the usual AWS chain."""
    session = boto3.session.Session()
    return session.client(
        "ec2", region_name=region, endpoint_url=endpoint_url, config=client_config(timeout_s)
    )


# -- error translation --------------------------------------------------------------------------


def translate(operation: str, exc: Exception) -> AttemptFailed:
    """A botocore exception as a `CloudError`, with whether EC2 surely did not act on the request."""
    if isinstance(exc, ClientError):
        error = exc.response.get("Error") or {}
        meta = exc.response.get("ResponseMetadata") or {}
        code = str(error.get("Code") or "Unknown")
        status = int(meta.get("HTTPStatusCode") or 0)
        return error_for_code(operation, code, str(error.get("Message") or ""), status)
    name = type(exc).__name__
    if isinstance(exc, (ReadTimeoutError, ConnectTimeoutError)):
        # A connect timeout never reached EC2; a read timeout did, and its outcome is unknown.
        not_applied = isinstance(exc, ConnectTimeoutError)
        return AttemptFailed(CallTimeout(operation, name, str(exc)), not_applied=not_applied)
    if isinstance(exc, BotoConnectionError):  # EndpointConnectionError, proxy, TLS: never connected
        return AttemptFailed(ServiceUnavailable(operation, name, str(exc)), not_applied=True)
    if isinstance(exc, HTTPClientError):  # ConnectionClosedError: dropped mid-request
        return AttemptFailed(ServiceUnavailable(operation, name, str(exc)), not_applied=False)
    # No credentials, a parameter botocore refused: nothing was sent, and sending again won't help.
    return AttemptFailed(Rejected(operation, name, str(exc)), not_applied=True)


# -- the adapter ----------------------------------------------------------------------------------


class Boto3Ec2:
    """`Ec2Api` and `Ec2Catalog` over a boto3 EC2 client. Every method raises only `CloudError`s (and
    `ValueError` for a request it refuses to send, e.g. an untagged `find_enis`)."""

    def __init__(
        self,
        client: Ec2Client,
        *,
        recorder: CallRecorder | None = None,
        max_concurrent_calls: int = 4,
        call_timeout_s: float = 20.0,
        limits: RateLimits | None = None,
        retry: RetryPolicy | None = None,
        clock: MonotonicClock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        rng: random.Random | None = None,
        fallback_limits: Mapping[str, InstanceLimits] = FALLBACK_LIMITS,
    ) -> None:
        """`call_timeout_s` is the deadline of one attempt, waiting for a call slot included: the
        only deadline on an EC2 call (module docstring). Keep it at or above the client's connect
        and read timeouts, so that botocore's own timeouts, which say which side failed, fire
        first. `max_concurrent_calls` bounds the worker threads in use."""
        self._client = client
        self.recorder: CallRecorder = recorder if recorder is not None else CallLog()
        self._slots = asyncio.Semaphore(max_concurrent_calls)
        self._call_timeout_s = call_timeout_s
        self._retrier = Retrier(
            self.recorder, limits=limits, policy=retry, clock=clock, sleep=sleep, rng=rng
        )
        self._limits = InstanceLimitsCache(fallback_limits)
        self._eni_locks: dict[str, asyncio.Lock] = {}
        self._urgency = CallUrgency.FOREGROUND

    def with_urgency(self, urgency: CallUrgency) -> Boto3Ec2:
        """This adapter with its calls made under `urgency`: a shallow copy, so everything it holds
        (the client, the call slots, the retrier and its buckets, the limits cache, the ENI locks)
        is the same object in both."""
        view = copy.copy(self)
        view._urgency = urgency
        return view

    # -- Ec2Api ----------------------------------------------------------------------------------

    async def describe_enis(self, instance_id: str) -> tuple[NetworkInterface, ...]:
        filters = [{"Name": "attachment.instance-id", "Values": [instance_id]}]
        raw = await self._describe_all(
            "DescribeNetworkInterfaces", "NetworkInterfaces", {"Filters": filters}
        )
        enis = [parse_eni(d) for d in raw]
        enis.sort(key=lambda e: (e.device_index is None, e.device_index or 0, e.eni_id))
        return tuple(enis)

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
        params: dict[str, Any] = {
            "SubnetId": subnet_id,
            "Description": description,
            # One token per logical create: a repeat after a lost answer returns the same ENI.
            "ClientToken": str(uuid.uuid4()),
        }
        if count > 0:
            params["Ipv4PrefixCount" if kind == "prefix" else "SecondaryPrivateIpAddressCount"] = (
                count
            )
        if security_groups:
            params["Groups"] = list(security_groups)
        if tags:
            params["TagSpecifications"] = [
                {
                    "ResourceType": "network-interface",
                    "Tags": [{"Key": k, "Value": v} for k, v in tags.items()],
                }
            ]
        answer = await self._call("CreateNetworkInterface", params, mutating=True)
        return parse_eni(answer["NetworkInterface"])

    async def attach_eni(self, eni_id: str, instance_id: str, device_index: int) -> str:
        params = {
            "NetworkInterfaceId": eni_id,
            "InstanceId": instance_id,
            "DeviceIndex": device_index,
        }
        answer = await self._call("AttachNetworkInterface", params, mutating=True, repeatable=False)
        return str(answer["AttachmentId"])

    async def set_delete_on_termination(self, eni_id: str, attachment_id: str) -> None:
        attribute = {"AttachmentId": attachment_id, "DeleteOnTermination": True}
        await self._call(
            "ModifyNetworkInterfaceAttribute",
            {"NetworkInterfaceId": eni_id, "Attachment": attribute},
            mutating=True,
        )

    async def detach_eni(self, attachment_id: str) -> None:
        await self._call("DetachNetworkInterface", {"AttachmentId": attachment_id}, mutating=True)

    async def delete_eni(self, eni_id: str) -> None:
        await self._call("DeleteNetworkInterface", {"NetworkInterfaceId": eni_id}, mutating=True)
        self._eni_locks.pop(eni_id, None)

    async def assign_units(self, eni_id: str, kind: Ipv4UnitKind, count: int) -> tuple[str, ...]:
        """The units EC2 assigned: an assign by count answers with them (AssignedPrivateIpAddresses
        or AssignedIpv4Prefixes, only what this call added), so no read of the ENI goes with it.
        An answer that lists fewer is logged; what EC2 assigned beyond it, the drift adopts."""
        if count < 1:
            return ()
        field = "Ipv4PrefixCount" if kind == "prefix" else "SecondaryPrivateIpAddressCount"
        async with self._eni_lock(eni_id):
            answer = await self._call(
                "AssignPrivateIpAddresses",
                {"NetworkInterfaceId": eni_id, field: count},
                mutating=True,
                repeatable=False,
            )
        new = tuple(dict.fromkeys(assigned_units(answer, kind)))
        if len(new) != count:
            logger.warning(
                "ec2.assign_count_mismatch eni_id=%s kind=%s asked=%d got=%d",
                eni_id,
                kind,
                count,
                len(new),
            )
        return new

    async def unassign_units(self, eni_id: str, kind: Ipv4UnitKind, cidrs: Sequence[str]) -> None:
        if not cidrs:
            return
        params: dict[str, Any] = {"NetworkInterfaceId": eni_id}
        if kind == "prefix":
            params["Ipv4Prefixes"] = list(cidrs)
        else:
            params["PrivateIpAddresses"] = [host_address(c) for c in cidrs]
        async with self._eni_lock(eni_id):
            await self._call("UnassignPrivateIpAddresses", params, mutating=True, repeatable=False)

    async def assign_ipv6_prefix(self, eni_id: str) -> str:
        """One /80 more (Ipv6PrefixCount 1); EC2's answer lists it (AssignedIpv6Prefixes)."""
        async with self._eni_lock(eni_id):
            answer = await self._call(
                "AssignIpv6Addresses",
                {"NetworkInterfaceId": eni_id, "Ipv6PrefixCount": 1},
                mutating=True,
                repeatable=False,
            )
        return assigned_ipv6_prefix(answer)

    async def find_enis(
        self, tags: Mapping[str, str], *, available_only: bool = False
    ) -> tuple[NetworkInterface, ...]:
        if not tags:
            raise ValueError("find_enis needs at least one tag: an untagged query scans the VPC")
        filters = [{"Name": f"tag:{k}", "Values": [v]} for k, v in sorted(tags.items())]
        if available_only:
            filters.append({"Name": "status", "Values": ["available"]})
        raw = await self._describe_all(
            "DescribeNetworkInterfaces", "NetworkInterfaces", {"Filters": filters}
        )
        return tuple(parse_eni(d) for d in raw)

    # -- Ec2Catalog -----------------------------------------------------------------------------

    async def describe_instance(self, instance_id: str) -> Instance:
        operation = "DescribeInstances"
        answer = await self._call(operation, {"InstanceIds": [instance_id]})
        found = [i for r in answer.get("Reservations") or [] for i in r.get("Instances") or []]
        if not found:
            raise NotFound(operation, "InvalidInstanceID.NotFound", instance_id)
        return parse_instance(found[0])

    async def instance_limits(self, instance_type: str) -> InstanceLimits:
        """From DescribeInstanceTypes once per type for the life of the process (`cloud.limits`)."""
        return await self._limits.get(instance_type, self._fetch_limits)

    async def subnet(self, subnet_id: str) -> Subnet:
        operation = "DescribeSubnets"
        answer = await self._call(operation, {"SubnetIds": [subnet_id]})
        subnets = answer.get("Subnets") or []
        if not subnets:
            raise NotFound(operation, "InvalidSubnetID.NotFound", subnet_id)
        return parse_subnet(subnets[0])

    async def subnets_in(self, vpc_id: str, availability_zone: str) -> tuple[Subnet, ...]:
        wanted = {"vpc-id": vpc_id, "availability-zone": availability_zone}
        filters = [{"Name": k, "Values": [v]} for k, v in wanted.items()]
        raw = await self._describe_all("DescribeSubnets", "Subnets", {"Filters": filters})
        return tuple(sorted((parse_subnet(d) for d in raw), key=lambda s: s.subnet_id))

    # -- calls ------------------------------------------------------------------------------------

    async def _fetch_limits(self, instance_type: str) -> InstanceLimits:
        operation = "DescribeInstanceTypes"
        answer = await self._call(operation, {"InstanceTypes": [instance_type]})
        infos = answer.get("InstanceTypes") or []
        if not infos:
            raise NotFound(operation, "InvalidInstanceType", instance_type)
        return parse_limits(infos[0])

    async def _describe_all(
        self, operation: str, key: str, params: Mapping[str, Any]
    ) -> list[Mapping[str, Any]]:
        """Every page, one call (and one retry budget) per page."""
        items: list[Mapping[str, Any]] = []
        token: str | None = None
        while True:
            page = await self._call(
                operation, {**params, **({"NextToken": token} if token else {})}
            )
            items.extend(page.get(key) or [])
            token = page.get("NextToken") or None
            if token is None:
                return items

    def _eni_lock(self, eni_id: str) -> asyncio.Lock:
        return self._eni_locks.setdefault(eni_id, asyncio.Lock())

    async def _call(
        self,
        operation: str,
        params: Mapping[str, Any],
        *,
        mutating: bool = False,
        repeatable: bool = True,
    ) -> Response:
        """One EC2 API call by name, with rate limiting, retries (as this view's urgency allows) and
        recording."""
        method: Callable[..., Response] = getattr(self._client, xform_name(operation))

        async def attempt() -> Response:
            return await self._attempt(operation, lambda: method(**params))

        return await self._retrier.run(
            operation, attempt, mutating=mutating, repeatable=repeatable, urgency=self._urgency
        )

    async def _attempt(self, operation: str, request: Callable[[], Response]) -> Response:
        """One request in a worker thread. This is `asyncio.to_thread`, but with the slot held until
        the thread really ends: a timed-out boto3 call cannot be stopped, and while it runs it still
        occupies a thread and a connection."""
        loop = asyncio.get_running_loop()
        sent = False
        try:
            async with asyncio.timeout(self._call_timeout_s):
                await self._slots.acquire()
                future = loop.run_in_executor(None, request)
                sent = True
                future.add_done_callback(self._thread_done)
                return await asyncio.shield(future)
        except (ClientError, BotoCoreError) as exc:
            raise translate(operation, exc) from exc
        except TimeoutError as exc:
            timeout = CallTimeout(operation, "Timeout", f"no answer in {self._call_timeout_s}s")
            raise AttemptFailed(timeout, not_applied=not sent) from exc

    def _thread_done(self, future: asyncio.Future[Response]) -> None:
        self._slots.release()
        if not future.cancelled():
            future.exception()  # retrieved here, so an abandoned failure is not reported as lost
