"""`Imdsv2Client`: the `Imds` port over the EC2 instance metadata service, IMDSv2 only, with aiohttp.

It owns: the session token (`PUT /latest/api/token`, fetched once and shared, renewed a margin before it
expires and once more when IMDS answers 401), one timeout per request, a few retries with jittered
backoff on dropped connections, timeouts, 429 and 5xx answers, turning every failure into a
`cloud.errors.CloudError`, recording every attempt (`cloud.calls.CallRecorder`), and parsing IMDS's
text answers into `ImdsIdentity` and `ImdsInterface`.
It must not: cache answers (each call reads IMDS afresh), start background tasks, or let an aiohttp
exception out of this module.

IMDS is a hint, never the inventory: it has kept serving released addresses, and missed newly assigned
ones, for hours (docs/architecture.md §6.1). Callers compare its lists with their own by content, and
a disagreement only triggers an EC2 read.
"""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import logging
import random
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Self, TypeVar

import aiohttp

from cloud.backoff import Backoff
from cloud.calls import OK, CallLog, CallRecorder
from cloud.errors import CallTimeout, CloudError, NotFound, Rejected, ServiceUnavailable, Throttled
from cloud.ports import ImdsIdentity, ImdsInterface
from cloud.ratelimit import MonotonicClock, RetryPolicy, Sleep

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_BASE_URL: Final = "http://169.254.169.254"
TOKEN_PATH: Final = "/latest/api/token"
METADATA_PATH: Final = "/latest/meta-data/"
TOKEN_HEADER: Final = "X-aws-ec2-metadata-token"
TOKEN_TTL_HEADER: Final = "X-aws-ec2-metadata-token-ttl-seconds"
MAX_TOKEN_TTL_S: Final = 21600
"""IMDS grants tokens of 1 s to 6 h."""
MACS_PATH: Final = "network/interfaces/macs/"

OP_TOKEN: Final = "ImdsToken"
"""The `CallRecorder` operation of a token request."""
OP_GET: Final = "ImdsGet"
"""The `CallRecorder` operation of a metadata read (one name for every path: the paths hold MACs)."""

DEFAULT_RETRY: Final = RetryPolicy(max_attempts=3, base_s=0.05, cap_s=0.5)
"""IMDS is on the host: a short, small retry budget is enough, and the hint loop runs again soon."""


@dataclass(frozen=True, slots=True)
class _Answer:
    status: int
    body: str
    ttl_header: str | None


