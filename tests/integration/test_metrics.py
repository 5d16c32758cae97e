"""`/metrics` and the introspection endpoint of a real daemon (`ipamd run --embedded`, a separate
process): every metric of docs/operations.md's table is published with its type and labels (the
table is parsed, so the docs cannot drift), and each introspection path answers in VPC CNI's shape.
The daemon is polled with a deadline: there is no event to await in another process."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.test_docs import table_metrics
from tests.integration.test_daemon import Running, _start

KEY = {
    "container_id": "c1",
    "ifname": "eth0",
    "network": "k8s-pod-network",
    "pod": {"namespace": "default", "name": "web-1", "uid": "u1"},
}
NEEDS_AN_EVENT = {
    # Series that appear only once something happened that this run does not provoke.
    "awscni_aws_api_error_count",
    "ipamd_pool_failures_total",
    "ipamd_hostnet_fixes_total",
    "ipamd_network_policy_calls_total",  # no agent beside this run's daemon
    "ipamd_ec2_retries_total",
    "ipamd_reconcile_runs_total",  # the schedule's first rounds may not have run yet
    "awscni_reconcile_count",
}


def http_get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


def introspect(daemon: Running, path: str) -> Any:
    status, body = http_get(daemon.introspection_port, path)
    assert status == 200, body
    return json.loads(body)


def add_until_served(daemon: Running) -> dict[str, Any]:
    """ADD, retried while the warm pool is still filling (503 no_address), as the runtime does."""
    deadline = time.monotonic() + 30
    while True:
        status, added = daemon.call("POST", "/v1/allocations", KEY)
        if status != 503 or added.get("code") != "no_address" or time.monotonic() > deadline:
            assert status == 200, added
            return added
        time.sleep(0.1)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    running = _start(tmp_path_factory.mktemp("daemon"))
    try:
        assert running.wait_for("/readyz") == 200
        yield running
    finally:
        if running.process.poll() is None:
            running.process.kill()
        running.process.communicate()


@pytest.fixture(scope="module")
def served(daemon: Running) -> dict[str, Any]:
    """One ADD served, and a DEL of another container (an unknown one: DEL is idempotent)."""
    added = add_until_served(daemon)
    assert daemon.call("DELETE", "/v1/allocations/gone/eth0?network=k8s-pod-network")[0] == 200
    return added


def scrape(daemon: Running) -> dict[str, Metric]:
    status, body = http_get(daemon.metrics_port, "/metrics")
    assert status == 200
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def test_every_documented_metric_is_published_with_its_labels(
    daemon: Running, served: dict[str, Any]
) -> None:
    documented = table_metrics()
    families = scrape(daemon)
    by_docs_name = {
        name: families.get(name.removesuffix("_total") if kind == "counter" else name)
        for name, (kind, _) in documented.items()
    }
    missing = sorted(name for name, family in by_docs_name.items() if family is None)
    assert not missing, f"documented but not published: {missing}"
    published = {f.name for f in by_docs_name.values() if f is not None}
    assert set(families) == published, "published but not documented"
    for name, (kind, labels) in documented.items():
        family = by_docs_name[name]
        assert family is not None and family.type == kind, name
        if name not in NEEDS_AN_EVENT:
            assert family.samples, f"{name} has no series"
        for sample in family.samples:
            assert set(sample.labels) - {"le", "quantile"} == set(labels), (name, sample)


def test_vpc_cni_metrics_count_what_the_daemon_did(daemon: Running, served: dict[str, Any]) -> None:
    families = scrape(daemon)

    def value(family: str, **labels: str) -> float:
        [found] = [s.value for s in families[family].samples if s.labels == labels]
        return found

    assert value("awscni_add_ip_req_count") >= 1
    assert value("awscni_del_ip_req_count", reason="PodDeleted") == 1
    assert value("awscni_assigned_ip_addresses") == 1
    assert value("awscni_eni_allocated") >= 1
    assert value("awscni_ipamd_action_inprogress", fn="nodeInit") == 0, "ready"
    address = served["ips"][0]["address"]
    assert value("awscni_assigned_ip_per_cidr", cidr=address) == 1
    assert value("awscni_ec2api_req_count", fn="AssignPrivateIpAddresses") >= 1
    ok = {"api": "DescribeNetworkInterfaces", "error": "false", "status": "200"}
    [count] = [
        s.value
        for s in families["awscni_aws_api_latency_ms"].samples
        if s.name.endswith("_count") and s.labels == ok
    ]
    assert count >= 1
    [startup] = [
        s
        for s in families["awscni_ipamd_startup_duration_seconds"].samples
        if s.name.endswith("_count")
    ]
    assert startup.value == 1 and startup.labels["success"] == "true"
    [build] = families["awscni_build_info"].samples
    assert build.value == 1
    assert value("ipamd_max_pods", rule="secondary-ip-formula") == value("awscni_ip_max") == 29


def test_introspection_paths_answer_in_vpc_cni_shapes(
    daemon: Running, served: dict[str, Any]
) -> None:
    root = introspect(daemon, "/")
    assert sorted(root["AvailableCommands"]) == sorted(
        [
            "/v1/enis",
            "/v1/pods",
            "/v1/ipamd-env-settings",
            "/v1/networkutils-env-settings",
            "/v1/max-pods",
        ]
    )
    enis = introspect(daemon, "/v1/enis")
    assert {"TotalIPs", "AssignedIPs", "ENIs"} == set(enis) and enis["AssignedIPs"] == 1
    address = served["ips"][0]["address"].split("/")[0]
    owners = {}
    for eni_id, eni in enis["ENIs"].items():
        assert eni["ID"] == eni_id and isinstance(eni["DeviceNumber"], int)
        assert isinstance(eni["IsPrimary"], bool)
        for cidr, info in eni["AvailableIPv4Cidrs"].items():
            assert info["Cidr"]["IP"] == cidr.split("/")[0]
            for ip, entry in info["IPAddresses"].items():
                assert entry["Address"] == ip
                owners[ip] = entry["IPAMKey"]["containerID"]
    assert owners[address] == "c1"
    assert sum(1 for owner in owners.values() if owner) == 1
    assert len(owners) == enis["TotalIPs"]
    pods = introspect(daemon, "/v1/pods")
    assert pods["web-1_default_c1"]["IP"] == address
    assert pods["web-1_default_c1"]["IPAMKey"]["containerID"] == "c1"
    ipamd = introspect(daemon, "/v1/ipamd-env-settings")
    network = introspect(daemon, "/v1/networkutils-env-settings")
    assert ipamd["INTROSPECTION_BIND_ADDRESS"] == f"127.0.0.1:{daemon.introspection_port}"
    assert ipamd["IPAMD_SOCKET"] == str(daemon.socket_path)
    assert network["IPAMD_HOST_NETWORK"] == "off", "embedded"
    max_pods = introspect(daemon, "/v1/max-pods")
    assert (max_pods["max_pods"], max_pods["max_pods_rule"]) == (29, "secondary-ip-formula")
    assert max_pods["kubelet_config"].startswith("no file at "), "no kubelet on the test machine"
    status, _ = http_get(daemon.introspection_port, "/v1/nothing")
    assert status == 404


def test_a_port_in_use_stops_the_daemon_with_one_line(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        running = _start(tmp_path, INTROSPECTION_BIND_ADDRESS=f"127.0.0.1:{port}")
        try:
            _, stderr = running.process.communicate(timeout=60)
        finally:
            if running.process.poll() is None:
                running.process.kill()
                running.process.communicate()
    assert running.process.returncode == 2, stderr[-3000:]
    assert "Traceback" not in stderr
    line = f"ipamd: cannot listen on 127.0.0.1:{port} (INTROSPECTION_BIND_ADDRESS): "
    assert [x for x in stderr.splitlines() if x.startswith(line)], stderr[-3000:]
    assert not running.socket_path.exists(), "the API socket is closed on the way out"


def test_disabled_introspection_listens_on_nothing(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        running = _start(
            tmp_path, DISABLE_INTROSPECTION="true", INTROSPECTION_BIND_ADDRESS=f"127.0.0.1:{port}"
        )
        try:
            assert running.wait_for("/readyz") == 200, "the held port was never asked for"
        finally:
            running.process.kill()
            running.process.communicate()
