"""The component deploy/components/kubernetes-api (issue 39): ipamd with the Kubernetes API on.

- The base with it (and with the network-policy component too) renders with kubectl's kustomize
  and every object passes `kubernetes-validate --strict` for Kubernetes 1.30 (the oldest with
  ValidatingAdmissionPolicy v1 and a node name in pod-bound tokens) and 1.37.
- ipamd's container alone gets a service-account token, in the shape the network-policy component
  gives its agent one, and IPAMD_KUBERNETES=on; nothing else of the base changes.
- The ClusterRole and the Role (Events, in namespace default) are exactly what ipamd calls: the
  requests its client makes to a test API server (tests/support/kube_api.py) for every feature map
  onto their rules, each of which one of them uses, and each rule's comment names its feature.
- The ValidatingAdmissionPolicies' CEL is evaluated (cel-python) on admission requests shaped as
  the API server builds them, around objects as the test API server stored them before and after
  ipamd's own writes (and a few writes ipamd never makes): ipamd's writes to its own node and its
  pods are allowed; to another node or its pods, beyond a taint's removal or the pod-IPs
  annotation, or with a token that names no node, refused; other users' are not matched.
- docs/operations.md's section "The Kubernetes API": its RBAC table is the roles' rules, its overlay
  renders, and Karpenter's startupTaints stanza declares the overlay's IPAMD_STARTUP_TAINT.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import celpy
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml  # type: ignore[import-untyped]
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

from ipamd.config.eniconfig import EniConfig
from ipamd.config.kinds import Taint
from ipamd.config.settings import SETTINGS
from ipamd.kube.client import JSON_PATCH, KubeApi
from ipamd.kube.credentials import SERVICE_ACCOUNT, from_kubeconfig
from ipamd.kube.eniconfigs import EniConfigFollower
from ipamd.kube.node import POD_IPS, NodeObjects
from ipamd.kube.pods import PodWatch
from tests.deploy.repo import DEPLOY, REPO, Doc, all_objects, daemonset, env_of, load_documents
from tests.deploy.repo import pod_spec as base_pod_spec
from tests.deploy.test_validation import kustomize, needs_kubectl, validate_strict
from tests.support.kube_api import KubeApiServer, RecordedRequest

COMPONENT = DEPLOY / "components" / "kubernetes-api"
NETWORK_POLICY = DEPLOY / "components" / "network-policy-agent"
OPERATIONS = REPO / "docs" / "operations.md"
VERSIONS = ("1.30", "1.37")
"""Kubernetes 1.30: ValidatingAdmissionPolicy v1 (GA) and ServiceAccountTokenPodNodeInfo (beta, on
by default); 1.37: the newest kubernetes-validate knows."""
TOKEN_VOLUME = "ipamd-token"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
STARTUP_TAINT = "ipamd.k8s.aws/agent-not-ready:NoSchedule"
CLUSTER_RULES = {
    ("", "nodes", "get"),
    ("", "nodes", "patch"),
    ("", "pods", "get"),
    ("", "pods", "patch"),
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("", "nodes", "list"),
    ("", "nodes", "watch"),
    ("crd.k8s.amazonaws.com", "eniconfigs", "get"),
    ("crd.k8s.amazonaws.com", "eniconfigs", "list"),
    ("crd.k8s.amazonaws.com", "eniconfigs", "watch"),
}
"""(API group, resource, verb) of the ClusterRole: what ipamd calls (ipamd/kube/)."""
EVENTS_NAMESPACE = "default"
EVENT_RULES = {("events.k8s.io", "events", "create")}
"""The Role's, in EVENTS_NAMESPACE: the Events ipamd posts about its node."""
FEATURES = {s.env for s in SETTINGS} | {"MissingIAMPermissions", "InvalidENIConfig"}
"""What a rule's comment names as the feature that needs it: a setting, or an Event's reason."""


