"""Fault injection for boto3 clients through botocore's event hooks: throttling, 5xx answers, latency,
timeouts, a seeded fraction of failures, and partial failures (applied, yet reported as failed).

A `FaultInjector` holds rules and counts what it injected; `attach(client)` registers it on a client.
Works the same against the in-process moto and the loopback server. Which hook a fault uses decides
what botocore does with it:

  before-send  (`retried=True`, the default) answers in place of EC2, per attempt, so the fault goes
               through botocore's retry handler exactly as a real one would (RequestLimitExceeded is
               retried with throttling backoff, 5xx and timeouts with transient backoff).
  before-call  (`retried=False`) answers the whole call before any request is built: one attempt,
               no retries; what a caller sees once the retries ran out.
  after-call   (partial failures) runs after moto applied the call and answered; the hook raises, so
               the change is made but the caller sees a timeout or a 5xx and must re-read.

A faulted before-send or before-call attempt never reaches moto. Latency sleeps in before-send.
Rules are tried in the order they were added; each attempt draws from one seeded RNG, so a run with the
same seed and the same calls injects the same faults. For tests and `--embedded` only.
"""

from __future__ import annotations

import io
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError, ConnectTimeoutError, ReadTimeoutError

FaultKind = Literal["throttle", "server_error", "latency", "timeout", "partial_failure"]
Stage = Literal["before-call", "before-send", "after-call"]
ServerErrorCode = Literal["InternalError", "Unavailable"]

_STATUS: Final[Mapping[str, int]] = {
    # EC2 API reference, "Error codes": throttling answers 503; server errors 500 and 503.
    "RequestLimitExceeded": 503,
    "InternalError": 500,
    "Unavailable": 503,
}
_MESSAGES: Final[Mapping[str, str]] = {
    "RequestLimitExceeded": "Request limit exceeded.",
    "InternalError": "An internal error has occurred.",
    "Unavailable": "The server is overloaded and can't handle the request.",
}
_UNROUTABLE: Final = "https://fault-injected.invalid/"


@dataclass(slots=True)
class _Rule:
    kind: FaultKind
    stage: Stage
    operations: frozenset[str] | None
    """Operation names (`AssignPrivateIpAddresses`); None for every operation."""
    rate: float
    remaining: int | None
    code: str = ""
    delay_s: float = 0.0
    connect: bool = False
    """A timeout while connecting (the request surely did not arrive) rather than while reading."""
    as_timeout: bool = False
    """A partial failure seen as a read timeout rather than as a 5xx answer."""

    def applies(self, stage: Stage, operation: str) -> bool:
        if self.stage != stage or self.remaining == 0:
            return False
        return self.operations is None or operation in self.operations


