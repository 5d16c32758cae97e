"""The rules ipamd applies to its node's objects, with VPC CNI's meanings: which ENIConfig a node uses
(aws/amazon-vpc-cni-k8s v1.23.1, `pkg/eniconfig/eniconfig.go`, `GetNodeSpecificENIConfigName`), the
startup taint's text, and where the API server is (a kubeconfig, or the pod's service account)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ipamd.config.kinds import Taint
from ipamd.kube.credentials import CredentialsError, find, from_kubeconfig
from ipamd.kube.node import capacity_pods, eniconfig_name

ANN = "k8s.amazonaws.com/eniConfig"


def node(
    labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None
) -> dict[str, object]:
    return {"metadata": {"name": "n1", "labels": labels or {}, "annotations": annotations or {}}}


@pytest.mark.parametrize(
    ("labels", "annotations", "expected"),
    [
        ({}, {}, "default"),
        ({ANN: "by-label"}, {}, "by-label"),
        ({ANN: "by-label"}, {ANN: "by-annotation"}, "by-annotation"),
        (
            {ANN: "by-label", "vpc.amazonaws.com/externalEniConfig": "external"},
            {ANN: "by-annotation"},
            "external",
        ),
        ({"topology.kubernetes.io/zone": "us-west-2a"}, {}, "default"),
    ],
)
def test_the_eniconfig_is_chosen_in_vpc_cnis_order(
    labels: dict[str, str], annotations: dict[str, str], expected: str
) -> None:
    assert eniconfig_name(node(labels, annotations), ANN, ANN) == expected


def test_the_label_and_annotation_keys_are_the_settings() -> None:
    zone = "topology.kubernetes.io/zone"
    n = node({zone: "us-west-2a", ANN: "ignored"}, {"example.com/eni": "annotated"})
    assert eniconfig_name(n, ANN, zone) == "us-west-2a"
    assert eniconfig_name(n, "example.com/eni", zone) == "annotated"


@pytest.mark.parametrize(
    ("text", "key", "value", "effect"),
    [
        (
            "ipamd.k8s.aws/agent-not-ready:NoSchedule",
            "ipamd.k8s.aws/agent-not-ready",
            "",
            "NoSchedule",
        ),
        (
            "node.example.com/cni=starting:NoExecute",
            "node.example.com/cni",
            "starting",
            "NoExecute",
        ),
    ],
)
def test_a_taint_reads_as_kubectl_writes_it(text: str, key: str, value: str, effect: str) -> None:
    taint = Taint.parse(text)
    assert (taint.key, taint.value, taint.effect) == (key, value, effect)
    assert str(taint) == text
    assert taint.matches({"key": key, "value": value or None, "effect": effect})
    assert not taint.matches({"key": key, "effect": "PreferNoSchedule"})


@pytest.mark.parametrize("text", ["", "no-effect", "k:Sometimes", "=v:NoSchedule"])
def test_anything_else_is_no_taint(text: str) -> None:
    with pytest.raises(ValueError, match="is no taint"):
        Taint.parse(text)


def test_the_nodes_capacity_gives_max_pods() -> None:
    assert capacity_pods({"status": {"capacity": {"pods": "110"}}}) == 110
    assert capacity_pods({"status": {}}) is None
    assert capacity_pods({"status": {"capacity": {"pods": "many"}}}) is None


def _kubeconfig(tmp_path: Path, *, as_json: bool) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "test",
        "contexts": [{"name": "test", "context": {"cluster": "c", "user": "u"}}],
        "clusters": [
            {"name": "other", "cluster": {"server": "https://elsewhere:6443"}},
            {
                "name": "c",
                "cluster": {"server": "https://127.0.0.1:6443/", "certificate-authority": "ca.crt"},
            },
        ],
        "users": [{"name": "u", "user": {"token": "s3cret"}}],
    }
    path = tmp_path / ("kubeconfig.json" if as_json else "kubeconfig")
    if as_json:
        path.write_text(json.dumps(doc))
    else:
        import yaml  # type: ignore[import-untyped]

        path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("as_json", [True, False])
def test_a_kubeconfigs_current_context_is_read(tmp_path: Path, as_json: bool) -> None:
    creds = from_kubeconfig(_kubeconfig(tmp_path, as_json=as_json))
    assert creds.server == "https://127.0.0.1:6443"
    assert creds.bearer() == "s3cret"
    assert creds.ca_file == str(tmp_path / "ca.crt"), "relative to the kubeconfig"


def test_kubeconfig_wins_and_the_service_account_is_read_afresh(tmp_path: Path) -> None:
    account = tmp_path / "sa"
    account.mkdir()
    (account / "token").write_text("first\n")
    environ = {"KUBERNETES_SERVICE_HOST": "10.100.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    creds = find(environ, account)
    assert creds is not None and creds.server == "https://10.100.0.1:443"
    assert creds.bearer() == "first"
    (account / "token").write_text("rotated\n")
    assert creds.bearer() == "rotated", "a projected token is re-read: the kubelet rotates it"
    config = _kubeconfig(tmp_path, as_json=True)
    chosen = find({**environ, "KUBECONFIG": str(config)}, account)
    assert chosen is not None and chosen.server == "https://127.0.0.1:6443"
    assert find({}, account) is None


def test_an_ipv6_cluster_s_service_host_is_bracketed_in_the_url(tmp_path: Path) -> None:
    """On an IPv6 cluster the kubelet sets KUBERNETES_SERVICE_HOST to the kubernetes Service's IPv6
    ClusterIP, which a URL writes in brackets."""
    (tmp_path / "token").write_text("t\n")
    environ = {"KUBERNETES_SERVICE_HOST": "fd00:10:96::1", "KUBERNETES_SERVICE_PORT": "443"}
    creds = find(environ, tmp_path)
    assert creds is not None and creds.server == "https://[fd00:10:96::1]:443"
    assert (found := find({"KUBERNETES_SERVICE_HOST": "10.100.0.1"}, tmp_path)) is not None
    assert found.server == "https://10.100.0.1:443", "no port given: 443"


def test_a_broken_kubeconfig_says_what_is_wrong(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text('{"current-context": "x", "contexts": []}')
    with pytest.raises(CredentialsError, match="no context named 'x'"):
        from_kubeconfig(path)
