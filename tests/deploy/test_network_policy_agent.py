"""The component deploy/components/network-policy-agent (issue 36): the EKS network-policy agent in
ipamd's pod, as aws-node's pod runs it. The base with the component renders with kubectl's kustomize
and passes `kubernetes-validate --strict`; the agent's container is aws-node's `aws-eks-nodeagent`
(tests/deploy/fixtures/, VPC CNI v1.23.1) but for `--enable-network-policy`; it shares
/var/run/aws-node with ipamd through one volume; it alone holds a service-account token, and its
ClusterRole is the agent's share of aws-node's; the docs' overlay names its image."""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path

import yaml  # type: ignore[import-untyped]

from ipamd.config.settings import SETTINGS
from tests.deploy import upstream
from tests.deploy.repo import (
    DEPLOY,
    KUBERNETES_VERSIONS,
    REPO,
    Doc,
    all_objects,
    daemonset,
    env_of,
)
from tests.deploy.repo import pod_spec as base_pod_spec
from tests.deploy.test_validation import kustomize, needs_kubectl, validate_strict

COMPONENT = DEPLOY / "components" / "network-policy-agent"
OPERATIONS = REPO / "docs" / "operations.md"
AGENT = upstream.AGENT
PLACEHOLDER = "aws-network-policy-agent"
"""The image name the component gives the agent, for an overlay's `images:` to replace."""
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
ENFORCE = "--enable-network-policy=true"
"""The one argument that differs from aws-node's manifest, whose chart defaults it to false."""


def render(tmp_path: Path, **fields: object) -> list[Doc]:
    """The base and the component through an overlay of `tmp_path`, with more kustomization
    fields (`images`, ...)."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(DEPLOY, overlay)],
        "components": [os.path.relpath(COMPONENT, overlay)],
        **fields,
    }
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return kustomize(overlay)


def one(docs: list[Doc], kind: str) -> Doc:
    (found,) = [d for d in docs if d["kind"] == kind]
    return found


def pod(docs: list[Doc]) -> Doc:
    spec: Doc = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    return spec


def containers(spec: Doc) -> dict[str, Doc]:
    return {c["name"]: c for c in spec["containers"]}


def node_mounts(spec: Doc, container: Doc) -> dict[str, tuple[str, Doc, bool]]:
    """A container's mounts of node paths: mount path → (volume name, hostPath, read-only)."""
    volumes = {v["name"]: v for v in spec["volumes"]}
    found: dict[str, tuple[str, Doc, bool]] = {}
    for mount in container["volumeMounts"]:
        host = volumes[mount["name"]].get("hostPath")
        if host is not None:
            found[mount["mountPath"]] = (mount["name"], host, mount.get("readOnly", False))
    return found