class Imdsv2Client:
    """`Imds` over IMDSv2. Every method raises only `CloudError`s: `ServiceUnavailable` (connection
    failed or 5xx after the retries), `Throttled` (429 after the retries), `CallTimeout`, `NotFound`
    (a path IMDS does not have), `Rejected` (401 with a fresh token, 400, 403, a malformed answer).

    The HTTP session is opened on first use and lives until `close()` (or the end of `async with`).
    """

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        *,
        token_ttl_s: int = MAX_TOKEN_TTL_S,
        token_refresh_margin_s: float = 60.0,
        request_timeout_s: float = 2.0,
        retry: RetryPolicy = DEFAULT_RETRY,
        max_concurrent_requests: int = 8,
        recorder: CallRecorder | None = None,
        clock: MonotonicClock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        rng: random.Random | None = None,
        ipv6_prefixes: bool = False,
    ) -> None:
        """`ipv6_prefixes`: also read each ENI's delegated IPv6 prefixes (IPv6 mode); without, one
        request per ENI less, and `ImdsInterface.ipv6_prefixes` is empty.
        `token_ttl_s` is the lifetime asked for (1..21600 s); the token is renewed
        `token_refresh_margin_s` before it ends, so a request never carries a token about to expire.
        `request_timeout_s` bounds one attempt, connection included; `max_concurrent_requests` bounds
        the requests in flight (IMDS limits packets per second per ENI)."""
        if not 1 <= token_ttl_s <= MAX_TOKEN_TTL_S:
            raise ValueError(f"token_ttl_s must be 1..{MAX_TOKEN_TTL_S}: {token_ttl_s}")
        if not 0 <= token_refresh_margin_s < token_ttl_s:
            raise ValueError(
                f"token_refresh_margin_s must be >= 0 and < token_ttl_s: {token_refresh_margin_s}"
            )
        if request_timeout_s <= 0 or max_concurrent_requests < 1 or retry.max_attempts < 1:
            raise ValueError(
                "request_timeout_s > 0, max_concurrent_requests >= 1, max_attempts >= 1"
            )
        self.base_url = base_url.rstrip("/")
        self.recorder: CallRecorder = recorder if recorder is not None else CallLog()
        self._ttl_s = token_ttl_s
        self._margin_s = token_refresh_margin_s
        self._timeout_s = request_timeout_s
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        self._retry = retry
        self._backoff = Backoff(retry.base_s, retry.cap_s, rng)
        self._max_concurrent = max_concurrent_requests
        self._slots = asyncio.Semaphore(max_concurrent_requests)
        self._clock = clock
        self._sleep = sleep
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        self._token: str | None = None
        self._token_renew_at = 0.0
        self._token_lock = asyncio.Lock()
        self._ipv6_prefixes = ipv6_prefixes

    # -- Imds -------------------------------------------------------------------------------------

    async def identity(self) -> ImdsIdentity:
        self._check_open()
        paths = ("instance-id", "instance-type", "placement/region", "placement/availability-zone")
        *values, macs = await _gather([self._read(p) for p in (*paths, MACS_PATH)])
        instance_id, instance_type, region, zone = (v.strip() for v in values)
        return ImdsIdentity(instance_id, instance_type, region, zone, _macs(macs))

    async def interfaces(self) -> tuple[ImdsInterface, ...]:
        """Every ENI IMDS lists, by device number. Paths of one MAC are read concurrently, and MACs
        too, at most `max_concurrent_requests` requests at once. An ENI detached between the MAC list
        and its own paths makes this raise `NotFound`: read again."""
        self._check_open()
        macs = _macs(await self._read(MACS_PATH))
        found = await _gather([self._interface(mac) for mac in macs])
        return tuple(sorted(found, key=lambda eni: (eni.device_number, eni.mac)))

    # -- lifecycle --------------------------------------------------------------------------------

    async def close(self) -> None:
        """Close the HTTP session; the client cannot be used afterwards."""
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # -- reading ----------------------------------------------------------------------------------

    async def vpc_cidrs(self, mac: str) -> tuple[str, ...]:
        """The IPv4 CIDR blocks of the VPC of the ENI with `mac` (`vpc-ipv4-cidr-blocks`), as VPC
        CNI reads them for its SNAT exemptions: no EC2 call (and no IAM permission) needed."""
        path = f"{MACS_PATH}{mac}/vpc-ipv4-cidr-blocks"
        body = await self._read(path)
        try:
            return tuple(str(ipaddress.IPv4Network(c)) for c in _lines(body))
        except ValueError as exc:
            raise Rejected(OP_GET, "MalformedAnswer", f"{path}: {exc}") from None

    async def _interface(self, mac: str) -> ImdsInterface:
        base = f"{MACS_PATH}{mac}/"
        reads = [
            self._read(base + "interface-id"),
            self._read(base + "device-number"),
            self._read(base + "subnet-id"),
            self._read(base + "local-ipv4s"),
            # IMDS answers 404 here, not an empty list, for an ENI without prefixes.
            self._read(base + "ipv4-prefix", optional=True),
        ]
        if self._ipv6_prefixes:
            reads.append(self._read(base + "ipv6-prefix", optional=True))
        eni_id, device, subnet_id, ips, prefixes, *v6 = await _gather(reads)
        v6_prefixes = v6[0] if v6 else ""
        try:
            return ImdsInterface(
                mac=mac,
                eni_id=eni_id.strip(),
                device_number=int(device.strip()),
                subnet_id=subnet_id.strip(),
                local_ipv4s=tuple(str(ipaddress.IPv4Address(a)) for a in _lines(ips)),
                ipv4_prefixes=tuple(str(ipaddress.IPv4Network(p)) for p in _lines(prefixes)),
                ipv6_prefixes=tuple(str(ipaddress.IPv6Network(p)) for p in _lines(v6_prefixes)),
            )
        except ValueError as exc:
            raise Rejected(OP_GET, "MalformedAnswer", f"{base}: {exc}") from None

    async def _read(self, path: str, *, optional: bool = False) -> str:
        """The body at a meta-data path; "" for a 404 on an `optional` path."""
        full = METADATA_PATH + path
        token = await self._valid_token()
        answer = await self._request(OP_GET, "GET", full, {TOKEN_HEADER: token}, optional)
        if answer.status == 401:
            # The token expired early by IMDS's clock, or IMDS restarted and forgot it: renew once.
            self._forget(token)
            token = await self._valid_token()
            answer = await self._request(OP_GET, "GET", full, {TOKEN_HEADER: token}, optional)
        if answer.status == 200:
            return answer.body
        if answer.status == 404 and optional:
            return ""
        raise _status_error(OP_GET, full, answer.status)

    async def _valid_token(self) -> str:
        if self._token is not None and self._clock() < self._token_renew_at:
            return self._token
        # One request renews the token for everyone: concurrent readers wait for it here.
        async with self._token_lock:
            if self._token is not None and self._clock() < self._token_renew_at:
                return self._token
            asked_at = self._clock()
            headers = {TOKEN_TTL_HEADER: str(self._ttl_s)}
            answer = await self._request(OP_TOKEN, "PUT", TOKEN_PATH, headers, False)
            token = answer.body.strip()
            if answer.status != 200:
                raise _status_error(OP_TOKEN, TOKEN_PATH, answer.status)
            if not token:
                raise Rejected(OP_TOKEN, "MalformedAnswer", "empty token")
            ttl_s = _granted_ttl_s(answer.ttl_header, self._ttl_s)
            # Counted from when it was asked for, and never renewed later than halfway through a
            # lifetime IMDS shortened below the margin.
            self._token_renew_at = asked_at + max(ttl_s - self._margin_s, ttl_s / 2)
            self._token = token
            logger.debug("imds.token ttl_s=%d", ttl_s)
            return token

    def _forget(self, token: str) -> None:
        if self._token == token:  # not one a concurrent reader has renewed already
            self._token = None

    # -- one request, with retries ----------------------------------------------------------------

    async def _request(
        self, operation: str, method: str, path: str, headers: dict[str, str], optional: bool
    ) -> _Answer:
        """Send until an answer that is not worth retrying; raise the last error when the attempts
        are spent. Every read is safe to repeat, the token request included."""
        for attempt in itertools.count(1):
            started = self._clock()
            try:
                answer = await self._send(operation, method, path, headers)
            except CloudError as exc:
                error: CloudError | None = exc
            else:
                error = _retryable_error(operation, path, answer.status)
                if error is None:
                    normal = answer.status == 200 or (optional and answer.status == 404)
                    self._record(
                        operation, OK if normal else _code(answer.status), started, attempt
                    )
                    return answer
            assert error is not None
            self._record(operation, error.code, started, attempt)
            if attempt >= self._retry.max_attempts:
                raise error
            delay_s = self._backoff.delay_s(attempt)
            logger.debug(
                "imds.retry path=%s code=%s attempt=%d delay_s=%.3f",
                path,
                error.code,
                attempt,
                delay_s,
            )
            await self._sleep(delay_s)
        raise AssertionError("unreachable")  # pragma: no cover - itertools.count never ends

    async def _send(
        self, operation: str, method: str, path: str, headers: dict[str, str]
    ) -> _Answer:
        async with self._slots:  # waiting for a slot is not part of the request's timeout
            session = self._open_session()
            try:
                async with session.request(
                    method,
                    self.base_url + path,
                    headers=headers,
                    timeout=self._timeout,
                    allow_redirects=False,
                ) as response:
                    body = await response.read()
                    ttl = response.headers.get(TOKEN_TTL_HEADER)
                    return _Answer(response.status, body.decode("utf-8", "replace"), ttl)
            except TimeoutError as exc:  # aiohttp's timeouts are TimeoutErrors too: first
                raise CallTimeout(operation, "Timeout", f"{path}: {self._timeout_s}s") from exc
            except aiohttp.ClientError as exc:
                raise ServiceUnavailable(operation, type(exc).__name__, f"{path}: {exc}") from exc

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("Imdsv2Client is closed")

    def _open_session(self) -> aiohttp.ClientSession:
        self._check_open()
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_concurrent),
                # IMDS is link-local: never reach it through a proxy from the environment.
                trust_env=False,
            )
        return self._session

    def _record(self, operation: str, outcome: str, started: float, attempt: int) -> None:
        self.recorder.record(operation, outcome, self._clock() - started, attempt)


