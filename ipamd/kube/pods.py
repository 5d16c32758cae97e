"""The pods bound to this node that will want a pod-network address (IPAMD_POD_AWARE_POOL): known
from the scheduler's binding, seconds before their sandbox's ADD arrives, while the image is pulled.

`PodWatch` lists the node's pods (`fieldSelector=spec.nodeName=<node>`: nothing of other nodes is
ever read) and watches them (`ipamd.kube.watch.ListWatch`: bookmarks, a relist on 410, backoff).
It keeps one small record per pod of this node: whether it needs an address (not `hostNetwork`,
not finished, not being deleted). `waiting(held)` is how many of them hold no allocation yet: the
pool's demand (`ipamd.sizing` keeps the rule). Each change of that set wakes the pool
(`on_change`).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from ipamd.kube.client import KubeApi
from ipamd.kube.watch import ListWatch

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
        self._on_change = on_change
        self._watch = ListWatch(
            api,
            "/api/v1/pods",
            f"spec.nodeName={node_name}",
            self._listed,
            self._apply,
            what="pods",
            sleep=sleep,
            rng=rng,
        )
        self.bound: set[PodKey] = set()
        """The node's pods that need an address."""
        self.synced = False
        """Whether a list has been taken (before it, nothing is known: no demand is counted)."""

    @property
    def relists(self) -> int:
        return self._watch.lists

    def waiting(self, held: Collection[PodKey]) -> int:
        """Bound pods needing an address that hold no allocation (`held`: the pods that do)."""
        return len(self.bound.difference(held)) if self.synced else 0

    async def run(self) -> None:
        """List, then watch, forever; never raises but on cancellation."""
        await self._watch.run()

    def _listed(self, pods: list[dict[str, Any]]) -> None:
        bound = {_key(p) for p in pods if needs_address(p)}
        changed = bound != self.bound or not self.synced
        self.bound, self.synced = bound, True
        if changed:
            self._on_change()

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