def test_the_component_is_a_component_of_a_patch_and_the_rbac() -> None:
    (kustomization,) = yaml.safe_load_all((COMPONENT / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Component"
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1alpha1"
    assert kustomization["resources"] == ["rbac.yaml"]
    (patch,) = kustomization["patches"]
    assert patch["target"]["kind"] == "DaemonSet" and patch["target"]["name"] == "ipamd"
    for name in ("kustomization.yaml", "daemonset-patch.yaml", "rbac.yaml"):
        head = (COMPONENT / name).read_text()[:1500]
        assert "aws/amazon-vpc-cni-k8s v1.23.1" in head, f"{name} cites its source"
        assert "config/master/aws-k8s-cni.yaml" in head, name


@needs_kubectl
def test_base_and_component_render_to_valid_objects(tmp_path: Path) -> None:
    rendered = render(tmp_path)
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in rendered)
    assert kinds == [
        ("ClusterRole", "ipamd-network-policy-agent"),
        ("ClusterRoleBinding", "ipamd-network-policy-agent"),
        ("ConfigMap", "ipamd-config"),
        ("DaemonSet", "ipamd"),
        ("ServiceAccount", "ipamd"),
    ]
    for version in KUBERNETES_VERSIONS:
        for doc in rendered:
            validate_strict(doc, version)


@needs_kubectl
def test_the_component_only_adds_the_agent_and_its_volumes(tmp_path: Path) -> None:
    """ipamd's containers, volumes and everything else of the base are as they were; the agent's
    container comes last, so ipamd stays the pod's default container."""
    rendered = render(tmp_path)
    base = {(d["kind"], d["metadata"]["name"]): d for d in all_objects()}
    for doc in rendered:
        if doc["kind"] in ("ConfigMap", "ServiceAccount"):
            assert doc == base[doc["kind"], doc["metadata"]["name"]]
    ds = copy.deepcopy(one(rendered, "DaemonSet"))
    spec = ds["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["containers"]] == ["ipamd", AGENT]
    spec["containers"].pop()
    added = [v["name"] for v in spec["volumes"][len(base_pod_spec()["volumes"]) :]]
    assert added == ["bpf-pin-path", "network-policy-agent-token"]
    del spec["volumes"][-len(added) :]
    assert ds == daemonset()


@needs_kubectl
def test_the_agent_runs_as_aws_nodes_pod_runs_it(tmp_path: Path) -> None:
    ours = containers(pod(render(tmp_path)))[AGENT]
    theirs = upstream.container(AGENT)
    for field in ("env", "ports", "resources", "securityContext", "imagePullPolicy"):
        assert ours[field] == theirs[field], field
    assert set(ours) == set(theirs), "no field aws-node's container lacks, none missing"
    expected = [ENFORCE if a.startswith("--enable-network-policy=") else a for a in theirs["args"]]
    assert "--enable-network-policy=false" in theirs["args"], "aws-node's manifest: policy off"
    assert ours["args"] == expected
    # The image: a placeholder of the same repository name and tag, for the overlay to name.
    repository, tag = theirs["image"].rsplit(":", 1)
    assert repository.endswith("/amazon/" + PLACEHOLDER)
    assert ours["image"] == f"{PLACEHOLDER}:{tag}"


@needs_kubectl
def test_the_agent_mounts_the_node_paths_aws_nodes_agent_mounts(tmp_path: Path) -> None:
    """The same node directories at the same paths, read-write as there. A volume the agent shares
    with ipamd is ipamd's (`aws-node`, `cni-bin`: DirectoryOrCreate where aws-node gives no type);
    one it alone mounts is aws-node's, name and type included."""
    spec = pod(render(tmp_path))
    ours = node_mounts(spec, containers(spec)[AGENT])
    theirs = node_mounts(upstream.pod_spec(), upstream.container(AGENT))
    assert set(theirs) >= {"/sys/fs/bpf", "/var/run/aws-node", "/var/log/aws-routed-eni"}
    assert set(ours) == set(theirs)
    ipamds = {v["name"] for v in base_pod_spec()["volumes"]}
    for path, (volume, host, read_only) in ours.items():
        their_volume, their_host, their_read_only = theirs[path]
        assert (host["path"], read_only) == (their_host["path"], their_read_only), path
        if volume in ipamds:
            assert host["type"] in ("Directory", "DirectoryOrCreate"), path
        else:
            assert (volume, host) == (their_volume, their_host), path


@needs_kubectl
def test_the_agent_and_ipamd_share_the_socket_directory_through_one_volume(
    tmp_path: Path,
) -> None:
    """The agent asks ipamd's config server on /var/run/aws-node/ipamd.sock at its start and serves
    npa.sock beside it (its paths are fixed): both containers mount the one volume there."""
    spec = pod(render(tmp_path))
    by_path = {
        name: {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        for name, c in containers(spec).items()
    }
    volume = by_path[AGENT]["/var/run/aws-node"]
    assert by_path["ipamd"]["/var/run/aws-node"] == volume
    (hostpath,) = [v["hostPath"] for v in spec["volumes"] if v["name"] == volume]
    assert hostpath["path"] == "/var/run/aws-node"
    ipamd_env = env_of(containers(spec)["ipamd"])
    defaults = {s.env: s.default for s in SETTINGS}
    for setting in ("IPAMD_CONFIG_SERVER_SOCKET", "IPAMD_NETWORK_POLICY_AGENT_SOCKET"):
        path = ipamd_env[setting]["value"]
        assert path == defaults[setting], "the agent's own paths, which it does not let one set"
        assert os.path.dirname(path) == "/var/run/aws-node", setting


@needs_kubectl
def test_only_the_agent_holds_a_service_account_token(tmp_path: Path) -> None:
    """What the kubelet mounts for a pod that automounts its token (a bound token it renews, the
    cluster's CA, the namespace), in the agent's container alone."""
    spec = pod(render(tmp_path))
    assert spec["automountServiceAccountToken"] is False, "ipamd never calls the API server"
    all_containers = spec["containers"] + spec["initContainers"]
    holders = [
        c["name"]
        for c in all_containers
        if any(m["mountPath"] == TOKEN_DIR for m in c.get("volumeMounts", []))
    ]
    assert holders == [AGENT]
    (mount,) = [m for m in containers(spec)[AGENT]["volumeMounts"] if m["mountPath"] == TOKEN_DIR]
    assert mount["readOnly"] is True
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    token, ca, namespace = volume["projected"]["sources"]
    assert token["serviceAccountToken"]["path"] == "token"
    assert ca["configMap"] == {
        "name": "kube-root-ca.crt",
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }
    assert namespace["downwardAPI"]["items"] == [
        {"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}
    ]


@needs_kubectl
def test_the_agents_rbac_is_its_share_of_aws_nodes(tmp_path: Path) -> None:
    """The rules aws-node's ClusterRole has for the agent (PolicyEndpoints, ClusterPolicyEndpoints,
    their API group's discovery), bound to ipamd's ServiceAccount; none of aws-node's own."""
    rendered = render(tmp_path)
    role = one(rendered, "ClusterRole")
    theirs = [
        rule
        for rule in upstream.cluster_role()["rules"]
        if rule.get("apiGroups") == ["networking.k8s.aws"] or "nonResourceURLs" in rule
    ]
    assert len(theirs) == 3
    assert role["rules"] == theirs
    binding = one(rendered, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    account = one(rendered, "ServiceAccount")
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": account["metadata"]["name"],
            "namespace": account["metadata"]["namespace"],
        }
    ]
    assert pod(rendered)["serviceAccountName"] == account["metadata"]["name"]


def docs_yaml(needle: str) -> Doc:
    """The one YAML block of docs/operations.md that holds `needle`."""
    blocks = re.findall(r"^```yaml\n(.*?)^```$", OPERATIONS.read_text(), re.MULTILINE | re.DOTALL)
    (block,) = [b for b in blocks if needle in b]
    loaded: Doc = yaml.safe_load(block)
    return loaded


@needs_kubectl
def test_the_docs_overlay_names_the_agents_image_and_makes_ipamd_strict(tmp_path: Path) -> None:
    """The overlay of docs/operations.md, with a real account and region in its placeholders: the
    agent's image is named, every ipamd container's image is the overlay's, and ipamd calls the
    agent for every pod."""
    overlay = docs_yaml("components/network-policy-agent")
    assert overlay["resources"] == ["../deploy"]
    assert overlay["components"] == ["../deploy/components/network-policy-agent"]
    images = {i["name"]: i for i in overlay["images"]}
    assert images[PLACEHOLDER]["newName"] == (
        "<account>.dkr.ecr.<region>.amazonaws.com/amazon/" + PLACEHOLDER
    )
    registry = "123456789012.dkr.ecr.eu-west-1.amazonaws.com"
    images[PLACEHOLDER] = {
        **images[PLACEHOLDER],
        "newName": images[PLACEHOLDER]["newName"].replace(
            "<account>.dkr.ecr.<region>.amazonaws.com", registry
        ),
    }
    fields = {k: v for k, v in overlay.items() if k not in ("resources", "components")}
    fields["images"] = list(images.values())
    rendered = render(tmp_path, **fields)
    spec = pod(rendered)
    assert containers(spec)[AGENT]["image"] == (
        f"{registry}/amazon/{PLACEHOLDER}:{images[PLACEHOLDER]['newTag']}"
    )
    assert images[PLACEHOLDER]["newTag"] == upstream.container(AGENT)["image"].rsplit(":", 1)[1]
    ipamd = f"{images['ipamd']['newName']}:{images['ipamd']['newTag']}"
    assert {c["image"] for c in spec["containers"] + spec["initContainers"]} == {
        ipamd,
        containers(spec)[AGENT]["image"],
    }
    mode = one(rendered, "ConfigMap")["data"]["NETWORK_POLICY_ENFORCING_MODE"]
    aws_node = {e["name"]: e.get("value") for e in upstream.container("aws-node")["env"]}
    assert mode == aws_node["NETWORK_POLICY_ENFORCING_MODE"] == "standard"


@needs_kubectl
def test_the_docs_ipv6_patch_turns_the_agents_ipv6_on(tmp_path: Path) -> None:
    patch = docs_yaml("--enable-ipv6=true")
    spec = pod(render(tmp_path, **patch))
    args = containers(spec)[AGENT]["args"]
    assert "--enable-ipv6=true" in args and "--enable-ipv6=false" not in args
    assert containers(spec)["ipamd"] == containers(base_pod_spec())["ipamd"]
