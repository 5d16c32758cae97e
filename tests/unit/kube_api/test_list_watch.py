"""Lists and watches as the real API server serves them: one cluster-wide resourceVersion, watches
from a list's version, selectors that follow an object in and out of a watch, bookmarks, 410 for a
version too old, timeoutSeconds, paging, and the bulk population of issue 39's memory test."""

from __future__ import annotations

import json

import aiohttp
import pytest

from bench.kube_api.kinds import ENICONFIGS, PODS
from tests.support.kube_api import KubeApiServer
from tests.unit.kube_api.conftest import read_events, read_to_end

NODE = "ip-10-0-0-10"
MINE = f"spec.nodeName={NODE}"


def names(events: list[dict[str, object]]) -> list[tuple[object, object]]:
    return [(e["type"], e["object"]["metadata"].get("name")) for e in events]  # type: ignore[index]


async def test_objects_have_a_cluster_wide_resource_version_uid_and_creation_time(
    kube_api: KubeApiServer,
) -> None:
    node = kube_api.add_node(NODE)
    pod = kube_api.add_pod("web", NODE)
    eni = kube_api.add_eniconfig("us-west-2a", "subnet-0a")
    versions = [int(o["metadata"]["resourceVersion"]) for o in (node, pod, eni)]
    assert versions == sorted(versions) and len(set(versions)) == 3
    for obj in (node, pod, eni):
        assert isinstance(obj["metadata"]["resourceVersion"], str)
        assert obj["metadata"]["uid"] and obj["metadata"]["creationTimestamp"].endswith("Z")
    async with kube_api.session() as client:
        listed = await (await client.get("/api/v1/pods")).json()
        got = await (await client.get("/api/v1/namespaces/default/pods/web")).json()
    assert listed["kind"] == "PodList" and listed["metadata"]["resourceVersion"] == str(
        versions[-1]
    )
    assert got == pod == listed["items"][0]


async def test_a_list_by_node_names_only_that_nodes_pods(kube_api: KubeApiServer) -> None:
    kube_api.add_pod("a", NODE)
    kube_api.add_pod("b", "ip-10-0-0-11")
    kube_api.add_pod("c", NODE, namespace="kube-system", host_network=True, phase="Running")
    kube_api.add_pod("pending")
    async with kube_api.session() as client:
        mine = await (await client.get("/api/v1/pods", params={"fieldSelector": MINE})).json()
        pod_network = await (
            await client.get(
                "/api/v1/pods", params={"fieldSelector": f"{MINE},spec.hostNetwork=false"}
            )
        ).json()
        in_default = await (
            await client.get("/api/v1/namespaces/default/pods", params={"fieldSelector": MINE})
        ).json()
        unbound = await (
            await client.get("/api/v1/pods", params={"fieldSelector": "spec.nodeName="})
        ).json()
        by_name = await (
            await client.get("/api/v1/pods", params={"fieldSelector": "metadata.name=b"})
        ).json()
        running = await (
            await client.get("/api/v1/pods", params={"fieldSelector": "status.phase!=Pending"})
        ).json()
    assert [p["metadata"]["name"] for p in mine["items"]] == ["a", "c"]
    assert [p["metadata"]["name"] for p in pod_network["items"]] == ["a"]
    assert [p["metadata"]["name"] for p in in_default["items"]] == ["a"]
    assert [p["metadata"]["name"] for p in unbound["items"]] == ["pending"]
    assert [p["metadata"]["name"] for p in by_name["items"]] == ["b"]
    assert [p["metadata"]["name"] for p in running["items"]] == ["c"]
    assert all(r.field_selector for r in kube_api.requests_for("pods"))


