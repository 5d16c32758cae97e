"""`ImdsSimulator`: IMDSv2 for one instance of an embedded `World`, served over HTTP on loopback from
moto's live EC2 state, with knobs that make it lag EC2 the way real IMDS has.

It owns: the token endpoint (TTL 1..21600 s, 400 for a missing or bad TTL, 403 for a proxied request,
401 for a missing, unknown or expired token, by an injected clock), the metadata paths `Imdsv2Client`
reads, the staleness of the address lists (`Staleness`) and injected faults (`Faults`).
It must not: change moto's state, or serve anything EC2 never had (a kept address is one EC2 listed).

Why staleness knobs: in a real incident IMDS kept listing released addresses, and missed newly assigned
ones, for hours; with 4 missing and 4 kept, a count comparison saw agreement where the contents
differed (seed 001 in docs/failure-scenarios.md; ipamd compares by content and IMDS only triggers an
EC2 read: docs/architecture.md §6.1). `Staleness` reproduces that per address in both directions
(`keep`, `hide`), by time (`add_lag_s`, `remove_lag_s`), or wholesale (`freeze`). IMDS learns of an
EC2 change when it observes it: on every metadata request, or on `observe()`; call that right after
changing EC2 to pin the moment a time lag starts from.

ENIs (the MAC list and each ENI's own fields) and each ENI's primary address are always served as EC2
has them, unless frozen.
"""

from __future__ import annotations

import asyncio
import fnmatch
import random
import secrets
import time
from collections import deque
from types import TracebackType
from typing import Any, Final, NamedTuple, Self

from aiohttp import web

from cloud.embedded.eni_rules import LOCK
from cloud.embedded.imds_lag import Clock, Staleness
from cloud.embedded.world import World
from cloud.imds import MACS_PATH, MAX_TOKEN_TTL_S, METADATA_PATH, TOKEN_HEADER, TOKEN_PATH
from cloud.imds import TOKEN_TTL_HEADER as TTL_HEADER
from cloud.ports import ImdsInterface

_MAC_KEYS: Final = (
    "device-number",
    "interface-id",
    "ipv4-prefix",
    "ipv6-prefix",
    "local-ipv4s",
    "mac",
    "subnet-id",
    "subnet-ipv4-cidr-block",
    "vpc-ipv4-cidr-blocks",
)


