"""botocore event hooks for tests, on a client of the production configuration.

Two stages, because they mean different things to a caller:
- `before-call` answers instead of EC2: the request is never sent and EC2 (moto) never acts on it.
  That is a throttled or load-shed request, or a connection that was never made.
- `after-apply` is a `before-send` handler registered *after* moto's own (botocore calls every
  `before-send` handler in turn and keeps the first answer). On moto it models a request EC2 did act
  on whose answer was then lost (raise a read timeout, a dropped connection) or replaced (a 500). On
  the offline client (no moto) it is simply the wire: its answer is the only one. On moto, an answer
  it returns comes second to moto's, so there it raises (`lost_answer` for an EC2 error code).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, Literal, TypeAlias

from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError

Stage = Literal["before-call", "after-apply"]
Step: TypeAlias = BaseException | AWSResponse | tuple[AWSResponse, dict[str, Any]] | None


class _Body:
    def __init__(self, data: bytes) -> None:
        self._data = data

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self._data


def ec2_error(status: int, code: str, message: str = "test") -> AWSResponse:
    """For `after-apply`: an EC2 error as it arrives, HTTP status and the query protocol's XML."""
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error>"
        "</Errors><RequestID>req-1</RequestID></Response>"
    ).encode()
    return AWSResponse("https://ec2.invalid/", status, {}, _Body(body))


def ec2_ok(operation: str) -> AWSResponse:
    """For `after-apply`: an empty success (for calls whose answer the adapter does not read)."""
    body = (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<{operation}Response>'
        f"<requestId>req-1</requestId><return>true</return></{operation}Response>"
    ).encode()
    return AWSResponse("https://ec2.invalid/", 200, {}, _Body(body))


def lost_answer(status: int, code: str, operation: str) -> ClientError:
    """For `after-apply` on moto: raising it replaces moto's success with an EC2 error answer."""
    error = {
        "Error": {"Code": code, "Message": "test"},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return ClientError(error, operation)


def refusal(status: int, code: str, message: str = "test") -> tuple[AWSResponse, dict[str, Any]]:
    """For `before-call`: an error answer given before the request is sent."""
    parsed = {
        "Error": {"Code": code, "Message": message},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return AWSResponse("https://ec2.invalid/", status, {}, None), parsed


class Script:
    """Plays `steps` for one operation, one per request: raise an exception, return an answer, or
    (None, and past the end) let the request through."""

    def __init__(
        self,
        client: Any,
        operation: str,
        steps: list[Step],
        *,
        stage: Stage = "before-call",
        delay_s: float | Callable[[int], float] = 0.0,
    ) -> None:
        self.requests = 0
        self._steps = steps
        self._delay_s = delay_s
        self._client = client
        self._operation = operation
        if stage == "before-call":
            self._event = f"before-call.ec2.{operation}"
            client.meta.events.register(self._event, self)
        else:
            self._event = "before-send"
            client.meta.events.register_last(self._event, self)

    def __call__(self, event_name: str = "", **_: Any) -> Any:
        if not event_name.endswith(f".{self._operation}"):
            return None
        n = self.requests
        self.requests += 1
        delay = self._delay_s(n) if callable(self._delay_s) else self._delay_s
        if delay:
            time.sleep(delay)  # in the adapter's worker thread: the event loop keeps running
        step = self._steps[n] if n < len(self._steps) else None
        if isinstance(step, BaseException):
            raise step
        return step

    def remove(self) -> None:
        self._client.meta.events.unregister(self._event, self)


class Scripts:
    """Makes `Script`s and removes them all at the end of the test."""

    def __init__(self) -> None:
        self._made: list[Script] = []

    def __call__(
        self,
        client: Any,
        operation: str,
        steps: list[Step],
        *,
        stage: Stage = "before-call",
        delay_s: float | Callable[[int], float] = 0.0,
    ) -> Script:
        script = Script(client, operation, steps, stage=stage, delay_s=delay_s)
        self._made.append(script)
        return script

    def remove_all(self) -> None:
        for script in self._made:
            script.remove()
        self._made.clear()
