"""The watch of this node's pods (IPAMD_POD_AWARE_POOL) against the test API server: list then watch
from the list's version, only this node's pods that will want an address, a dropped stream watched
again, a 410 relisted, a pod that leaves before its ADD no longer counted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from ipamd.kube.client import KubeApi
from ipamd.kube.credentials import from_kubeconfig
from ipamd.kube.pods import PodWatch
from tests.support.kube_api import KubeApiServer, kube_api

NODE = "ip-10-0-0-10.us-west-2.compute.internal"
OTHER = "ip-10-0-9-9.us-west-2.compute.internal"

__all__ = ["kube_api"]


async def _until(check: Callable[[], bool], deadline_s: float = 10.0) -> None:
    async with asyncio.timeout(deadline_s):
        # Polled: what is awaited is the server's and the watch's state, which sets no event.
        while not check():  # noqa: ASYNC110
            await asyncio.sleep(0.02)


@pytest.fixture
async def watch(kube_api: KubeApiServer) -> AsyncIterator[tuple[PodWatch, list[int]]]:
    kube_api.add_node(NODE)
    kube_api.add_node(OTHER)
    changes: list[int] = []
    api = KubeApi(from_kubeconfig(kube_api.kubeconfig))
    pods = PodWatch(api, NODE, lambda: changes.append(1))
    task = asyncio.create_task(pods.run())
    yield pods, changes
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await api.close()


async def test_only_this_nodes_pods_that_want_an_address_count(
    kube_api: KubeApiServer, watch: tuple[PodWatch, list[int]]
) -> None:
    pods, changes = watch
    kube_api.add_pod("web-0", NODE)
    await _until(lambda: pods.bound == {("default", "web-0")})
    kube_api.add_pod("elsewhere", OTHER)
    kube_api.add_pod("hostnet", NODE, host_network=True)
    kube_api.add_pod("web-1", NODE)
    await _until(lambda: len(pods.bound) == 2)
    assert pods.bound == {("default", "web-0"), ("default", "web-1")}
    assert pods.waiting({("default", "web-0")}) == 1, "web-0 holds an allocation already"
    kube_api.delete_pod("default", "web-1")  # left before its ADD
    await _until(lambda: pods.bound == {("default", "web-0")})
    kube_api.set_pod_phase("default", "web-0", "Succeeded")
    await _until(lambda: not pods.bound)
    assert changes
    for request in kube_api.requests_for("pods"):
        assert request.field_selector == f"spec.nodeName={NODE}", request.path


async def test_a_dropped_watch_and_a_410_lose_no_pod(
    kube_api: KubeApiServer, watch: tuple[PodWatch, list[int]]
) -> None:
    pods, _ = watch
    await _until(lambda: pods.synced and kube_api.watch_count() > 0)
    kube_api.drop_watches()
    kube_api.add_pod("during-the-gap", NODE)
    await _until(lambda: ("default", "during-the-gap") in pods.bound)
    relists = pods.relists
    kube_api.expire_history()
    kube_api.drop_watches()
    kube_api.add_pod("after-compaction", NODE)
    await _until(lambda: ("default", "after-compaction") in pods.bound)
    await _until(lambda: pods.relists > relists, deadline_s=15.0)