def render(tmp_path: Path, *components: Path, **fields: object) -> list[Doc]:
    """The base and `components` (this one by default) through an overlay of `tmp_path`, with more
    kustomization fields."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(DEPLOY, overlay)],
        "components": [os.path.relpath(c, overlay) for c in components or (COMPONENT,)],
        **fields,
    }
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return kustomize(overlay)


def one(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    (found,) = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    return found


def pod(docs: list[Doc]) -> Doc:
    spec: Doc = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    return spec


def containers(spec: Doc) -> dict[str, Doc]:
    return {c["name"]: c for c in spec["containers"] + spec["initContainers"]}


def token_holders(spec: Doc) -> list[str]:
    return [
        c["name"]
        for c in containers(spec).values()
        if any(m["mountPath"] == str(SERVICE_ACCOUNT) for m in c.get("volumeMounts", []))
    ]


def component_objects() -> list[Doc]:
    return [
        doc
        for name in ("rbac.yaml", "admission-policy.yaml")
        for doc in load_documents(COMPONENT / name)
    ]


def policies() -> list[Doc]:
    return [d for d in component_objects() if d["kind"] == "ValidatingAdmissionPolicy"]


def rule_set(role: Doc) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


# -- the component and what it renders to ---------------------------------------------------------


def test_the_component_is_a_patch_the_rbac_and_the_admission_policies() -> None:
    (kustomization,) = load_documents(COMPONENT / "kustomization.yaml")
    assert kustomization["kind"] == "Component"
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1alpha1"
    assert kustomization["resources"] == ["rbac.yaml", "admission-policy.yaml"]
    (patch,) = kustomization["patches"]
    assert patch["target"]["kind"] == "DaemonSet" and patch["target"]["name"] == "ipamd"
    head = (COMPONENT / "admission-policy.yaml").read_text().split("\napiVersion:", 1)[0]
    for page in (
        "https://kubernetes.io/docs/reference/access-authn-authz/validating-admission-policy/",
        "https://kubernetes.io/docs/reference/access-authn-authz/service-accounts-admin/",
        "https://kubernetes.io/docs/reference/command-line-tools-reference/feature-gates/",
    ):
        assert page in head, f"admission-policy.yaml cites {page}"
    assert NODE_NAME_EXTRA in head and "ServiceAccountTokenPodNodeInfo" in head


@needs_kubectl
@pytest.mark.parametrize("with_network_policy", [False, True], ids=["alone", "with-network-policy"])
def test_the_base_and_component_render_to_valid_objects(
    tmp_path: Path, with_network_policy: bool
) -> None:
    extra = (NETWORK_POLICY,) if with_network_policy else ()
    rendered = render(tmp_path, COMPONENT, *extra)
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in rendered)
    expected = [
        ("ClusterRole", "ipamd"),
        ("ClusterRoleBinding", "ipamd"),
        ("ConfigMap", "ipamd-config"),
        ("DaemonSet", "ipamd"),
        ("Role", "ipamd-events"),
        ("RoleBinding", "ipamd-events"),
        ("ServiceAccount", "ipamd"),
        ("ValidatingAdmissionPolicy", "ipamd-node-writes"),
        ("ValidatingAdmissionPolicy", "ipamd-pod-writes"),
        ("ValidatingAdmissionPolicyBinding", "ipamd-node-writes"),
        ("ValidatingAdmissionPolicyBinding", "ipamd-pod-writes"),
    ]
    if with_network_policy:
        expected += [
            ("ClusterRole", "ipamd-network-policy-agent"),
            ("ClusterRoleBinding", "ipamd-network-policy-agent"),
        ]
    assert kinds == sorted(expected)
    for version in VERSIONS:
        for doc in rendered:
            validate_strict(doc, version)
    spec = pod(rendered)
    expected_holders = ["ipamd", "aws-eks-nodeagent"] if with_network_policy else ["ipamd"]
    assert token_holders(spec) == expected_holders, "each its own token, no other container"
    names = [v["name"] for v in spec["volumes"]]
    assert len(names) == len(set(names))


def test_a_broken_policy_fails_validation() -> None:
    """The schemas see the policies' fields: a misspelt one fails, in a policy and a binding."""
    misspelt = copy.deepcopy(policies()[0])
    misspelt["spec"]["validations"][0]["expresion"] = "true"
    binding = copy.deepcopy(
        next(d for d in component_objects() if d["kind"] == "ValidatingAdmissionPolicyBinding")
    )
    binding["spec"]["policyNme"] = binding["spec"].pop("policyName")
    for doc in (misspelt, binding):
        with pytest.raises(kubernetes_validate.ValidationError):
            validate_strict(doc, VERSIONS[-1])


@needs_kubectl
def test_the_component_only_gives_ipamd_a_token_and_the_api(tmp_path: Path) -> None:
    """ipamd's container gains IPAMD_KUBERNETES=on and the token's mount, the pod the token's
    volume; everything else of the base is as it was."""
    rendered = render(tmp_path)
    base = {(d["kind"], d["metadata"]["name"]): d for d in all_objects()}
    for doc in rendered:
        if doc["kind"] in ("ConfigMap", "ServiceAccount"):
            assert doc == base[doc["kind"], doc["metadata"]["name"]]
    ds = copy.deepcopy(one(rendered, "DaemonSet"))
    spec = ds["spec"]["template"]["spec"]
    ipamd = spec["containers"][0]
    assert ipamd["name"] == "ipamd"
    assert ipamd["env"].pop() == {"name": "IPAMD_KUBERNETES", "value": "on"}
    assert ipamd["volumeMounts"].pop() == {
        "name": TOKEN_VOLUME,
        "mountPath": str(SERVICE_ACCOUNT),
        "readOnly": True,
    }
    assert spec["volumes"].pop()["name"] == TOKEN_VOLUME
    assert ds == daemonset()