class Faults:
    """Answers the simulator gives instead of the right one. Checked before the token, so the token
    request can fail too."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self.delay_s = 0.0
        """Wait this long before answering any request (real time: for the client's timeouts)."""
        self._next: deque[int] = deque()
        self._fraction = 0.0
        self._fraction_status = 503
        self._paths: dict[str, int] = {}
        self._rng = rng or random.Random()

    def fail_next(self, count: int, status: int = 503) -> None:
        """The next `count` requests (any path, the token's included) answer `status`."""
        self._next.extend([status] * count)

    def fail_fraction(self, fraction: float, status: int = 503) -> None:
        """This fraction of requests, drawn from the simulator's random source, answer `status`."""
        self._fraction, self._fraction_status = fraction, status

    def fail_path(self, pattern: str, status: int) -> None:
        """Requests whose path (`/latest/...`) matches the shell-style `pattern` answer `status`."""
        self._paths[pattern] = status

    def not_found(self, pattern: str) -> None:
        self.fail_path(pattern, 404)

    def clear(self) -> None:
        self.delay_s = 0.0
        self._next.clear()
        self._fraction = 0.0
        self._paths.clear()

    def status_for(self, path: str) -> int | None:
        """The fault status for one request, or None to answer normally."""
        if self._next:
            return self._next.popleft()
        for pattern, status in self._paths.items():
            if fnmatch.fnmatchcase(path, pattern):
                return status
        if self._fraction > 0 and self._rng.random() < self._fraction:
            return self._fraction_status
        return None


class Served(NamedTuple):
    method: str
    path: str
    status: int


class ImdsSimulator:
    """IMDSv2 for the world's instance, on 127.0.0.1 and a free port, in the current event loop."""

    def __init__(
        self,
        world: World,
        *,
        clock: Clock = time.monotonic,
        rng: random.Random | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.world = world
        self.lag = Staleness(self._read_ec2, clock)
        self.faults = Faults(rng)
        self.served: deque[Served] = deque(maxlen=10_000)
        """The latest answers, oldest first."""
        self.base_url = ""
        self._clock = clock
        self._host = host
        self._tokens: dict[str, float] = {}
        self._runner: web.AppRunner | None = None

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> str:
        """Start serving; returns the base URL (`http://127.0.0.1:<port>`). EC2's state now is what
        IMDS has always had: no time lag applies to it."""
        if self._runner is not None:
            raise RuntimeError("ImdsSimulator already started")
        app = web.Application()
        app.router.add_put(TOKEN_PATH, self._token)
        app.router.add_get(METADATA_PATH + "{tail:.*}", self._metadata)
        # handler_cancellation: a client that gave up (its timeout) cancels a delayed answer.
        runner = web.AppRunner(
            app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0
        )
        await runner.setup()
        try:
            await web.TCPSite(runner, self._host, 0).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        host, port = runner.addresses[0][:2]
        self.base_url = f"http://{host}:{port}"
        self.lag.observe()
        return self.base_url

    async def close(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # -- views ------------------------------------------------------------------------------------

    def observe(self) -> None:
        """Let IMDS observe EC2 now (as every metadata request does)."""
        self.lag.observe()

    def view(self) -> tuple[ImdsInterface, ...]:
        """The ENIs as served now, by device number."""
        return self.lag.view()

    def revoke_tokens(self) -> None:
        """Forget every token issued (as an IMDS restart does): the next reads answer 401."""
        self._tokens.clear()

    def count(self, method: str | None = None, status: int | None = None) -> int:
        """Answers served, by method and status (either may be left out)."""
        return sum(
            1
            for s in self.served
            if (method is None or s.method == method) and (status is None or s.status == status)
        )

    # -- handlers ---------------------------------------------------------------------------------

    async def _token(self, request: web.Request) -> web.Response:
        if (fault := await self._fault(request)) is not None:
            return fault
        if "X-Forwarded-For" in request.headers:  # IMDS refuses token requests through a proxy
            return self._answer(request, 403, "Forbidden")
        ttl_s = _ttl_s(request.headers.get(TTL_HEADER))
        if ttl_s is None:
            return self._answer(request, 400, "Missing or Invalid Parameters")
        now = self._clock()
        self._tokens = {t: end for t, end in self._tokens.items() if end > now}
        token = secrets.token_urlsafe(32)
        self._tokens[token] = now + ttl_s
        return self._answer(request, 200, token, {TTL_HEADER: str(ttl_s)})

    async def _metadata(self, request: web.Request) -> web.Response:
        if (fault := await self._fault(request)) is not None:
            return fault
        expires_at = self._tokens.get(request.headers.get(TOKEN_HEADER, ""))
        if expires_at is None or self._clock() >= expires_at:
            return self._answer(request, 401, "Unauthorized")
        body = self._lookup(request.match_info["tail"])
        if body is None:
            return self._answer(request, 404, "Not Found")
        return self._answer(request, 200, body)

    async def _fault(self, request: web.Request) -> web.Response | None:
        if self.faults.delay_s > 0:
            await asyncio.sleep(self.faults.delay_s)
        status = self.faults.status_for(request.path)
        return None if status is None else self._answer(request, status, f"fault {status}")

    def _answer(
        self, request: web.Request, status: int, body: str, headers: dict[str, str] | None = None
    ) -> web.Response:
        self.served.append(Served(request.method, request.path, status))
        return web.Response(status=status, text=body, headers=headers)

    # -- paths ------------------------------------------------------------------------------------

    def _lookup(self, tail: str) -> str | None:
        """The body at a meta-data path (`tail` has no leading "/"), or None for 404."""
        fixed = self._identity()
        if tail in fixed:
            return fixed[tail]
        if tail != MACS_PATH.rstrip("/") and not tail.startswith(MACS_PATH):
            return None
        view = self.lag.view()
        rest = tail.removeprefix(MACS_PATH.rstrip("/")).strip("/")
        if not rest:
            return "\n".join(f"{eni.mac}/" for eni in view)
        mac, _, key = rest.partition("/")
        eni = next((e for e in view if e.mac == mac), None)
        if eni is None:
            return None
        if not key:
            return "\n".join(_MAC_KEYS)
        fields = {
            "device-number": str(eni.device_number),
            "interface-id": eni.eni_id,
            "ipv4-prefix": "\n".join(eni.ipv4_prefixes),
            "ipv6-prefix": "\n".join(eni.ipv6_prefixes),
            "local-ipv4s": "\n".join(eni.local_ipv4s),
            "mac": eni.mac,
            "subnet-id": eni.subnet_id,
            "subnet-ipv4-cidr-block": self._subnet_cidr(eni.subnet_id),
            "vpc-ipv4-cidr-blocks": "\n".join(self._vpc_cidrs()),
        }
        # IMDS answers 404, not an empty body, for an ENI without prefixes.
        return fields.get(key) or None

    def _subnet_cidr(self, subnet_id: str) -> str:
        """The IPv4 CIDR block of the ENI's own subnet (not always the node's)."""
        with LOCK:
            return str(self.world.backend().get_subnet(subnet_id).cidr_block)

    def _vpc_cidrs(self) -> tuple[str, ...]:
        """The VPC's IPv4 CIDR blocks, the primary first (every ENI of the instance is in it)."""
        with LOCK:
            vpc: Any = self.world.backend().get_vpc(self.world.vpc_id)
            blocks = [vpc.cidr_block] + [
                str(a["cidr_block"])
                for a in vpc.cidr_block_association_set
                if a.get("cidr_block_state", {}).get("state") == "associated"
            ]
        return tuple(dict.fromkeys(blocks))

    def _identity(self) -> dict[str, str]:
        with LOCK:
            instance: Any = self.world.backend().get_instance(self.world.instance_id)
            instance_type = str(instance.instance_type)
            zone = str(instance.placement.zone or self.world.availability_zone)
        return {
            "instance-id": self.world.instance_id,
            "instance-type": instance_type,
            "placement/region": self.world.region,
            "placement/availability-zone": zone,
        }

    def _read_ec2(self) -> tuple[ImdsInterface, ...]:
        """The instance's ENIs as EC2 has them now, by device index, each primary address first."""
        with LOCK:  # moto is mutated from worker threads; read one consistent state
            instance: Any = self.world.backend().get_instance(self.world.instance_id)
            return tuple(_eni(index, nic) for index, nic in sorted(instance.nics.items()))


def _eni(index: int, nic: Any) -> ImdsInterface:
    entries: list[dict[str, Any]] = list(nic.private_ip_addresses)
    primary = [e["PrivateIpAddress"] for e in entries if e.get("Primary")] or [
        nic.private_ip_address
    ]
    others = [e["PrivateIpAddress"] for e in entries if not e.get("Primary")]
    return ImdsInterface(
        mac=str(nic.mac_address),
        eni_id=str(nic.id),
        device_number=int(index),
        subnet_id=str(nic.subnet.id),
        local_ipv4s=tuple(str(a) for a in (*primary[:1], *others)),
        ipv4_prefixes=tuple(str(p["Ipv4Prefix"]) for p in nic.ipv4_prefixes),
        ipv6_prefixes=tuple(str(p["Ipv6Prefix"]) for p in nic.ipv6_prefixes),
    )


def _ttl_s(header: str | None) -> int | None:
    """The TTL asked for, if it is a whole number of seconds IMDS grants."""
    if header is None or not (header.isascii() and header.isdigit()):
        return None
    ttl_s = int(header)
    return ttl_s if 1 <= ttl_s <= MAX_TOKEN_TTL_S else None
