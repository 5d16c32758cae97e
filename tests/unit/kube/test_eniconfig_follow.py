"""Custom networking followed at run time (`ipamd.kube.eniconfigs`) against the test API server: the
node's relabelling chooses another ENIConfig, a changed spec is applied, a deleted one keeps the
last good one with the problem said once as an Event, and only this node's objects are watched."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from bench.kube_api.kinds import ENICONFIGS, NODES
from ipamd.config.eniconfig import EniConfig
from ipamd.kube.client import KubeApi
from ipamd.kube.credentials import from_kubeconfig
from ipamd.kube.eniconfigs import EniConfigFollower
from ipamd.kube.node import NodeObjects
from tests.support.kube_api import KubeApiServer, kube_api

NODE = "ip-10-0-0-10.us-west-2.compute.internal"
KEY = "k8s.amazonaws.com/eniConfig"
SUBNET_A = "subnet-0aaaaaaaaaaaaaaa1"
SUBNET_B = "subnet-0bbbbbbbbbbbbbbb2"
SG = "sg-0123456789abcdef0"

__all__ = ["kube_api"]


class Target:
    def __init__(self) -> None:
        self.followed: list[tuple[EniConfig, str]] = []

    def follow_eni_config(self, config: EniConfig, problem: str = "") -> None:
        self.followed.append((config, problem))


async def _until(check: Callable[[], bool], deadline_s: float = 10.0) -> None:
    async with asyncio.timeout(deadline_s):
        # Polled: what is awaited is the server's and the watch's state, which sets no event.
        while not check():  # noqa: ASYNC110
            await asyncio.sleep(0.02)


@pytest.fixture
async def follow(kube_api: KubeApiServer) -> AsyncIterator[tuple[EniConfigFollower, Target]]:
    kube_api.add_node(NODE, labels={KEY: "pods-a"})
    kube_api.add_node("ip-10-0-9-9.us-west-2.compute.internal", labels={KEY: "pods-b"})
    kube_api.add_eniconfig("pods-a", SUBNET_A)
    kube_api.add_eniconfig("pods-b", SUBNET_B, [SG])
    api = KubeApi(from_kubeconfig(kube_api.kubeconfig))
    objects = NodeObjects(api, NODE)
    target = Target()

    async def event(note: str) -> None:
        await objects.event("Warning", "InvalidENIConfig", "ReadENIConfig", note)

    follower = EniConfigFollower(objects, KEY, KEY, EniConfig("pods-a", SUBNET_A), target, event)
    task = asyncio.create_task(follower.run())
    await _until(lambda: kube_api.watch_count() >= 2)
    yield follower, target
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await api.close()


def _relabel(kube_api: KubeApiServer, value: str) -> None:
    def change(node: dict[str, Any]) -> dict[str, Any]:
        meta = dict(node["metadata"])
        meta["labels"] = dict(meta.get("labels") or {}, **{KEY: value})
        return dict(node, metadata=meta)

    kube_api.update(NODES, ("", NODE), change)


async def test_a_relabelled_node_follows_its_new_eniconfig(
    kube_api: KubeApiServer, follow: tuple[EniConfigFollower, Target]
) -> None:
    follower, target = follow
    assert target.followed == [], "the ENIConfig read at start is already in use"
    _relabel(kube_api, "pods-b")
    await _until(lambda: bool(target.followed))
    assert target.followed == [(EniConfig("pods-b", SUBNET_B, (SG,)), "")]
    assert follower.name == "pods-b"
    watches = [r for r in kube_api.requests if r.is_watch]
    assert {r.field_selector for r in watches} <= {
        f"metadata.name={NODE}",
        "metadata.name=pods-a",
        "metadata.name=pods-b",
    }, "only this node and the ENIConfig it chose are watched"


async def test_a_changed_spec_goes_to_the_next_eni(
    kube_api: KubeApiServer, follow: tuple[EniConfigFollower, Target]
) -> None:
    _, target = follow

    def change(obj: dict[str, Any]) -> dict[str, Any]:
        return dict(obj, spec={"subnet": SUBNET_B, "securityGroups": [SG]})

    kube_api.update(ENICONFIGS, ("", "pods-a"), change)
    await _until(lambda: bool(target.followed))
    assert target.followed == [(EniConfig("pods-a", SUBNET_B, (SG,)), "")]


async def test_a_deleted_eniconfig_keeps_the_last_good_one_and_says_so(
    kube_api: KubeApiServer, follow: tuple[EniConfigFollower, Target]
) -> None:
    follower, target = follow
    kube_api.delete(ENICONFIGS, ("", "pods-a"))
    await _until(lambda: bool(target.followed))
    (config, problem), *_ = target.followed
    assert config == EniConfig("pods-a", SUBNET_A), "new ENIs keep the last good ENIConfig"
    assert "ENIConfig 'pods-a' was deleted" in problem and SUBNET_A in problem, problem
    await _until(lambda: bool(kube_api.events()))
    (event,) = kube_api.events()
    assert (event["reason"], event["type"], event["regarding"]["name"]) == (
        "InvalidENIConfig",
        "Warning",
        NODE,
    )
    assert "was deleted" in event["note"]

    kube_api.add_eniconfig("pods-a", SUBNET_B)  # put back, elsewhere
    await _until(lambda: target.followed[-1] == (EniConfig("pods-a", SUBNET_B), ""))
    assert follower.problem == ""


async def test_a_label_naming_no_eniconfig_is_a_problem_until_one_exists(
    kube_api: KubeApiServer, follow: tuple[EniConfigFollower, Target]
) -> None:
    _, target = follow
    _relabel(kube_api, "pods-c")
    await _until(lambda: bool(target.followed))
    config, problem = target.followed[-1]
    assert config == EniConfig("pods-a", SUBNET_A)
    assert "ENIConfig 'pods-c' does not exist" in problem, problem
    kube_api.add_eniconfig("pods-c", SUBNET_B)
    await _until(lambda: target.followed[-1] == (EniConfig("pods-c", SUBNET_B), ""))
