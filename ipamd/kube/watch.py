"""List-then-watch of one collection, narrowed by a field selector to what this node needs (its
pods, its Node, its ENIConfig): nothing cluster-wide is ever listed.

`ListWatch.run` lists (`on_list` gets the items), then watches from the list's resourceVersion with
bookmarks (`on_event` gets each ADDED, MODIFIED and DELETED object); a stream the server ends is
watched again from the last version seen, a 410 (the version is too old) lists again, and any other
failure waits with jittered backoff, doubling up to `RETRY_CAP_S`. It never raises but on
cancellation.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

from ipamd.kube.client import KubeApi, KubeError, KubeRefused

logger = logging.getLogger(__name__)

WATCH_TIMEOUT_S = 300
"""How long one watch request lasts before it is made again (the server ends it cleanly)."""
RETRY_CAP_S = 30.0

Obj = dict[str, Any]


class ListWatch:
    def __init__(
        self,
        api: KubeApi,
        collection: str,
        field_selector: str,
        on_list: Callable[[list[Obj]], None],
        on_event: Callable[[str, Obj], None],
        *,
        what: str,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        """`collection`: the list's path (`/api/v1/pods`); `what`: the watch's name in the log."""
        self._api = api
        self._collection = collection
        self._selector = quote(field_selector, safe="")
        self._on_list = on_list
        self._on_event = on_event
        self._what = what
        self._sleep = sleep
        self._rng = rng or random.Random()
        self.lists = 0
        """Lists taken: the first, and one after each 410."""

    async def run(self) -> None:
        failures = 0
        version = ""
        while True:
            try:
                if not version:
                    version = await self._list()
                    self.lists += 1
                version = await self._watch(version)
                failures = 0
            except KubeRefused as err:
                if err.status == 410:
                    version = ""  # too old: take the list again
                    continue
                failures += 1
                await self._wait(failures, err)
            except KubeError as err:
                failures += 1
                await self._wait(failures, err)

    async def _wait(self, failures: int, err: KubeError) -> None:
        delay = self._rng.uniform(0.5, min(RETRY_CAP_S, 0.5 * 2**failures))
        logger.warning(
            "kube.watch_failed watch=%s error=%s retry_in_s=%.1f", self._what, err, delay
        )
        await self._sleep(delay)

    async def _list(self) -> str:
        answer = await self._api.get(f"{self._collection}?fieldSelector={self._selector}")
        self._on_list([item for item in answer.get("items") or () if isinstance(item, dict)])
        return str((answer.get("metadata") or {}).get("resourceVersion") or "")

    async def _watch(self, version: str) -> str:
        path = (
            f"{self._collection}?fieldSelector={self._selector}&watch=1"
            f"&allowWatchBookmarks=true&resourceVersion={quote(version)}"
            f"&timeoutSeconds={WATCH_TIMEOUT_S}"
        )
        async for event in self._api.watch(path, WATCH_TIMEOUT_S):
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                code = int(obj.get("code") or 0)
                raise KubeRefused(code, str(obj.get("message", "")), str(obj.get("reason", "")))
            version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self._on_event(str(kind), obj)
        return version