@needs_kubectl
def test_ipamds_token_is_the_one_the_kubelet_would_mount_as_the_agent_gets_it(
    tmp_path: Path,
) -> None:
    """The projected token, CA and namespace, where ipamd looks for them, the same sources as the
    network-policy component gives its agent; the pod still automounts nothing."""
    spec = pod(render(tmp_path))
    assert spec["automountServiceAccountToken"] is False
    assert token_holders(spec) == ["ipamd"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == TOKEN_VOLUME]
    agent_patch: list[Doc] = yaml.safe_load((NETWORK_POLICY / "daemonset-patch.yaml").read_text())
    (agent_volume,) = [
        op["value"]
        for op in agent_patch
        if op["path"] == "/spec/template/spec/volumes/-" and "projected" in op["value"]
    ]
    assert volume["projected"] == agent_volume["projected"]
    # The files ipamd's credentials read (ipamd/kube/credentials.py).
    token, ca, namespace = volume["projected"]["sources"]
    assert token["serviceAccountToken"]["path"] == "token"
    assert [i["path"] for i in ca["configMap"]["items"]] == ["ca.crt"]
    assert [i["path"] for i in namespace["downwardAPI"]["items"]] == ["namespace"]


@needs_kubectl
def test_ipamd_has_its_node_name_and_the_api_on(tmp_path: Path) -> None:
    ipamd = containers(pod(render(tmp_path)))["ipamd"]
    env = env_of(ipamd)
    assert env["MY_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    (setting,) = [s for s in SETTINGS if s.env == "IPAMD_KUBERNETES"]
    assert setting.kind.parse(env["IPAMD_KUBERNETES"]["value"]) == "on"


# -- RBAC: exactly what ipamd calls ----------------------------------------------------------------


def subjects(docs: list[Doc]) -> list[Doc]:
    account = one(docs, "ServiceAccount")
    return [
        {
            "kind": "ServiceAccount",
            "name": account["metadata"]["name"],
            "namespace": account["metadata"]["namespace"],
        }
    ]


@needs_kubectl
def test_the_roles_are_exactly_what_ipamd_calls_bound_to_its_account(tmp_path: Path) -> None:
    """The ClusterRole: its node, its pods, its ENIConfig; the Role: Events, in the namespace
    ipamd posts them to. Each bound to ipamd's ServiceAccount, the pod's."""
    rendered = render(tmp_path)
    cluster_role, role = one(rendered, "ClusterRole"), one(rendered, "Role")
    assert rule_set(cluster_role) == CLUSTER_RULES
    assert rule_set(role) == EVENT_RULES
    assert role["metadata"]["namespace"] == EVENTS_NAMESPACE
    for granted in (cluster_role, role):
        assert all(set(rule) == {"apiGroups", "resources", "verbs"} for rule in granted["rules"]), (
            "no resourceNames, no nonResourceURLs"
        )
    for binding, granted in (
        (one(rendered, "ClusterRoleBinding"), cluster_role),
        (one(rendered, "RoleBinding"), role),
    ):
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": granted["kind"],
            "name": granted["metadata"]["name"],
        }
        assert binding["metadata"].get("namespace") == granted["metadata"].get("namespace")
        assert binding["subjects"] == subjects(rendered)
    assert pod(rendered)["serviceAccountName"] == subjects(rendered)[0]["name"]


def test_each_rule_names_the_feature_that_needs_it() -> None:
    """The comment above each rule names a setting of ipamd's or an Event's reason (the feature)."""
    text = (COMPONENT / "rbac.yaml").read_text()
    comments = [
        comment
        for document in text.split("\n---\n")
        if "\nrules:\n" in document
        for comment in re.split(
            r"^  - apiGroups:.*$", document.split("\nrules:\n", 1)[1], flags=re.MULTILINE
        )[:-1]
    ]
    rules = [rule for doc in component_objects() if "rules" in doc for rule in doc["rules"]]
    assert len(comments) == len(rules)
    for chunk in comments:
        lines = chunk.rstrip("\n").split("\n")
        at = len(lines)
        while at > 0 and lines[at - 1].startswith("  # "):
            at -= 1
        comment = "\n".join(lines[at:])
        named = set(re.findall(r"[A-Za-z][A-Za-z0-9_]{4,}", comment)) & FEATURES
        assert named, f"a rule without its feature: {comment!r}"


