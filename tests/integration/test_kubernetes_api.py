"""ipamd against a Kubernetes API server (tests/support/kube_api.py: a real HTTP server with the API
server's semantics, every object and patch validated against the Kubernetes schemas), the daemon
as a process started with KUBECONFIG, as an operator runs it off-cluster:

- the startup taint goes once ipamd serves ADDs, and no other taint is touched;
- ANNOTATE_POD_IP: an ADD annotates the pod with `vpc.amazonaws.com/pod-ips`, its DEL clears it;
- custom networking takes the ENIConfig VPC CNI would choose for the node (its label), and a
  missing one stops the start with one line naming it; one relabelled to a missing one while
  running is degraded until it exists;
- the API down at start, and failing with 5xx and 429 later, stops no ADD;
- every request names this node: nothing cluster-wide is read.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from bench.kube_api.kinds import NODES
from tests.support.embedded_daemon import BIN, NETWORK, EmbeddedDaemon, clean_env, start_daemon
from tests.support.kube_api import KubeApiServer

NODE = "ip-10-0-0-10.us-west-2.compute.internal"
TAINT = "ipamd.k8s.aws/agent-not-ready:NoSchedule"
OTHER_TAINT = "example.com/gpu=true:NoSchedule"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[KubeApiServer]:
    with KubeApiServer(tmp_path / "kube") as server:
        yield server


def _start(tmp_path: Path, api: KubeApiServer, **extra: str) -> EmbeddedDaemon:
    return start_daemon(
        tmp_path, KUBECONFIG=str(api.kubeconfig), MY_NODE_NAME=NODE, IPAMD_KUBERNETES="on", **extra
    )


def _until(check: object, deadline_s: float = 30.0) -> None:
    end = time.monotonic() + deadline_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < end, "not in time"
        time.sleep(0.1)


def _taints(api: KubeApiServer) -> list[str]:
    node = api.node(NODE) or {}
    return [
        f"{t['key']}{'=' + t['value'] if t.get('value') else ''}:{t['effect']}"
        for t in (node.get("spec") or {}).get("taints") or []
    ]


def test_the_startup_taint_goes_once_adds_are_served_and_no_other(
    tmp_path: Path, api: KubeApiServer, started: list[EmbeddedDaemon]
) -> None:
    api.add_node(NODE, taints=[OTHER_TAINT, TAINT])
    daemon = _start(tmp_path, api, IPAMD_STARTUP_TAINT=TAINT)
    started.append(daemon)
    daemon.wait_for("/readyz")
    _until(lambda: TAINT not in _taints(api))
    assert _taints(api) == [OTHER_TAINT], "only ipamd's own taint is removed"
    patches = api.requests_for("nodes", "PATCH")
    assert patches and all(r.path == f"/api/v1/nodes/{NODE}" for r in patches)
    assert all(r.status is not None and r.status < 300 for r in patches), patches
    daemon.wait_for_line(r"kube\.startup_taint_removed")


def test_pod_ips_are_annotated_on_add_and_cleared_on_del(
    tmp_path: Path, api: KubeApiServer, started: list[EmbeddedDaemon]
) -> None:
    api.add_node(NODE)
    api.add_pod("web-0", NODE, namespace="shop")
    daemon = _start(tmp_path, api, ANNOTATE_POD_IP="true")
    started.append(daemon)
    daemon.wait_for("/readyz")
    key = {
        "container_id": "a" * 64,
        "ifname": "eth0",
        "network": NETWORK,
        "pod": {"namespace": "shop", "name": "web-0", "uid": "u-1"},
    }

    def added() -> bool:
        status, body = daemon.call("POST", "/v1/allocations", key)
        assert status in (200, 503), (status, body)
        return status == 200

    _until(added)
    _, body = daemon.call("POST", "/v1/allocations", key)
    address = str(body["ips"][0]["address"]).partition("/")[0]

    def annotated(value: str) -> bool:
        annotations = (api.pod("shop", "web-0") or {})["metadata"].get("annotations") or {}
        return annotations.get("vpc.amazonaws.com/pod-ips") == value

    _until(lambda: annotated(address))  # written right after the answer, in the background
    code, _ = daemon.call("DELETE", f"/v1/allocations/{'a' * 64}/eth0?network={NETWORK}")
    assert code == 200
    _until(lambda: annotated(""))


def test_an_api_that_fails_stops_no_add(
    tmp_path: Path, api: KubeApiServer, started: list[EmbeddedDaemon]
) -> None:
    api.add_node(NODE)
    api.add_pod("web-1", NODE)
    api.fail(times=1000, status=503, match=lambda r: r.kind_plural == "pods")
    daemon = _start(tmp_path, api, ANNOTATE_POD_IP="true")
    started.append(daemon)
    daemon.wait_for("/readyz")
    key = {
        "container_id": "b" * 64,
        "ifname": "eth0",
        "network": NETWORK,
        "pod": {"namespace": "default", "name": "web-1", "uid": "u-2"},
    }
    answers: list[int] = []

    def added() -> bool:
        status, body = daemon.call("POST", "/v1/allocations", key)
        assert status in (200, 503), (status, body)
        answers.append(status)
        return status == 200

    started_at = time.monotonic()
    _until(added)
    assert time.monotonic() - started_at < 10, "the ADD did not wait on the failing API"
    daemon.wait_for_line(r"kube\.annotate_failed namespace=default name=web-1")


def test_the_api_down_at_start_stops_nothing(tmp_path: Path, started: list[EmbeddedDaemon]) -> None:
    with KubeApiServer(tmp_path / "kube", serving=False) as api:
        daemon = _start(tmp_path, api, IPAMD_STARTUP_TAINT=TAINT)
        started.append(daemon)
        daemon.wait_for("/readyz", deadline_s=90.0)
        assert daemon.add("c" * 64)
        daemon.wait_for_line(r"kube\.unreachable")


def _primary_subnet(daemon: EmbeddedDaemon) -> str:
    done = subprocess.run(
        [str(BIN / "ipamctl"), "--socket", str(daemon.socket_path), "--json", "enis"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return str(next(e["subnet_id"] for e in json.loads(done.stdout)["enis"] if e["is_primary"]))


def test_custom_networking_takes_the_eniconfig_the_nodes_label_names(
    tmp_path: Path, api: KubeApiServer, started: list[EmbeddedDaemon]
) -> None:
    first = start_daemon(tmp_path)  # the embedded node, to learn its subnet
    started.append(first)
    first.wait_for("/readyz")
    subnet = _primary_subnet(first)
    assert first.stop() == 0

    api.add_node(NODE, labels={"k8s.amazonaws.com/eniConfig": "pods-a"})
    api.add_eniconfig("pods-a", subnet)
    api.add_eniconfig("default", "subnet-0123456789abcdef0")
    daemon = _start(tmp_path, api, AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG="true")
    started.append(daemon)
    daemon.wait_for("/readyz")
    line = daemon.wait_for_line(r"kube\.eniconfig name=pods-a subnet=(subnet-\w+)")
    assert line.group(1) == subnet
    _until(lambda: any(r.is_watch for r in api.requests_for("eniconfigs")))
    for request in api.requests_for("eniconfigs"):
        assert request.path.endswith("/eniconfigs/pods-a") or (
            request.field_selector == "metadata.name=pods-a"
        ), ("only the node's own ENIConfig is read and watched", request.path)

    # Relabelled to one that does not exist: degraded, said once as an Event, new ENIs keep pods-a's.
    api.update(NODES, ("", NODE), partial(_labelled, "pods-c"))
    _until(lambda: _degraded(daemon))
    (reason,) = _degraded(daemon)
    assert "ENIConfig 'pods-c' does not exist" in reason and subnet in reason, reason
    _until(lambda: any(e["reason"] == "InvalidENIConfig" for e in api.events()))
    status = subprocess.run(
        [str(BIN / "ipamctl"), "--socket", str(daemon.socket_path), "status"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "degraded: custom networking: ENIConfig 'pods-c' does not exist" in status.stdout

    api.add_eniconfig("pods-c", subnet)
    daemon.wait_for_line(r"kube\.eniconfig_followed name=pods-c subnet=")
    _until(lambda: not _degraded(daemon))


def _labelled(value: str, node: dict[str, Any]) -> dict[str, Any]:
    meta = dict(node["metadata"])
    meta["labels"] = dict(meta.get("labels") or {}, **{"k8s.amazonaws.com/eniConfig": value})
    return dict(node, metadata=meta)


def _degraded(daemon: EmbeddedDaemon) -> list[str]:
    _, body = daemon.call("GET", "/readyz")
    return list(body.get("degraded") or ())


def test_a_missing_eniconfig_stops_the_start_naming_it(
    tmp_path: Path, api: KubeApiServer, started: list[EmbeddedDaemon]
) -> None:
    api.add_node(NODE, annotations={"k8s.amazonaws.com/eniConfig": "missing-one"})
    daemon = _start(tmp_path, api, AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG="true")
    started.append(daemon)
    assert daemon.wait() == 2
    assert any("ENIConfig 'missing-one'" in line for line in daemon.plain_lines), daemon.lines[-5:]
    (event,) = api.events()
    assert (event["reason"], event["regarding"]["name"]) == ("InvalidENIConfig", NODE), event


def test_every_request_names_this_node(
    tmp_path: Path, api: KubeApiServer, started: list[EmbeddedDaemon]
) -> None:
    api.add_node(NODE, taints=[TAINT])
    api.add_bulk(pods=2_000, eniconfigs=50)
    daemon = _start(tmp_path, api, IPAMD_STARTUP_TAINT=TAINT)
    started.append(daemon)
    daemon.wait_for("/readyz")
    _until(lambda: TAINT not in _taints(api))
    _until(lambda: any(r.kind_plural == "pods" and r.is_watch for r in api.requests))
    for request in list(api.requests):
        by_node = request.field_selector == f"spec.nodeName={NODE}"
        assert NODE in request.path or by_node or request.path.startswith("/api/v1/namespaces/"), (
            request.path
        )
        assert not request.is_watch or by_node, request.path


def test_max_pods_comes_from_the_nodes_capacity_without_a_kubelet_config(
    tmp_path: Path, api: KubeApiServer, started: list[EmbeddedDaemon]
) -> None:
    api.add_node(NODE, max_pods=8)
    daemon = _start(tmp_path, api, IPAMD_KUBELET_CONFIG=str(tmp_path / "no-such-kubelet.json"))
    started.append(daemon)
    daemon.wait_for("/readyz")
    _, pool = daemon.call("GET", "/v1/pool")
    limits = pool["limits"]
    assert limits["max_pods"] == 8, limits
    assert f"Node {NODE} status.capacity.pods" in limits["kubelet_config"], limits


def test_pods_bound_here_get_their_addresses_before_their_add(
    tmp_path: Path, api: KubeApiServer, started: list[EmbeddedDaemon]
) -> None:
    """IPAMD_POD_AWARE_POOL: with no warm address asked for the pool holds one address; five
    pods bound to the node make it grow to five free before any of their ADDs, which are then
    answered at once. Pods of other nodes count for nothing, nor do host-network pods."""
    api.add_node(NODE)
    api.add_node("ip-10-0-9-9.us-west-2.compute.internal")
    # No warm address asked for; the floor of one also keeps the pool from filling whole ENIs.
    daemon = _start(tmp_path, api, WARM_IP_TARGET="0", MINIMUM_IP_TARGET="1")
    started.append(daemon)
    daemon.wait_for("/readyz")

    def free() -> int:
        _, pool = daemon.call("GET", "/v1/pool")
        return int(pool["counts"]["free"])

    _until(lambda: api.watch_count() > 0 and free() >= 1)
    before = free()
    assert before < 5, before
    for n in range(5):
        api.add_pod(f"web-{n}", NODE)
    api.add_pod("elsewhere", "ip-10-0-9-9.us-west-2.compute.internal")
    api.add_pod("hostnet", NODE, host_network=True)
    _until(lambda: free() >= 5)
    for n in range(5):
        key = {
            "container_id": f"{n:064x}",
            "ifname": "eth0",
            "network": NETWORK,
            "pod": {"namespace": "default", "name": f"web-{n}", "uid": f"u-{n}"},
        }
        status, body = daemon.call("POST", "/v1/allocations", key)
        assert status == 200, ("answered at once, from addresses already there", body)
    watches = [r for r in api.requests_for("pods") if r.is_watch]
    assert watches and all(f"spec.nodeName={NODE}" in r.field_selector for r in watches)


@pytest.mark.parametrize("manage", ["false", "true"])
def test_a_cordoned_node_changes_no_eni_unless_told_to(
    tmp_path: Path, api: KubeApiServer, started: list[EmbeddedDaemon], manage: str
) -> None:
    """AWS_MANAGE_ENIS_NON_SCHEDULABLE, VPC CNI's meaning: while the node carries
    node.kubernetes.io/unschedulable:NoSchedule the pool neither grows nor shrinks, unless true."""
    api.add_node(NODE, taints=["node.kubernetes.io/unschedulable:NoSchedule"])
    daemon = _start(
        tmp_path,
        api,
        WARM_IP_TARGET="12",
        MINIMUM_IP_TARGET="12",
        AWS_MANAGE_ENIS_NON_SCHEDULABLE=manage,
        IPAMD_POD_AWARE_POOL="off",
        IPAMD_POOL_INTERVAL="0.5",
    )
    started.append(daemon)
    daemon.wait_for("/readyz")

    def total() -> int:
        _, pool = daemon.call("GET", "/v1/pool")
        return sum(int(v) for v in pool["counts"].values())

    if manage == "true":
        _until(lambda: total() >= 12)
        return
    daemon.wait_for_line(r"kube\.pool_held reason='the node is unschedulable'")
    held = total()
    time.sleep(2)  # four pool rounds (IPAMD_POOL_INTERVAL), each of which would grow it to 12
    assert total() == held < 12, "a cordoned node's pool changes nothing"
