"""`KubeApi`: the few calls ipamd makes to the Kubernetes API server, over aiohttp (already ipamd's
HTTP library: no client library's import time or memory for four verbs on three kinds).

Every call carries the bearer token as it is now (a projected token is re-read: it rotates), has a
deadline, and is retried a bounded number of times when retrying can help: 429 after its
Retry-After (capped), 5xx and connection failures after a short jittered backoff. A 401 re-reads the
token once. What is left is raised: `KubeUnavailable` (the server could not be reached or kept
failing) or `KubeRefused` (it answered no: 403, 404, 409, 422, with its Status message), never a
raw aiohttp error. Nothing here decides what a failure means for a pod: callers do.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp

from ipamd.kube.credentials import Credentials, CredentialsError

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
RETRY_AFTER_CAP_S = 10.0
"""Longest a 429's Retry-After is honoured for: a call serves a pod or a start-up waiting."""


class KubeError(Exception):
    status: int = 0


class KubeUnavailable(KubeError):
    """The API server could not be reached, or answered 429 or 5xx on every try."""


class KubeRefused(KubeError):
    """The API server answered no (4xx): not found, forbidden, a conflict, an invalid object."""

    def __init__(self, status: int, message: str, reason: str = "") -> None:
        super().__init__(f"{status} {reason}: {message}".strip())
        self.status = status
        self.reason = reason


class KubeApi:
    def __init__(
        self,
        credentials: Credentials,
        *,
        timeout_s: float = 10.0,
        attempts: int = 4,
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.credentials = credentials
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._attempts = max(attempts, 1)
        self._rng = rng or random.Random()
        self._sleep = sleep
        self._session: aiohttp.ClientSession | None = None
        self.calls = 0

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def get(self, path: str) -> dict[str, Any]:
        return await self.request("GET", path)

    async def patch(
        self, path: str, body: object, content_type: str = MERGE_PATCH
    ) -> dict[str, Any]:
        return await self.request("PATCH", path, body, content_type)

    async def post(self, path: str, body: object) -> dict[str, Any]:
        return await self.request("POST", path, body, "application/json")

    async def request(
        self, method: str, path: str, body: object = None, content_type: str = ""
    ) -> dict[str, Any]:
        """One call, retried where that can help; the answer's JSON object."""
        last: KubeError = KubeUnavailable("no attempt made")
        refreshed = False
        for attempt in range(1, self._attempts + 1):
            try:
                return await self._once(method, path, body, content_type)
            except _Retry as retry:
                last = retry.error
                if attempt < self._attempts:
                    await self._sleep(
                        retry.after_s if retry.after_s is not None else self._backoff(attempt)
                    )
            except KubeRefused as err:
                if err.status == 401 and not refreshed and self.credentials.token_file:
                    refreshed = True  # the token rotated between the read and the call
                    continue
                raise
        raise last

    def _backoff(self, attempt: int) -> float:
        return self._rng.uniform(0.1, min(2.0, 0.2 * 2**attempt))

    async def _once(
        self, method: str, path: str, body: object, content_type: str
    ) -> dict[str, Any]:
        session = self._open()
        try:
            token = self.credentials.bearer()
        except CredentialsError as err:
            raise KubeUnavailable(str(err)) from None
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = None
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
            data = json.dumps(body)
        self.calls += 1
        try:
            async with session.request(
                method,
                self.credentials.server + path,
                data=data,
                headers=headers,
                ssl=self.credentials.ssl_context(),
            ) as answer:
                text = await answer.text()
                status = answer.status
                retry_after = answer.headers.get("Retry-After")
        except (aiohttp.ClientError, TimeoutError, OSError) as err:
            raise _Retry(KubeUnavailable(f"{method} {path}: {err or type(err).__name__}")) from None
        if status < 300:
            return _object(text)
        message, reason = _status(text)
        if status == 429 or status >= 500:
            error = KubeUnavailable(f"{method} {path}: {status} {reason}: {message}")
            error.status = status
            raise _Retry(error, _retry_after(retry_after) if status == 429 else None)
        raise KubeRefused(status, f"{method} {path}: {message}", reason)

    async def watch(self, path: str, timeout_s: float) -> AsyncIterator[dict[str, Any]]:
        """The events of a watch (`path` carries `watch=1` and its resourceVersion), one JSON
        object per line, until the server ends the stream. Raises `KubeUnavailable` or
        `KubeRefused` as `request` does, without retrying: the caller relists or rewatches."""
        try:
            token = self.credentials.bearer()
        except CredentialsError as err:
            raise KubeUnavailable(str(err)) from None
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.calls += 1
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout_s + 30)
        try:
            async with self._open().get(
                self.credentials.server + path,
                headers=headers,
                ssl=self.credentials.ssl_context(),
                timeout=timeout,
            ) as answer:
                if answer.status >= 300:
                    message, reason = _status(await answer.text())
                    if answer.status == 429 or answer.status >= 500:
                        raise KubeUnavailable(f"GET {path}: {answer.status} {reason}: {message}")
                    raise KubeRefused(answer.status, f"GET {path}: {message}", reason)
                async for line in answer.content:
                    if line.strip():
                        yield _object(line.decode())
        except (aiohttp.ClientError, TimeoutError, OSError) as err:
            raise KubeUnavailable(f"watch {path}: {err or type(err).__name__}") from None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session


class _Retry(Exception):
    def __init__(self, error: KubeError, after_s: float | None = None) -> None:
        self.error = error
        self.after_s = after_s


def _retry_after(value: str | None) -> float:
    try:
        return min(max(float(value or "1"), 0.0), RETRY_AFTER_CAP_S)
    except ValueError:
        return 1.0


def _object(text: str) -> dict[str, Any]:
    try:
        doc = json.loads(text) if text else {}
    except ValueError:
        raise KubeUnavailable("the API server's answer is not JSON") from None
    return doc if isinstance(doc, dict) else {}


def _status(text: str) -> tuple[str, str]:
    """A Status object's message and reason (or the text itself)."""
    try:
        doc = json.loads(text)
    except ValueError:
        return text[:200], ""
    if isinstance(doc, dict):
        return str(doc.get("message", "")), str(doc.get("reason", ""))
    return text[:200], ""