def request_rule(request: RecordedRequest) -> tuple[str, str, str, str]:
    """The namespace ("" for a cluster-scoped object or all namespaces), API group, resource and
    RBAC verb a request to the API server is authorized as."""
    parts = [p for p in request.path.split("/") if p]
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 2:
        namespace, rest = rest[1], rest[2:]
    verb = {"POST": "create"}.get(request.method, request.method.lower())
    if request.method == "GET" and len(rest) == 1:
        verb = "watch" if request.is_watch else "list"
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    return namespace, group, resource, verb


NODE = "ip-10-0-0-10.us-west-2.compute.internal"
OTHER_NODE = "ip-10-0-0-11.us-west-2.compute.internal"
OTHER_TAINT = "example.com/gpu=true:NoSchedule"


async def test_every_request_ipamd_makes_is_one_rule_and_every_rule_is_used(
    tmp_path: Path,
) -> None:
    """Every call of ipamd's to the API (its node's objects, ipamd/kube/node.py, the watch of its
    pods, ipamd/kube/pods.py, and of its Node and ENIConfig, ipamd/kube/eniconfigs.py), as the
    daemon makes them for each feature, against a test API
    server: what it asked is the ClusterRole and the Role, rule for rule."""
    calls = {
        name
        for name, value in vars(NodeObjects).items()
        if not name.startswith("_") and asyncio.iscoroutinefunction(value)
    }
    assert calls == {
        "node",
        "eniconfig",
        "remove_taint",
        "annotate_pod",
        "clear_pod_ips",
        "event",
    }, "a new call of ipamd's: give it its rule in rbac.yaml, and its feature in the docs' table"
    async with KubeApiServer(tmp_path / "kube") as server:
        server.add_node(NODE, taints=[OTHER_TAINT, STARTUP_TAINT])
        server.add_pod("web-0", NODE, namespace="shop")
        server.add_eniconfig("us-west-2a", "subnet-0a1b2c3d4e5f60718")
        api = KubeApi(from_kubeconfig(server.kubeconfig))
        try:
            objects = NodeObjects(api, NODE)
            await objects.node()
            await objects.eniconfig("us-west-2a")
            assert await objects.remove_taint(Taint.parse(STARTUP_TAINT))
            await objects.annotate_pod("shop", "web-0", "10.0.0.5")
            await objects.clear_pod_ips("shop", "web-0", "10.0.0.5")
            await objects.event("Warning", "MissingIAMPermissions", "AssignPrivateIpAddresses", "")
            chosen = EniConfig("us-west-2a", "subnet-0a1b2c3d4e5f60718")
            follower = EniConfigFollower(objects, "", "", chosen, _Catalogue(), _no_event)
            watches = [
                asyncio.create_task(PodWatch(api, NODE).run()),
                asyncio.create_task(follower.run()),
            ]
            try:
                await server.wait_for_watches(3)
            finally:
                for watch in watches:
                    watch.cancel()
                await asyncio.gather(*watches, return_exceptions=True)
        finally:
            await api.close()
        recorded = list(server.requests)
    assert all(r.status is None or r.status < 300 for r in recorded), "a watch still streams"
    asked = {request_rule(r) for r in recorded}
    by_role = {a for a in asked if a[0] == EVENTS_NAMESPACE and a[1:] in EVENT_RULES}
    by_cluster_role = {a for a in asked if a[1:] in CLUSTER_RULES}
    assert asked == by_role | by_cluster_role, "every request is granted"
    assert {a[1:] for a in by_cluster_role} == CLUSTER_RULES, "every rule is used"
    assert {a[1:] for a in by_role} == EVENT_RULES


class _Catalogue:
    def follow_eni_config(self, config: EniConfig, problem: str = "") -> None:
        pass


async def _no_event(note: str) -> None:
    pass


# -- the admission policies, evaluated ------------------------------------------------------------


@cache
def program(expression: str) -> celpy.Runner:
    env = celpy.Environment()
    return env.program(env.compile(expression))


def evaluate(expression: str, activation: dict[str, celtypes.Value]) -> celtypes.Value:
    """The value of a CEL expression; raises CELEvalError when it has none (an error)."""
    result = program(expression).evaluate(activation)
    if isinstance(result, CELEvalError):
        raise result
    return result


