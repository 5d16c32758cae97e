"""The test API server admits what the real one admits: its cached validators agree with
kubernetes-validate's own `validate`, the ENIConfig CRD is VPC CNI's unchanged, an ENIConfig is
pruned and validated by it, and the seed helpers refuse an invalid object."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest

from bench.kube_api.kinds import PODS
from bench.kube_api.objects import (
    bulk_eniconfigs,
    bulk_pods,
    eniconfig_object,
    node_object,
    pod_object,
)
from bench.kube_api.schemas import ENICONFIG_CRD, KUBERNETES_VERSION, Invalid, Schemas
from tests.support.kube_api import KubeApiServer

UPSTREAM_SHA256 = "2451ffecab9465ae87ea2900598372799cfebd92ea4972d0e52eb0eb92da7d3f"
"""charts/aws-vpc-cni/crds/customresourcedefinition.yaml at aws/amazon-vpc-cni-k8s b52188387f2e
(v1.23.1), as `git show` gives it: the fixture's body below its header must hash to it."""


@pytest.fixture(scope="module")
def schemas() -> Schemas:
    return Schemas()


def documents() -> dict[str, dict[str, Any]]:
    pod = pod_object("web", "n1", phase="Running", pod_ip="10.0.0.5", annotations={"a": "b"})
    node = node_object(
        "n1", taints=["ipamd.k8s.aws/agent-not-ready:NoSchedule"], unschedulable=True
    )
    bad_taint = copy.deepcopy(node)
    bad_taint["spec"]["taints"][0].pop("effect")
    misspelt = copy.deepcopy(pod)
    misspelt["spec"]["nodeNmae"] = "n1"
    wrong_type = copy.deepcopy(pod)
    wrong_type["spec"]["hostNetwork"] = "yes"
    return {
        "pod": pod,
        "node": node,
        "bulk pod": bulk_pods(10, nodes=2).obj(3),
        "taint without effect": bad_taint,
        "misspelt field": misspelt,
        "wrong type": wrong_type,
    }


@pytest.mark.parametrize("name", list(documents()))
def test_the_cached_validator_agrees_with_kubernetes_validate(schemas: Schemas, name: str) -> None:
    doc = documents()[name]
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        upstream_ok = True
    except kubernetes_validate.ValidationError:
        upstream_ok = False
    try:
        schemas.admit(doc)
        ours_ok = True
    except Invalid:
        ours_ok = False
    assert ours_ok == upstream_ok
    assert ours_ok == (name in ("pod", "node", "bulk pod"))


def test_the_crd_fixture_is_vpc_cnis_unchanged() -> None:
    text = ENICONFIG_CRD.read_text(encoding="utf-8")
    header, _, body = text.partition("apiVersion: apiextensions.k8s.io/v1\n")
    assert all(line.startswith("#") or not line for line in header.splitlines())
    assert (
        "b52188387f2e" in header
        and "charts/aws-vpc-cni/crds/customresourcedefinition.yaml" in header
    )
    assert (
        hashlib.sha256(("apiVersion: apiextensions.k8s.io/v1\n" + body).encode()).hexdigest()
        == UPSTREAM_SHA256
    )


def test_an_eniconfig_is_pruned_then_validated_by_the_crd(schemas: Schemas) -> None:
    extra = eniconfig_object("us-west-2a", "subnet-0a", ["sg-1"])
    extra["spec"]["unknown"] = "dropped"
    admitted = schemas.admit(extra)
    assert admitted["spec"] == {"subnet": "subnet-0a", "securityGroups": ["sg-1"]}
    assert schemas.admit(bulk_eniconfigs(3).obj(2))["metadata"]["name"] == "bulk-eniconfig-00002"
    for broken, field in (
        ({"securityGroups": ["sg-1"]}, "spec"),
        ({"subnet": 7}, "spec.subnet"),
        ({"subnet": "s", "securityGroups": "sg-1"}, "spec.securityGroups"),
    ):
        with pytest.raises(Invalid) as refused:
            schemas.admit({**extra, "spec": broken})
        assert refused.value.causes[0].field == field
    with pytest.raises(Invalid, match=r"metadata\.labels\.zone"):
        schemas.admit({**extra, "metadata": {"name": "x", "labels": {"zone": 1}}})


async def test_the_seed_helpers_refuse_an_invalid_object_unless_told(
    kube_api: KubeApiServer,
) -> None:
    with pytest.raises(Invalid):
        kube_api.add_node("n1", taints=[{"key": "no-effect"}])
    with pytest.raises(Invalid):
        kube_api.create(
            PODS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": {}}
        )
    stored = kube_api.add_node("n1", taints=[{"key": "no-effect"}], validate=False)
    assert stored["spec"]["taints"] == [{"key": "no-effect"}]
    with pytest.raises(ValueError, match="not a taint"):
        kube_api.add_node("n2", taints=["no-effect"])