async def test_an_unsupported_field_or_a_bad_selector_is_400(kube_api: KubeApiServer) -> None:
    async with kube_api.session() as client:
        unsupported = await client.get("/api/v1/pods", params={"fieldSelector": "spec.priority=1"})
        crd_field = await client.get(
            "/apis/crd.k8s.amazonaws.com/v1alpha1/eniconfigs",
            params={"fieldSelector": "spec.subnet=x"},
        )
        garbled = await client.get("/api/v1/pods", params={"fieldSelector": "spec.nodeName"})
        assert unsupported.status == crd_field.status == garbled.status == 400
        body = await unsupported.json()
    assert (
        body["reason"] == "BadRequest"
        and "field label not supported: spec.priority" in body["message"]
    )


async def test_label_selectors(kube_api: KubeApiServer) -> None:
    kube_api.add_pod("a", NODE, labels={"app": "web", "tier": "front"})
    kube_api.add_pod("b", NODE, labels={"app": "db"})
    kube_api.add_pod("c", NODE)
    cases = {
        "app=web": ["a"],
        "app!=web": ["b", "c"],
        "app": ["a", "b"],
        "!app": ["c"],
        "app in (web, db),tier notin (back)": ["a", "b"],
    }
    async with kube_api.session() as client:
        for selector, expected in cases.items():
            listed = await (
                await client.get("/api/v1/pods", params={"labelSelector": selector})
            ).json()
            assert [p["metadata"]["name"] for p in listed["items"]] == expected, selector


async def test_a_watch_from_a_lists_version_sees_each_later_change_once_in_order(
    kube_api: KubeApiServer,
) -> None:
    kube_api.add_pod("before", NODE)
    async with kube_api.session() as client:
        listed = await (await client.get("/api/v1/pods", params={"fieldSelector": MINE})).json()
        rv = listed["metadata"]["resourceVersion"]
        params = {"watch": "1", "resourceVersion": rv, "fieldSelector": MINE}
        async with client.get("/api/v1/pods", params=params) as watch:
            assert watch.status == 200
            kube_api.add_pod("after", NODE)
            kube_api.add_pod("elsewhere", "ip-10-0-0-11")
            kube_api.set_pod_phase("default", "after", "Running", pod_ip="10.0.0.20")
            kube_api.delete_pod("default", "before")
            events = await read_events(watch, 3)
    assert names(events) == [("ADDED", "after"), ("MODIFIED", "after"), ("DELETED", "before")]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert versions == sorted(versions) and versions[0] > int(rv)
    assert events[1]["object"]["status"]["podIP"] == "10.0.0.20"


async def test_a_watch_replays_the_changes_after_an_older_version_within_the_window(
    kube_api: KubeApiServer,
) -> None:
    first = kube_api.add_pod("one", NODE)
    kube_api.add_pod("two", NODE)
    kube_api.add_pod("three", NODE)
    params = {
        "watch": "true",
        "resourceVersion": first["metadata"]["resourceVersion"],
        "timeoutSeconds": "0.2",
    }
    async with kube_api.session() as client, client.get("/api/v1/pods", params=params) as watch:
        events = await read_to_end(watch)
    assert names(events) == [("ADDED", "two"), ("ADDED", "three")]


async def test_a_watch_without_a_version_starts_with_the_current_objects(
    kube_api: KubeApiServer,
) -> None:
    kube_api.add_pod("a", NODE)
    kube_api.add_pod("b", "ip-10-0-0-11")
    for version in ({}, {"resourceVersion": "0"}):
        params = {"watch": "1", "fieldSelector": MINE, "timeoutSeconds": "0.2", **version}
        async with kube_api.session() as client, client.get("/api/v1/pods", params=params) as watch:
            assert names(await read_to_end(watch)) == [("ADDED", "a")]