@dataclass(frozen=True, slots=True)
class Verdict:
    matched: bool
    refusals: tuple[str, ...] = ()

    @property
    def allowed(self) -> bool:
        return not self.refusals


def _rule_matches(rule: Doc, request: Doc) -> bool:
    resource = request["resource"]
    name = resource["resource"] + (
        f"/{request['subResource']}" if request.get("subResource") else ""
    )
    return (
        resource["group"] in rule["apiGroups"]
        and resource["version"] in rule["apiVersions"]
        and name in rule["resources"]
        and request["operation"] in rule["operations"]
    )


def admit(policy: Doc, request: Doc) -> Verdict:
    """A ValidatingAdmissionPolicy (bound with `Deny`) on an admission request, as the API server
    decides it (the page the policy cites): the request must match `matchConstraints` and every
    match condition (one false: not matched; an error: refused under failurePolicy Fail); then every
    validation that is false or fails to evaluate refuses it, with its message."""
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    constraints = spec["matchConstraints"]
    assert set(constraints) == {"resourceRules"}, "no selector, no exclusion to emulate"
    if not any(_rule_matches(rule, request) for rule in constraints["resourceRules"]):
        return Verdict(matched=False)
    attributes = {k: v for k, v in request.items() if k not in ("object", "oldObject")}
    activation: dict[str, celtypes.Value] = {
        "request": json_to_cel(attributes),
        "object": json_to_cel(request["object"]),
        "oldObject": json_to_cel(request["oldObject"]),
        "params": json_to_cel(None),
        "namespaceObject": json_to_cel(None),
    }
    matched, errors = _match_conditions(spec.get("matchConditions", []), activation)
    if not matched or errors:
        return Verdict(matched=matched, refusals=errors)
    variables = celtypes.MapType()
    activation["variables"] = variables
    for variable in spec.get("variables", []):
        variables[celtypes.StringType(variable["name"])] = evaluate(
            variable["expression"], activation
        )
    return Verdict(matched=True, refusals=_refusals(spec["validations"], activation))


def _match_conditions(
    conditions: list[Doc], activation: dict[str, celtypes.Value]
) -> tuple[bool, tuple[str, ...]]:
    """Whether the request matches (no condition false) and the conditions that failed to
    evaluate."""
    errors: list[str] = []
    for condition in conditions:
        try:
            if not evaluate(condition["expression"], activation):
                return False, ()
        except CELEvalError as err:
            errors.append(f"match condition {condition['name']}: {err}")
    return True, tuple(errors)


def _refusals(validations: list[Doc], activation: dict[str, celtypes.Value]) -> tuple[str, ...]:
    """The messages of the validations that are false or fail to evaluate."""
    refusals: list[str] = []
    for validation in validations:
        try:
            valid = bool(evaluate(validation["expression"], activation))
        except CELEvalError as err:
            refusals.append(f"error: {err}")
            continue
        if not valid:
            message = validation.get("message", "")
            if "messageExpression" in validation:
                message = str(evaluate(validation["messageExpression"], activation))
            refusals.append(message)
    return tuple(refusals)


def decide(request: Doc) -> str:
    """What the component's policies make of `request`: `not matched` (by any), `allowed` (by all
    that match) or `refused: <messages>`."""
    verdicts = [admit(policy, request) for policy in policies()]
    matched = [v for v in verdicts if v.matched]
    if not matched:
        return "not matched"
    refusals = [m for v in matched for m in v.refusals]
    return "allowed" if not refusals else "refused: " + "; ".join(refusals)


def service_account() -> tuple[str, str]:
    (account,) = [d for d in all_objects() if d["kind"] == "ServiceAccount"]
    return account["metadata"]["namespace"], account["metadata"]["name"]


def ipamd_user(node: str | None, *, bound_to_pod: bool = True) -> Doc:
    """ipamd's ServiceAccount as the API server authenticates its token: a token bound to ipamd's
    pod carries the pod and (Kubernetes 1.30+) its node in `extra`; `node=None` is a token bound to
    the pod without the node (1.29), `bound_to_pod=False` a token bound to nothing."""
    namespace, name = service_account()
    extra: dict[str, list[str]] = {}
    if bound_to_pod:
        extra = {
            "authentication.kubernetes.io/credential-id": [
                "JTI=7ee52be0-9045-4653-aa5e-0da57b8dccdc"
            ],
            "authentication.kubernetes.io/pod-name": ["ipamd-x7k2p"],
            "authentication.kubernetes.io/pod-uid": ["e87dbbd6-3d7e-45db-aafb-72b24627dff5"],
        }
        if node is not None:
            extra[NODE_NAME_EXTRA] = [node]
            extra["authentication.kubernetes.io/node-uid"] = [
                "497e9d9a-47aa-4930-b0f6-9f2fb574c8c6"
            ]
    user: Doc = {
        "username": f"system:serviceaccount:{namespace}:{name}",
        "uid": "f8b4161b-2e2b-11e9-86b7-2afc33b31a7e",
        "groups": [
            "system:serviceaccounts",
            f"system:serviceaccounts:{namespace}",
            "system:authenticated",
        ],
    }
    if extra:
        user["extra"] = extra
    return user