class FaultInjector:
    """Faults for the clients it is attached to; thread-safe."""

    def __init__(self, *, seed: int = 0, sleep: Callable[[float], None] = time.sleep) -> None:
        self._rng = random.Random(seed)
        self._sleep = sleep
        self._rules: list[_Rule] = []
        self._injected: Counter[FaultKind] = Counter()
        self._lock = threading.Lock()
        self._ids = f"ipamd-faults-{id(self)}"

    # -- rules ---------------------------------------------------------------------------------

    def throttle(
        self, *operations: str, rate: float = 1.0, times: int | None = None, retried: bool = True
    ) -> None:
        """RequestLimitExceeded, HTTP 503, as EC2 throttles."""
        self._add("throttle", operations, rate, times, retried, code="RequestLimitExceeded")

    def server_error(
        self,
        *operations: str,
        code: ServerErrorCode = "InternalError",
        rate: float = 1.0,
        times: int | None = None,
        retried: bool = True,
    ) -> None:
        """InternalError (500) or Unavailable (503)."""
        self._add("server_error", operations, rate, times, retried, code=code)

    def latency(
        self, seconds: float, *operations: str, rate: float = 1.0, times: int | None = None
    ) -> None:
        """Sleep `seconds` before each matching attempt is answered."""
        self._add("latency", operations, rate, times, True, delay_s=seconds)

    def timeout(
        self,
        *operations: str,
        connect: bool = False,
        rate: float = 1.0,
        times: int | None = None,
        retried: bool = True,
    ) -> None:
        """botocore's ReadTimeoutError (or ConnectTimeoutError); the request never reaches moto."""
        self._add("timeout", operations, rate, times, retried, connect=connect)

    def partial_failure(
        self,
        *operations: str,
        as_timeout: bool = True,
        code: ServerErrorCode = "InternalError",
        rate: float = 1.0,
        times: int | None = None,
    ) -> None:
        """moto applies the call, then the caller gets a ReadTimeoutError (or the 5xx `code`)."""
        rule = _Rule(
            "partial_failure",
            "after-call",
            frozenset(operations) or None,
            rate,
            times,
            code=code,
            as_timeout=as_timeout,
        )
        with self._lock:
            self._rules.append(rule)

    def clear(self) -> None:
        """Drop every rule (the counts stay)."""
        with self._lock:
            self._rules.clear()

    @property
    def injected(self) -> dict[FaultKind, int]:
        """How many faults of each kind were injected so far."""
        with self._lock:
            return dict(self._injected)

    def _add(
        self,
        kind: FaultKind,
        operations: tuple[str, ...],
        rate: float,
        times: int | None,
        retried: bool,
        **extra: Any,
    ) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"rate must be within [0, 1], not {rate}")
        stage: Stage = "before-send" if retried else "before-call"
        rule = _Rule(kind, stage, frozenset(operations) or None, rate, times, **extra)
        with self._lock:
            self._rules.append(rule)

    def _fire(self, stage: Stage, operation: str) -> Iterator[_Rule]:
        """The rules that fire for one attempt, counted as injected."""
        with self._lock:
            fired = []
            for rule in self._rules:
                if rule.applies(stage, operation) and self._rng.random() < rule.rate:
                    if rule.remaining is not None:
                        rule.remaining -= 1
                    self._injected[rule.kind] += 1
                    fired.append(rule)
                    if rule.kind != "latency":
                        break  # one failure per attempt; latencies add up before it
        return iter(fired)

    # -- hooks ---------------------------------------------------------------------------------

    def attach(self, client: Any) -> None:
        """Register on a boto3 client. Our handlers go on the service-specific event names, which
        botocore calls before the generic ones moto's in-process hook listens on."""
        service = client.meta.service_model.service_id.hyphenize()
        endpoint = str(client.meta.endpoint_url)
        events = client.meta.events

        def before_call(model: Any, **_: Any) -> Any:
            return self._before_call(endpoint, model.name)

        def before_send(request: Any, event_name: str, **_: Any) -> Any:
            return self._before_send(request, event_name.rsplit(".", 1)[-1])

        def after_call(http_response: Any, model: Any, **_: Any) -> None:
            self._after_call(endpoint, http_response, model.name)

        events.register_first(f"before-call.{service}", before_call, unique_id=f"{self._ids}-call")
        events.register_first(f"before-send.{service}", before_send, unique_id=f"{self._ids}-send")
        events.register_first(f"after-call.{service}", after_call, unique_id=f"{self._ids}-after")

    def detach(self, client: Any) -> None:
        service = client.meta.service_model.service_id.hyphenize()
        for stage, suffix in (
            ("before-call", "call"),
            ("before-send", "send"),
            ("after-call", "after"),
        ):
            client.meta.events.unregister(f"{stage}.{service}", unique_id=f"{self._ids}-{suffix}")

    def _before_call(self, endpoint: str, operation: str) -> tuple[Any, dict[str, Any]] | None:
        for rule in self._fire("before-call", operation):
            if rule.kind == "timeout":
                raise _timeout(rule, endpoint)
            response = _error_response(endpoint, rule.code)
            return response, _parsed_error(rule.code)
        return None

    def _before_send(self, request: Any, operation: str) -> Any:
        for rule in self._fire("before-send", operation):
            if rule.kind == "latency":
                self._sleep(rule.delay_s)
                continue
            if rule.kind == "timeout":
                raise _timeout(rule, request.url)
            response = _error_response(request.url, rule.code)
            # botocore calls every before-send handler, moto's in-process one after ours; pointed at an
            # unroutable URL it lets this never-sent request pass instead of applying it.
            request.url = _UNROUTABLE
            return response
        return None

    def _after_call(self, endpoint: str, http_response: Any, operation: str) -> None:
        if http_response is None or http_response.status_code >= 300:
            return
        for rule in self._fire("after-call", operation):
            if rule.as_timeout:
                raise ReadTimeoutError(endpoint_url=endpoint)
            raise ClientError(_parsed_error(rule.code), operation)


def _timeout(rule: _Rule, endpoint: str) -> Exception:
    error: Exception
    if rule.connect:
        error = ConnectTimeoutError(endpoint_url=endpoint)
    else:
        error = ReadTimeoutError(endpoint_url=endpoint)
    return error


class _Body(io.BytesIO):
    """The raw body botocore reads from an AWSResponse."""

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self.getvalue()


def _error_response(url: str, code: str) -> AWSResponse:
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Response><Errors><Error><Code>{code}</Code><Message>{_MESSAGES[code]}</Message>"
        "</Error></Errors><RequestID>fault-injected</RequestID></Response>"
    ).encode()
    headers = {"Content-Type": "text/xml;charset=UTF-8", "Content-Length": str(len(body))}
    return AWSResponse(url, _STATUS[code], headers, _Body(body))


def _parsed_error(code: str) -> dict[str, Any]:
    return {
        "Error": {"Code": code, "Message": _MESSAGES[code]},
        "ResponseMetadata": {
            "RequestId": "fault-injected",
            "HTTPStatusCode": _STATUS[code],
            "HTTPHeaders": {},
            "RetryAttempts": 0,
        },
    }