# -- answers and errors ---------------------------------------------------------------------------

_CODES: Final = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound"}


def _code(status: int) -> str:
    return _CODES.get(status, f"HTTP{status}")


def _retryable_error(operation: str, path: str, status: int) -> CloudError | None:
    if status == 429:
        return Throttled(operation, _code(status), path)
    if status >= 500:
        return ServiceUnavailable(operation, _code(status), path)
    return None


def _status_error(operation: str, path: str, status: int) -> CloudError:
    """A final non-200 answer. 401 here means a token IMDS just issued was refused; 403 that IMDS is
    turned off for the instance or refused the request."""
    if status == 404:
        return NotFound(operation, _code(status), path)
    return Rejected(operation, _code(status), path)


def _granted_ttl_s(header: str | None, asked_s: int) -> int:
    """IMDS echoes the lifetime it granted; trust the shorter of that and what was asked."""
    try:
        granted = int(header) if header is not None else asked_s
    except ValueError:
        return asked_s
    return min(asked_s, granted) if granted > 0 else asked_s


def _lines(body: str) -> list[str]:
    return [line.strip() for line in body.splitlines() if line.strip()]


def _macs(body: str) -> tuple[str, ...]:
    """IMDS lists one entry per ENI, each ending with "/"."""
    return tuple(line.rstrip("/") for line in _lines(body))


async def _gather(calls: Sequence[Coroutine[Any, Any, T]]) -> list[T]:
    """Run the calls concurrently; the first `CloudError` cancels the rest and is raised alone."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(call) for call in calls]
    except BaseExceptionGroup as failed:
        errors = failed.exceptions
        if all(isinstance(e, CloudError) for e in errors):
            raise errors[0] from None
        raise
    return [task.result() for task in tasks]