CONTROLLER = {
    "username": "system:serviceaccount:kube-system:node-controller",
    "uid": "0c1a1e8e-5a3b-4f57-a9f4-1d6e0c0b4d11",
    "groups": [
        "system:serviceaccounts",
        "system:serviceaccounts:kube-system",
        "system:authenticated",
    ],
}


@dataclass(frozen=True, slots=True)
class Write:
    """One write as the test API server stored it: the object before and after."""

    old: Doc
    new: Doc

    def request(self, user: Doc) -> Doc:
        """The admission request (admission.k8s.io/v1 AdmissionRequest) the API server builds for
        this write sent as a PATCH by `user`: operation UPDATE, the object as patched and as
        stored."""
        kind = self.new["kind"]
        plural = {"Node": "nodes", "Pod": "pods"}[kind]
        meta = self.new["metadata"]
        request: Doc = {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": plural},
            "requestKind": {"group": "", "version": "v1", "kind": kind},
            "requestResource": {"group": "", "version": "v1", "resource": plural},
            "name": meta["name"],
            "operation": "UPDATE",
            "userInfo": user,
            "object": self.new,
            "oldObject": self.old,
            "dryRun": False,
            "options": {"kind": "PatchOptions", "apiVersion": "meta.k8s.io/v1"},
        }
        if "namespace" in meta:
            request["namespace"] = meta["namespace"]
        return request


async def _record(directory: Path) -> dict[str, Write]:
    """ipamd's writes, made by its own client, and writes it never makes, made with that client's
    patch: each as the server stored its object before and after."""
    writes: dict[str, Write] = {}
    async with KubeApiServer(directory) as server:
        server.add_node(NODE, taints=[OTHER_TAINT, STARTUP_TAINT])
        server.add_node(OTHER_NODE, taints=[STARTUP_TAINT])
        server.add_pod("web-0", NODE, namespace="shop")
        server.add_pod("web-1", OTHER_NODE, namespace="shop")
        api = KubeApi(from_kubeconfig(server.kubeconfig))
        ours, theirs = NodeObjects(api, NODE), NodeObjects(api, OTHER_NODE)

        async def node(name: str, write: Any) -> Write:
            old = server.node(name)
            await write
            new = server.node(name)
            assert old is not None and new is not None and old != new
            return Write(old, new)

        async def pod(name: str, write: Any) -> Write:
            old = server.pod("shop", name)
            await write
            new = server.pod("shop", name)
            assert old is not None and new is not None and old != new
            return Write(old, new)

        path = f"/api/v1/nodes/{NODE}"
        pod_path = "/api/v1/namespaces/shop/pods/web-0"
        try:
            startup = Taint.parse(STARTUP_TAINT)
            writes["startup taint removed"] = await node(NODE, ours.remove_taint(startup))
            writes["another node's taint removed"] = await node(
                OTHER_NODE, theirs.remove_taint(startup)
            )
            added = {"key": "example.com/evil", "effect": "NoExecute"}
            writes["a taint added"] = await node(
                NODE,
                api.patch(
                    path, [{"op": "add", "path": "/spec/taints/-", "value": added}], JSON_PATCH
                ),
            )
            writes["a taint changed"] = await node(
                NODE,
                api.patch(
                    path,
                    [{"op": "replace", "path": "/spec/taints/0/effect", "value": "NoExecute"}],
                    JSON_PATCH,
                ),
            )
            writes["a label changed"] = await node(
                NODE, api.patch(path, {"metadata": {"labels": {"example.com/pool": "gpu"}}})
            )
            writes["the node cordoned"] = await node(
                NODE, api.patch(path, {"spec": {"unschedulable": True}})
            )
            writes["pod IPs annotated"] = await pod(
                "web-0", ours.annotate_pod("shop", "web-0", "10.0.0.5")
            )
            writes["pod IPs cleared"] = await pod(
                "web-0", ours.clear_pod_ips("shop", "web-0", "10.0.0.5")
            )
            writes["another node's pod annotated"] = await pod(
                "web-1", ours.annotate_pod("shop", "web-1", "10.0.0.6")
            )
            writes["another annotation"] = await pod(
                "web-0",
                api.patch(pod_path, {"metadata": {"annotations": {"example.com/x": "y"}}}),
            )
            writes["a pod label changed"] = await pod(
                "web-0", api.patch(pod_path, {"metadata": {"labels": {"app": "evil"}}})
            )
        finally:
            await api.close()
    return writes


