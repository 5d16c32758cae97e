"""PATCH as the real API server applies it: merge, strategic merge (the taints replaced whole, a
list with a merge key merged) and JSON patch with a `test` precondition; every result validated
(422 with its causes), a resourceVersion precondition (409), the status kept by the main resource,
Events posted and stored."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from bench.kube_api.kinds import NODES
from bench.kube_api.patch import JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH
from tests.support.kube_api import KubeApiServer

NODE = "ip-10-0-0-10"
STARTUP = "ipamd.k8s.aws/agent-not-ready"
NODE_PATH = f"/api/v1/nodes/{NODE}"


async def patch(
    client: aiohttp.ClientSession, path: str, body: Any, content_type: str
) -> tuple[int, Any]:
    response = await client.patch(
        path, data=json.dumps(body), headers={"Content-Type": content_type}
    )
    return response.status, await response.json()


def taint_keys(node: Any) -> list[str]:
    return [t["key"] for t in node["spec"].get("taints", [])]


async def test_a_strategic_merge_of_the_taints_replaces_the_whole_list(
    kube_api: KubeApiServer,
) -> None:
    """Taints have no patch strategy (x-kubernetes-list-type atomic): the list sent is the list
    kept, as with a merge patch; a client that sends only its own taint's removal must send the
    others back."""
    kube_api.add_node(NODE, taints=[f"{STARTUP}:NoSchedule", "team=gpu:NoSchedule"])
    async with kube_api.session() as client:
        status, node = await patch(
            client,
            NODE_PATH,
            {"spec": {"taints": [{"key": "team", "value": "gpu", "effect": "NoSchedule"}]}},
            STRATEGIC_MERGE_PATCH,
        )
        assert status == 200 and taint_keys(node) == ["team"]
        status, node = await patch(
            client,
            NODE_PATH,
            {"spec": {"taints": [{"key": "x", "effect": "NoExecute"}]}},
            MERGE_PATCH,
        )
        assert status == 200 and taint_keys(node) == ["x"]
        status, node = await patch(
            client, NODE_PATH, {"spec": {"taints": None}}, STRATEGIC_MERGE_PATCH
        )
        assert status == 200 and "taints" not in node["spec"]


async def test_a_strategic_merge_merges_a_list_by_its_merge_key(kube_api: KubeApiServer) -> None:
    kube_api.add_pod("web", NODE)
    path = "/api/v1/namespaces/default/pods/web"
    async with kube_api.session() as client:
        status, pod = await patch(
            client,
            path,
            {
                "metadata": {"finalizers": ["a"], "labels": {"app": "web"}},
                "spec": {"containers": [{"name": "app", "image": "nginx:1"}]},
            },
            STRATEGIC_MERGE_PATCH,
        )
        assert status == 200
        assert pod["spec"]["containers"] == [{"name": "app", "image": "nginx:1"}]
        status, pod = await patch(
            client, path, {"metadata": {"finalizers": ["b"]}}, STRATEGIC_MERGE_PATCH
        )
        assert pod["metadata"]["finalizers"] == ["a", "b"]  # a list of strings that merges: a union
        status, pod = await patch(
            client,
            path,
            {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}},
            STRATEGIC_MERGE_PATCH,
        )
        assert pod["metadata"]["finalizers"] == ["b"]
        status, pod = await patch(
            client,
            path,
            {
                "spec": {
                    "containers": [
                        {"name": "app", "$patch": "delete"},
                        {"name": "side", "image": "x"},
                    ]
                }
            },
            STRATEGIC_MERGE_PATCH,
        )
        assert [c["name"] for c in pod["spec"]["containers"]] == ["side"]


async def test_a_json_patch_removes_one_taint_under_a_test_precondition(
    kube_api: KubeApiServer,
) -> None:
    kube_api.add_node(NODE, taints=["team=gpu:NoSchedule", f"{STARTUP}:NoSchedule"])
    remove_startup = [
        {"op": "test", "path": "/spec/taints/1/key", "value": STARTUP},
        {"op": "remove", "path": "/spec/taints/1"},
    ]
    async with kube_api.session() as client:
        status, node = await patch(client, NODE_PATH, remove_startup, JSON_PATCH)
        assert status == 200 and taint_keys(node) == ["team"]
        before = kube_api.node(NODE)
        wrong_taint = [
            {"op": "test", "path": "/spec/taints/0/key", "value": STARTUP},
            {"op": "remove", "path": "/spec/taints/0"},
        ]
        status, body = await patch(client, NODE_PATH, wrong_taint, JSON_PATCH)
        assert status == 422 and body["kind"] == "Status" and body["reason"] == "Invalid"
        assert "test failed" in body["message"]
        status, body = await patch(client, NODE_PATH, remove_startup, JSON_PATCH)  # gone already
        assert status == 422
        assert kube_api.node(NODE) == before  # nothing applied, no new version
        status, body = await patch(
            client, NODE_PATH, [{"op": "remove", "path": "/spec/taints/5"}], JSON_PATCH
        )
        assert status == 422
        status, body = await patch(client, NODE_PATH, {"op": "remove"}, JSON_PATCH)
        assert status == 400 and body["reason"] == "BadRequest"


async def test_a_merge_patch_of_pod_annotations(kube_api: KubeApiServer) -> None:
    kube_api.add_pod("web", NODE, annotations={"keep": "me"})
    path = "/api/v1/namespaces/default/pods/web"
    async with kube_api.session() as client:
        status, pod = await patch(
            client,
            path,
            {"metadata": {"annotations": {"vpc.amazonaws.com/pod-ips": "10.0.0.5"}}},
            MERGE_PATCH,
        )
        assert status == 200
        assert pod["metadata"]["annotations"] == {
            "keep": "me",
            "vpc.amazonaws.com/pod-ips": "10.0.0.5",
        }
        status, pod = await patch(
            client,
            path,
            {"metadata": {"annotations": {"vpc.amazonaws.com/pod-ips": None}}},
            MERGE_PATCH,
        )
        assert pod["metadata"]["annotations"] == {"keep": "me"}
    assert [r.headers["content-type"] for r in kube_api.requests_for("pods", "PATCH")] == [
        MERGE_PATCH
    ] * 2


async def test_a_patch_that_makes_the_object_invalid_is_422_with_its_causes(
    kube_api: KubeApiServer,
) -> None:
    kube_api.add_pod("web", NODE)
    kube_api.add_node(NODE)
    async with kube_api.session() as client:
        status, body = await patch(
            client,
            "/api/v1/namespaces/default/pods/web",
            {"metadata": {"annotations": {"n": 5}}},
            MERGE_PATCH,
        )
        assert status == 422 and body["reason"] == "Invalid"
        assert body["details"]["causes"][0]["field"] == "metadata.annotations.n"
        status, body = await patch(
            client, NODE_PATH, {"spec": {"taints": [{"key": "x"}]}}, STRATEGIC_MERGE_PATCH
        )
        assert status == 422 and body["details"]["causes"][0]["reason"] == "FieldValueRequired"
        status, body = await patch(client, NODE_PATH, {"spec": {"taintz": []}}, MERGE_PATCH)
        assert status == 422 and body["details"]["causes"][0]["reason"] == "FieldValueNotSupported"
        status, body = await patch(
            client,
            NODE_PATH,
            {"spec": {"taints": [{"key": "x", "effect": "NoSchedule", "value": 3}]}},
            MERGE_PATCH,
        )
        assert status == 422 and body["details"]["causes"][0]["field"] == "spec.taints[0].value"


async def test_a_resource_version_in_a_patch_is_a_precondition(kube_api: KubeApiServer) -> None:
    node = kube_api.add_node(NODE, taints=[f"{STARTUP}:NoSchedule"])
    stale = node["metadata"]["resourceVersion"]
    kube_api.update(
        NODES,
        ("", NODE),
        lambda n: dict(n, metadata=dict(n["metadata"], labels={"moved": "on"})),
    )
    async with kube_api.session() as client:
        status, body = await patch(
            client,
            NODE_PATH,
            {"metadata": {"resourceVersion": stale}, "spec": {"taints": None}},
            MERGE_PATCH,
        )
        assert status == 409 and body["reason"] == "Conflict"
        current = kube_api.node(NODE)
        assert current is not None
        status, body = await patch(
            client,
            NODE_PATH,
            {
                "metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
                "spec": {"taints": None},
            },
            MERGE_PATCH,
        )
        assert status == 200 and int(body["metadata"]["resourceVersion"]) > int(
            current["metadata"]["resourceVersion"]
        )


async def test_the_main_resource_keeps_the_status_and_the_status_subresource_takes_it(
    kube_api: KubeApiServer,
) -> None:
    kube_api.add_node(NODE, max_pods=29)
    async with kube_api.session() as client:
        status, node = await patch(
            client, NODE_PATH, {"status": {"capacity": {"pods": "1"}}}, MERGE_PATCH
        )
        assert status == 200 and node["status"]["capacity"]["pods"] == "29"
        status, node = await patch(
            client,
            f"{NODE_PATH}/status",
            {"status": {"capacity": {"pods": "58"}}, "metadata": {"labels": {"x": "y"}}},
            MERGE_PATCH,
        )
        assert (
            status == 200
            and node["status"]["capacity"]["pods"] == "58"
            and "x" not in node["metadata"]["labels"]
        )


async def test_a_patch_that_changes_nothing_keeps_the_version(kube_api: KubeApiServer) -> None:
    node = kube_api.add_node(NODE)
    async with kube_api.session() as client:
        status, same = await patch(
            client,
            NODE_PATH,
            {"metadata": {"labels": {"kubernetes.io/hostname": NODE}}},
            MERGE_PATCH,
        )
    assert status == 200 and same == node


async def test_other_content_types_and_strategic_merge_of_a_custom_resource_are_415(
    kube_api: KubeApiServer,
) -> None:
    kube_api.add_node(NODE)
    kube_api.add_eniconfig("us-west-2a", "subnet-0a")
    eniconfig = "/apis/crd.k8s.amazonaws.com/v1alpha1/eniconfigs/us-west-2a"
    async with kube_api.session() as client:
        status, body = await patch(client, NODE_PATH, {"spec": {}}, "application/json")
        assert status == 415 and body["reason"] == "UnsupportedMediaType"
        status, _ = await patch(
            client, eniconfig, {"spec": {"subnet": "subnet-0b"}}, STRATEGIC_MERGE_PATCH
        )
        assert status == 415
        status, eni = await patch(client, eniconfig, {"spec": {"subnet": "subnet-0b"}}, MERGE_PATCH)
        assert status == 200 and eni["spec"]["subnet"] == "subnet-0b"
        status, body = await patch(client, eniconfig, {"spec": {"subnet": None}}, MERGE_PATCH)
        assert status == 422 and body["details"]["causes"][0]["reason"] == "FieldValueRequired"
        status, body = await patch(client, "/api/v1/nodes/nope", {"spec": {}}, MERGE_PATCH)
        assert status == 404 and body["reason"] == "NotFound"


async def test_events_are_validated_and_stored(kube_api: KubeApiServer) -> None:
    core = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{NODE}."},
        "involvedObject": {"kind": "Node", "name": NODE, "apiVersion": "v1"},
        "reason": "MissingIAMPermissions",
        "message": "Unauthorized operation: failed to call ec2:CreateTags",
        "type": "Warning",
        "source": {"component": "ipamd", "host": NODE},
    }
    modern = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": "eniconfig-missing", "namespace": "default"},
        "eventTime": "2026-01-01T00:00:00.000000Z",
        "reportingController": "ipamd",
        "reportingInstance": NODE,
        "action": "SelectENIConfig",
        "reason": "ENIConfigNotFound",
        "regarding": {"kind": "Node", "name": NODE},
        "note": "ENIConfig us-west-2a not found",
        "type": "Warning",
    }
    async with kube_api.session() as client:
        created = await client.post("/api/v1/namespaces/default/events", json=core)
        assert created.status == 201
        assert (await created.json())["metadata"]["name"].startswith(f"{NODE}.")
        assert (
            await client.post("/apis/events.k8s.io/v1/namespaces/default/events", json=modern)
        ).status == 201
        bad = await client.post("/api/v1/namespaces/default/events", json={**core, "count": "many"})
        assert bad.status == 422
        elsewhere = await client.post(
            "/api/v1/namespaces/other/events",
            json={**core, "metadata": {"name": "e", "namespace": "default"}},
        )
        assert elsewhere.status == 400
        listed = await (
            await client.get(
                "/api/v1/events",
                params={
                    "fieldSelector": "reason=MissingIAMPermissions,involvedObject.name=" + NODE
                },
            )
        ).json()
    assert [e["reason"] for e in kube_api.events()] == [
        "MissingIAMPermissions",
        "ENIConfigNotFound",
    ]
    assert len(listed["items"]) == 1 and listed["items"][0]["metadata"]["namespace"] == "default"
