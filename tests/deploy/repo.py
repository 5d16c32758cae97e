"""What the deploy tests read: the manifests, the conflist, the IAM policy and the image's files, as the
repository holds them (never copies)."""

from __future__ import annotations

import importlib.util
import json
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml  # type: ignore[import-untyped]

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
KUSTOMIZATION = DEPLOY / "kustomization.yaml"
MANIFESTS = tuple(sorted(p for p in DEPLOY.glob("*.yaml") if p != KUSTOMIZATION))
"""Every Kubernetes manifest of the base: each YAML file in deploy/ but the kustomization."""
CONFLIST = DEPLOY / "cni" / "10-ipamd.conflist"
IAM_POLICY = DEPLOY / "iam" / "ipamd-policy.json"
IMAGE_DIR = DEPLOY / "image"
DOCKERFILE = REPO / "Dockerfile"
KUBERNETES_VERSIONS = ("1.29", "1.37")
"""The oldest Kubernetes the manifests support and the newest kubernetes-validate knows."""

Doc = dict[str, Any]


def load_documents(path: Path) -> list[Doc]:
    """The YAML documents of a file, empty ones skipped (as kubectl does)."""
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def dump_documents(docs: list[Doc]) -> str:
    text: str = yaml.safe_dump_all(docs, sort_keys=False)
    return text


def parse_documents(text: str) -> list[Doc]:
    return [d for d in yaml.safe_load_all(text) if d]


def all_objects() -> list[Doc]:
    return [doc for path in MANIFESTS for doc in load_documents(path)]


def find(kind: str, name: str) -> Doc:
    matches = [d for d in all_objects() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


def daemonset() -> Doc:
    found: Doc = find("DaemonSet", "ipamd")
    return found


def pod_spec() -> Doc:
    spec: Doc = daemonset()["spec"]["template"]["spec"]
    return spec


def container(name: str) -> Doc:
    spec = pod_spec()
    found: list[Doc] = [
        c for c in spec["containers"] + spec.get("initContainers", []) if c["name"] == name
    ]
    assert len(found) == 1, name
    return found[0]


def env_of(c: Doc) -> dict[str, Doc]:
    return {e["name"]: e for e in c.get("env", [])}


def conflist() -> Doc:
    loaded: Doc = json.loads(CONFLIST.read_text())
    return loaded


def iam_policy() -> Doc:
    loaded: Doc = json.loads(IAM_POLICY.read_text())
    return loaded


def project() -> Doc:
    loaded: Doc = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return loaded


def load_image_script(name: str) -> ModuleType:
    """One of the image's Python scripts (deploy/image/<name>.py) as a module, as it is in the
    repository (they are run by path, not installed)."""
    spec = importlib.util.spec_from_file_location(name, IMAGE_DIR / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