@pytest.fixture(scope="module")
def writes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Write]]:
    yield asyncio.run(_record(tmp_path_factory.mktemp("kube")))


IPAMD = ipamd_user(NODE)
CASES = [
    # (write, user, what the policies decide)
    ("startup taint removed", IPAMD, "allowed"),
    ("pod IPs annotated", IPAMD, "allowed"),
    ("pod IPs cleared", IPAMD, "allowed"),
    ("another node's taint removed", IPAMD, f"may not change node {OTHER_NODE}"),
    ("another node's pod annotated", IPAMD, "which is not bound to that node"),
    ("a taint added", IPAMD, "never add or change one"),
    ("a taint changed", IPAMD, "never add or change one"),
    ("a label changed", IPAMD, "only a node's spec.taints"),
    ("the node cordoned", IPAMD, "only a node's spec.taints"),
    ("another annotation", IPAMD, "only a pod's vpc.amazonaws.com/pod-ips annotation"),
    ("a pod label changed", IPAMD, "only a pod's vpc.amazonaws.com/pod-ips annotation"),
    ("startup taint removed", ipamd_user(None), "token names no node"),
    ("pod IPs annotated", ipamd_user(None), "token names no node"),
    ("startup taint removed", ipamd_user(None, bound_to_pod=False), "token names no node"),
    ("a taint added", CONTROLLER, "not matched"),
    ("a label changed", CONTROLLER, "not matched"),
    ("another annotation", CONTROLLER, "not matched"),
]


def _case_id(case: tuple[str, Doc, str]) -> str:
    write, user, _ = case
    who = (
        "other user"
        if user is CONTROLLER
        else "no node"
        if NODE_NAME_EXTRA not in user.get("extra", {})
        else "ipamd"
    )
    return f"{write} ({who})"


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_the_policies_on_recorded_writes(
    writes: dict[str, Write], case: tuple[str, Doc, str]
) -> None:
    write, user, expected = case
    decision = decide(writes[write].request(user))
    if expected in ("allowed", "not matched"):
        assert decision == expected
    else:
        assert decision.startswith("refused: ") and expected in decision, decision


def test_the_recorded_writes_are_what_ipamd_sends(writes: dict[str, Write]) -> None:
    """The allowed ones change what ipamd means to change, and only that."""
    removed = writes["startup taint removed"]
    assert [t["key"] for t in removed.old["spec"]["taints"]] == [
        "example.com/gpu",
        "ipamd.k8s.aws/agent-not-ready",
    ]
    assert [t["key"] for t in removed.new["spec"]["taints"]] == ["example.com/gpu"]
    annotated = writes["pod IPs annotated"]
    assert annotated.new["metadata"]["annotations"][POD_IPS] == "10.0.0.5"
    assert writes["pod IPs cleared"].new["metadata"]["annotations"][POD_IPS] == ""


def test_a_node_write_changing_any_field_but_the_taints_is_refused(
    writes: dict[str, Write],
) -> None:
    """Every field an update of a Node can change (ObjectMeta's and NodeSpec's, from Kubernetes
    1.37's schema) is compared: changing any one of them with the taint's removal is refused."""
    schema = _definitions("1.37")
    meta = set(schema["io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"]["properties"])
    spec = set(schema["io.k8s.api.core.v1.NodeSpec"]["properties"])
    # Set by the server, immutable, or read at creation only: an update cannot change them (the
    # managed fields the server rewrites on every write).
    server_side = {
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "selfLink",
        "managedFields",
        "generateName",
    }
    assert server_side <= meta
    (node_policy,) = [p for p in policies() if p["metadata"]["name"] == "ipamd-node-writes"]
    compared = "\n".join(v["expression"] for v in node_policy["spec"]["validations"])
    assert set(re.findall(r"has\(object\.metadata\.(\w+)\)", compared)) == meta - server_side
    assert set(re.findall(r"has\(object\.spec\.(\w+)\)", compared)) == spec
    base = writes["startup taint removed"]
    values: dict[str, Any] = {
        "labels": {"example.com/pool": "gpu"},
        "annotations": {"example.com/note": "x"},
        "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "1234"}],
        "finalizers": ["example.com/hold"],
        "configSource": {"configMap": {"name": "x", "namespace": "kube-system"}},
        "externalID": "i-0123456789abcdef0",
        "podCIDR": "10.244.0.0/24",
        "podCIDRs": ["10.244.0.0/24"],
        "podPreemptionPolicy": "Never",
        "providerID": "aws:///us-west-2a/i-0fffffffffffffff0",
        "unschedulable": True,
    }
    assert set(values) == (meta - server_side) | (spec - {"taints"})
    for field, value in values.items():
        new = copy.deepcopy(base.new)
        new["metadata" if field in meta else "spec"][field] = value
        decision = decide(Write(base.old, new).request(IPAMD))
        assert "only a node's spec.taints" in decision, field


