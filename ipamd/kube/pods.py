"""The pods bound to this node that will want a pod-network address (IPAMD_POD_AWARE_POOL): known
from the scheduler's binding, seconds before their sandbox's ADD arrives, while the image is pulled.

`PodWatch` lists the node's pods (`fieldSelector=spec.nodeName=<node>`: nothing of other nodes is
ever read) and watches them from the list's resourceVersion, with bookmarks; a 410 (the version is
too old) relists, a dropped stream watches again from the last version seen, a failure waits with
backoff. It keeps one small record per pod of this node: whether it needs an address (not
`hostNetwork`, not finished, not being deleted). `waiting(held)` is how many of them hold no
allocation yet: the pool's demand (`ipamd.policy` keeps the rule). Each change of that set wakes
the pool (`on_change`).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Collection
from typing import Any
from urllib.parse import quote

from ipamd.kube.client import KubeApi, KubeError, KubeRefused

logger = logging.getLogger(__name__)

WATCH_TIMEOUT_S = 300
"""How long one watch request lasts before it is made again (the server ends it cleanly)."""
RETRY_CAP_S = 30.0

PodKey = tuple[str, str]


def needs_address(pod: dict[str, Any]) -> bool:
    """Whether the pod will want a pod-network address on this node."""
    spec, meta = pod.get("spec") or {}, pod.get("metadata") or {}
    phase = (pod.get("status") or {}).get("phase")
    return (
        not spec.get("hostNetwork")
        and phase not in ("Succeeded", "Failed")
        and not meta.get("deletionTimestamp")
    )


def _key(pod: dict[str, Any]) -> PodKey:
    meta = pod.get("metadata") or {}
    return (str(meta.get("namespace", "")), str(meta.get("name", "")))


class PodWatch:
    def __init__(
        self,
        api: KubeApi,
        node_name: str,
        on_change: Callable[[], None] = lambda: None,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self._api = api
        self._selector = quote(f"spec.nodeName={node_name}", safe="")
        self._on_change = on_change
        self._sleep = sleep
        self._rng = rng or random.Random()
        self.bound: set[PodKey] = set()
        """The node's pods that need an address."""
        self.synced = False
        """Whether a list has been taken (before it, nothing is known: no demand is counted)."""
        self.relists = 0

    def waiting(self, held: Collection[PodKey]) -> int:
        """Bound pods needing an address that hold no allocation (`held`: the pods that do)."""
        return len(self.bound.difference(held)) if self.synced else 0

    async def run(self) -> None:
        """List, then watch, forever; never raises but on cancellation."""
        failures = 0
        version = ""
        while True:
            try:
                if not version:
                    version = await self._list()
                    self.relists += 1
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
        logger.warning("kube.pod_watch_failed error=%s retry_in_s=%.1f", err, delay)
        await self._sleep(delay)

    async def _list(self) -> str:
        answer = await self._api.get(f"/api/v1/pods?fieldSelector={self._selector}")
        bound = {_key(p) for p in answer.get("items") or () if needs_address(p)}
        changed = bound != self.bound or not self.synced
        self.bound, self.synced = bound, True
        if changed:
            self._on_change()
        return str((answer.get("metadata") or {}).get("resourceVersion") or "")

    async def _watch(self, version: str) -> str:
        path = (
            f"/api/v1/pods?fieldSelector={self._selector}&watch=1&allowWatchBookmarks=true"
            f"&resourceVersion={quote(version)}&timeoutSeconds={WATCH_TIMEOUT_S}"
        )
        async for event in self._api.watch(path, WATCH_TIMEOUT_S):
            kind, pod = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                code = int(pod.get("code") or 0)
                raise KubeRefused(code, str(pod.get("message", "")), str(pod.get("reason", "")))
            version = str((pod.get("metadata") or {}).get("resourceVersion") or version)
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self._apply(kind, pod)
        return version

    def _apply(self, kind: str, pod: dict[str, Any]) -> None:
        key = _key(pod)
        wanted = kind != "DELETED" and needs_address(pod)
        if wanted == (key in self.bound):
            return
        if wanted:
            self.bound.add(key)
        else:
            self.bound.discard(key)
        self._on_change()