async def test_binding_a_pod_to_the_node_is_added_and_moving_it_away_is_deleted(
    kube_api: KubeApiServer,
) -> None:
    """The watch cache filters by selector: a pod the scheduler binds to this node enters the
    node's watch as ADDED, and a change that takes it out of the selector is DELETED."""
    kube_api.add_pod("web")
    async with kube_api.session() as client:
        params = {"watch": "1", "fieldSelector": MINE}
        async with client.get("/api/v1/pods", params=params) as watch:
            await kube_api.wait_for_watches(1)
            kube_api.bind_pod("default", "web", NODE)
            kube_api.update(
                PODS,
                ("default", "web"),
                lambda p: dict(p, spec=dict(p["spec"], nodeName="ip-10-0-0-11")),
            )
            events = await read_events(watch, 2)
    assert names(events) == [("ADDED", "web"), ("DELETED", "web")]
    assert events[1]["object"]["spec"]["nodeName"] == "ip-10-0-0-11"


async def test_bookmarks_carry_the_latest_version_after_every_change_sent(
    kube_api: KubeApiServer,
) -> None:
    kube_api.add_pod("a", NODE)
    async with kube_api.session() as client:
        params = {
            "watch": "1",
            "resourceVersion": "1",
            "allowWatchBookmarks": "true",
            "fieldSelector": MINE,
        }
        async with client.get("/api/v1/pods", params=params) as watch:
            await kube_api.wait_for_watches(1)
            other = kube_api.add_pod("other", "ip-10-0-0-11")  # not this node: never sent
            assert kube_api.send_bookmarks() == 1
            events = await read_events(watch, 1)
    assert events == [
        {
            "type": "BOOKMARK",
            "object": {
                "kind": "Pod",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": other["metadata"]["resourceVersion"]},
            },
        }
    ]


async def test_bookmarks_come_on_their_interval_and_only_when_allowed() -> None:
    async with KubeApiServer(bookmark_interval_s=0.05) as api, api.session() as client:
        allowed = {"watch": "1", "allowWatchBookmarks": "true", "timeoutSeconds": "0.5"}
        async with client.get("/api/v1/nodes", params=allowed) as watch:
            events = await read_to_end(watch)
        assert events and {e["type"] for e in events} == {"BOOKMARK"}
        async with client.get(
            "/api/v1/nodes", params={"watch": "1", "timeoutSeconds": "0.3"}
        ) as watch:
            assert await read_to_end(watch) == []