def test_the_policies_name_the_base_service_account() -> None:
    namespace, name = service_account()
    for policy in policies():
        (condition,) = policy["spec"]["matchConditions"]
        assert condition["expression"] == (
            f"request.userInfo.username == 'system:serviceaccount:{namespace}:{name}'"
        )
    bindings = [d for d in component_objects() if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert sorted(b["spec"]["policyName"] for b in bindings) == sorted(
        p["metadata"]["name"] for p in policies()
    )
    assert all(b["spec"]["validationActions"] == ["Deny"] for b in bindings)


def _definitions(version: str) -> dict[str, Any]:
    root = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    path = root / f"v{version}.0-local-strict" / "_definitions.json"
    loaded: dict[str, Any] = json.loads(path.read_text())["$defs"]
    return loaded


# -- docs/operations.md --------------------------------------------------------------------------


def section() -> str:
    text = OPERATIONS.read_text()
    assert "\n## The Kubernetes API\n" in text
    return text.split("\n## The Kubernetes API\n", 1)[1].split("\n## ", 1)[0]


def docs_yaml(needle: str) -> Doc:
    blocks = re.findall(r"^```yaml\n(.*?)^```$", section(), re.MULTILINE | re.DOTALL)
    (block,) = [b for b in blocks if needle in b]
    loaded: Doc = yaml.safe_load(block)
    return loaded


def test_the_docs_rbac_table_is_the_roles_rules() -> None:
    rows = re.findall(r"^\| `(\w+)` \| `([\w.]+)` \| (.+) \|$", section(), re.MULTILINE)
    documented = set()
    for verb, resource, feature in rows:
        plural, _, group = resource.partition(".")
        documented.add((group, plural, verb))
        named = set(re.findall(r"[A-Za-z][A-Za-z0-9_]{4,}", feature)) & FEATURES
        assert named, f"{verb} {resource}: its feature"
    assert documented == CLUSTER_RULES | EVENT_RULES


@needs_kubectl
def test_the_docs_overlay_turns_the_api_on_with_the_startup_taint(tmp_path: Path) -> None:
    overlay = docs_yaml("components/kubernetes-api")
    assert overlay["resources"] == ["../deploy"]
    assert overlay["components"] == ["../deploy/components/kubernetes-api"]
    fields = {k: v for k, v in overlay.items() if k not in ("resources", "components")}
    rendered = render(tmp_path, **fields)
    for doc in rendered:
        validate_strict(doc, VERSIONS[-1])
    data = one(rendered, "ConfigMap")["data"]
    assert data["IPAMD_STARTUP_TAINT"] == STARTUP_TAINT
    assert data["ANNOTATE_POD_IP"] == "true"
    assert env_of(containers(pod(rendered))["ipamd"])["IPAMD_KUBERNETES"]["value"] == "on"


def test_karpenters_startup_taint_is_ipamds() -> None:
    """The NodePool stanza declares, as a startup taint, the taint the overlay has ipamd remove."""
    nodepool = docs_yaml("startupTaints")
    assert nodepool["apiVersion"] == "karpenter.sh/v1" and nodepool["kind"] == "NodePool"
    (declared,) = nodepool["spec"]["template"]["spec"]["startupTaints"]
    assert declared == {"key": "ipamd.k8s.aws/agent-not-ready", "effect": "NoSchedule"}
    patches = docs_yaml("components/kubernetes-api")["patches"]
    text = "\n".join(p["patch"] for p in patches)
    (value,) = re.findall(r"IPAMD_STARTUP_TAINT, value: \"?([^\"}]+)\"?", text)
    assert Taint.parse(value).matches(declared)


def test_without_the_component_the_base_mounts_no_token() -> None:
    """Without the component the API stays off: the base mounts no token (`auto` finds none)."""
    spec = base_pod_spec()
    assert spec["automountServiceAccountToken"] is False
    assert token_holders(spec) == []
    assert "IPAMD_KUBERNETES" not in env_of(containers(spec)["ipamd"])
