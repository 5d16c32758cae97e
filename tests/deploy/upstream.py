"""aws-node as the AWS VPC CNI ships it, for the deploy tests to compare ipamd's manifests against: the
ClusterRole and DaemonSet of aws/amazon-vpc-cni-k8s v1.23.1, config/master/aws-k8s-cni.yaml, kept
unchanged in tests/deploy/fixtures/ (its header cites the commit)."""

from __future__ import annotations

from pathlib import Path

from tests.deploy.repo import Doc, load_documents

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "aws-k8s-cni-v1.23.1.yaml"
AGENT = "aws-eks-nodeagent"
"""The network-policy agent's container in aws-node's pod."""


def _find(kind: str) -> Doc:
    (found,) = [d for d in load_documents(FIXTURE) if d["kind"] == kind]
    assert found["metadata"]["name"] == "aws-node"
    return found


def cluster_role() -> Doc:
    return _find("ClusterRole")


def pod_spec() -> Doc:
    spec: Doc = _find("DaemonSet")["spec"]["template"]["spec"]
    return spec


def container(name: str) -> Doc:
    found: list[Doc] = [c for c in pod_spec()["containers"] if c["name"] == name]
    assert len(found) == 1, name
    return found[0]