async def test_send_initial_events_ends_the_initial_state_with_a_bookmark(
    kube_api: KubeApiServer,
) -> None:
    kube_api.add_pod("a", NODE)
    params = {
        "watch": "1",
        "sendInitialEvents": "true",
        "resourceVersionMatch": "NotOlderThan",
        "allowWatchBookmarks": "true",
        "fieldSelector": MINE,
    }
    async with kube_api.session() as client, client.get("/api/v1/pods", params=params) as watch:
        events = await read_events(watch, 2)
    assert names(events) == [("ADDED", "a"), ("BOOKMARK", None)]
    assert events[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


async def test_a_version_older_than_the_window_is_an_error_event_410() -> None:
    async with KubeApiServer(history_window=2) as api:
        first = api.add_pod("a", NODE)["metadata"]["resourceVersion"]
        for name in ("b", "c", "d"):
            api.add_pod(name, NODE)
        async with api.session() as client:
            async with client.get(
                "/api/v1/pods", params={"watch": "1", "resourceVersion": first}
            ) as watch:
                assert watch.status == 200
                events = await read_to_end(watch)
            assert [e["type"] for e in events] == ["ERROR"]
            status = events[0]["object"]
            assert (status["kind"], status["code"], status["reason"]) == ("Status", 410, "Expired")
            recent = str(int(first) + 2)
            async with client.get(
                "/api/v1/pods",
                params={"watch": "1", "resourceVersion": recent, "timeoutSeconds": "0.2"},
            ) as watch:
                assert names(await read_to_end(watch)) == [("ADDED", "d")]


async def test_expire_history_makes_every_version_seen_so_far_too_old(
    kube_api: KubeApiServer,
) -> None:
    kube_api.add_pod("a", NODE)
    rv = kube_api.add_pod("b", NODE)["metadata"]["resourceVersion"]
    assert kube_api.expire_history() == int(rv)
    async with kube_api.session() as client:
        async with client.get(
            "/api/v1/pods", params={"watch": "1", "resourceVersion": str(int(rv) - 1)}
        ) as watch:
            assert (await read_to_end(watch))[0]["object"]["code"] == 410
        async with client.get(
            "/api/v1/pods", params={"watch": "1", "resourceVersion": rv, "timeoutSeconds": "0.2"}
        ) as watch:
            assert await read_to_end(watch) == []  # the current version itself is still good


async def test_timeout_seconds_ends_the_stream_cleanly(kube_api: KubeApiServer) -> None:
    async with kube_api.session() as client:
        params = {"watch": "1", "resourceVersion": "0", "timeoutSeconds": "0.2"}
        async with client.get("/api/v1/pods", params=params) as watch:
            assert await read_to_end(watch, timeout_s=3) == []


async def test_drop_watches_cuts_the_stream_and_end_watches_ends_it(
    kube_api: KubeApiServer,
) -> None:
    async with kube_api.session() as client:
        async with client.get("/api/v1/pods", params={"watch": "1"}) as watch:
            await kube_api.wait_for_watches(1)
            kube_api.add_pod("a", NODE)
            assert names(await read_events(watch, 1)) == [("ADDED", "a")]
            assert kube_api.drop_watches() == 1
            with pytest.raises(aiohttp.ClientPayloadError):
                await read_to_end(watch)
        async with client.get(
            "/api/v1/pods", params={"watch": "1", "resourceVersion": "1"}
        ) as watch:
            await kube_api.wait_for_watches(1)
            assert kube_api.end_watches() == 1
            assert await read_to_end(watch) == []
    assert kube_api.watch_count() == 0


async def test_eniconfigs_get_list_and_watch_by_name(kube_api: KubeApiServer) -> None:
    base = "/apis/crd.k8s.amazonaws.com/v1alpha1/eniconfigs"
    kube_api.add_eniconfig("us-west-2a", "subnet-0a", ["sg-1"])
    kube_api.add_eniconfig("us-west-2b", "subnet-0b")
    async with kube_api.session() as client:
        got = await (await client.get(f"{base}/us-west-2a")).json()
        assert got["spec"] == {"subnet": "subnet-0a", "securityGroups": ["sg-1"]}
        assert (await client.get(f"{base}/nope")).status == 404
        listed = await (
            await client.get(base, params={"fieldSelector": "metadata.name=us-west-2b"})
        ).json()
        assert listed["kind"] == "ENIConfigList" and [
            e["metadata"]["name"] for e in listed["items"]
        ] == ["us-west-2b"]
        params = {
            "watch": "1",
            "resourceVersion": listed["metadata"]["resourceVersion"],
            "fieldSelector": "metadata.name=us-west-2b",
        }
        async with client.get(base, params=params) as watch:
            kube_api.update(
                ENICONFIGS,
                ("", "us-west-2a"),
                lambda e: dict(e, spec={"subnet": "subnet-0c"}),
            )
            kube_api.update(
                ENICONFIGS,
                ("", "us-west-2b"),
                lambda e: dict(e, spec={"subnet": "subnet-0d"}),
            )
            events = await read_events(watch, 1)
    assert (
        names(events) == [("MODIFIED", "us-west-2b")]
        and events[0]["object"]["spec"]["subnet"] == "subnet-0d"
    )


async def test_limit_and_continue_page_a_list(kube_api: KubeApiServer) -> None:
    for i in range(5):
        kube_api.add_pod(f"p{i}", NODE)
    seen: list[str] = []
    versions = set()
    async with kube_api.session() as client:
        params = {"limit": "2", "fieldSelector": MINE}
        while True:
            page = await (await client.get("/api/v1/pods", params=params)).json()
            seen += [p["metadata"]["name"] for p in page["items"]]
            versions.add(page["metadata"]["resourceVersion"])
            if not page["metadata"].get("continue"):
                break
            params = {**params, "continue": page["metadata"]["continue"]}
        assert seen == [f"p{i}" for i in range(5)] and len(versions) == 1
        kube_api.add_pod("later", NODE)
        kube_api.expire_history()  # compacts past the list's version
        expired = await client.get(
            "/api/v1/pods", params={"limit": "2", "continue": params["continue"]}
        )
        assert expired.status == 410


async def test_the_bulk_population_is_served_but_never_in_a_node_scoped_answer(
    kube_api: KubeApiServer,
) -> None:
    kube_api.add_node(NODE)
    kube_api.add_pod("mine", NODE)
    kube_api.add_bulk(pods=100_000, eniconfigs=5_000)
    kube_api.add_eniconfig("default", "subnet-0a")
    async with kube_api.session() as client:
        mine = await (await client.get("/api/v1/pods", params={"fieldSelector": MINE})).json()
        assert [p["metadata"]["name"] for p in mine["items"]] == ["mine"]
        params = {"watch": "1", "fieldSelector": MINE, "timeoutSeconds": "0.5"}
        async with client.get("/api/v1/pods", params=params) as watch:
            assert names(await read_to_end(watch)) == [("ADDED", "mine")]
        other = await (
            await client.get(
                "/api/v1/pods", params={"fieldSelector": "spec.nodeName=bulk-node-00999"}
            )
        ).json()
        assert len(other["items"]) == 100
        assert {p["spec"]["nodeName"] for p in other["items"]} == {"bulk-node-00999"}
        page = await (await client.get("/api/v1/pods", params={"limit": "500"})).json()
        assert len(page["items"]) == 500 and page["metadata"]["continue"]
        one = await (
            await client.get("/apis/crd.k8s.amazonaws.com/v1alpha1/eniconfigs/bulk-eniconfig-04999")
        ).json()
        assert one["spec"]["subnet"] == "subnet-00000000000001387"
        by_name = await (
            await client.get(
                "/apis/crd.k8s.amazonaws.com/v1alpha1/eniconfigs",
                params={"fieldSelector": "metadata.name=default"},
            )
        ).json()
        assert [e["metadata"]["name"] for e in by_name["items"]] == ["default"]
        every = await client.get("/apis/crd.k8s.amazonaws.com/v1alpha1/eniconfigs")
        assert len((await every.json())["items"]) == 5_001
        pod = await (await client.get("/api/v1/namespaces/bulk-007/pods/bulk-pod-000007")).json()
        assert pod["status"]["phase"] == "Running" and pod["metadata"]["resourceVersion"]
        kube_api.schemas.admit(pod)
        merged = await client.patch(
            "/api/v1/namespaces/bulk-007/pods/bulk-pod-000007",
            data=json.dumps({"metadata": {"annotations": {"x": "y"}}}),
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert (await merged.json())["metadata"]["annotations"] == {"x": "y"}
        again = await (await client.get("/api/v1/namespaces/bulk-007/pods/bulk-pod-000007")).json()
        assert again["metadata"]["annotations"] == {"x": "y"}


async def test_a_watch_of_one_object_by_its_path_and_bad_numbers_are_400(
    kube_api: KubeApiServer,
) -> None:
    kube_api.add_node(NODE)
    kube_api.add_node("ip-10-0-0-11")
    async with kube_api.session() as client:
        params = {"watch": "1", "timeoutSeconds": "0.2"}
        async with client.get(f"/api/v1/nodes/{NODE}", params=params) as watch:
            assert names(await read_to_end(watch)) == [("ADDED", NODE)]
        assert (await client.get("/api/v1/pods", params={"limit": "many"})).status == 400
        bad = await client.get("/api/v1/pods", params={"watch": "1", "timeoutSeconds": "x"})
        assert bad.status == 400
        assert (
            await client.get("/api/v1/pods", params={"watch": "1", "resourceVersion": "abc"})
        ).status == 400
