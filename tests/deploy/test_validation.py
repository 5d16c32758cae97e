"""Every manifest passes `kubernetes-validate --strict` for Kubernetes 1.29 and 1.37 (its Python API per
document, and its command line on the files), a broken manifest fails it, and the kustomize base
renders, with kubectl's kustomize, to exactly the objects of the files."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml  # type: ignore[import-untyped]

from tests.deploy.repo import (
    DEPLOY,
    KUBERNETES_VERSIONS,
    KUSTOMIZATION,
    MANIFESTS,
    Doc,
    all_objects,
    daemonset,
    dump_documents,
    load_documents,
    parse_documents,
    project,
)

KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(
    KUBECTL is None, reason="kubectl (its built-in kustomize) absent"
)


def validate_strict(doc: Doc, version: str) -> None:
    """Raises kubernetes-validate's ValidationError, or SchemaNotFoundError for a kind it does not
    know (its command line only warns about those, so the tests call the API, which raises)."""
    validated = kubernetes_validate.validate(doc, version, strict=True)
    assert validated == version, f"validated against {validated}, not {version}"


def run_cli(version: str, *files: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "kubernetes_validate", "--strict", "-k", version]
    return subprocess.run(
        [*command, *map(str, files)], capture_output=True, text=True, check=False, timeout=60
    )


def broken_daemonsets() -> dict[str, Doc]:
    """The shipped DaemonSet with one mistake each: a misspelt field (only --strict sees it), a wrong
    type, a missing required field."""
    misspelt = copy.deepcopy(daemonset())
    misspelt["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    wrong_type = copy.deepcopy(daemonset())
    wrong_type["spec"]["template"]["spec"]["hostNetwork"] = "yes"
    no_image = copy.deepcopy(daemonset())
    del no_image["spec"]["template"]["spec"]["containers"][0]["name"]
    return {"misspelt": misspelt, "wrong_type": wrong_type, "no_container_name": no_image}


def test_the_base_holds_the_expected_objects() -> None:
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in all_objects())
    assert kinds == [
        ("ConfigMap", "ipamd-config"),
        ("DaemonSet", "ipamd"),
        ("ServiceAccount", "ipamd"),
    ]
    assert {d["metadata"]["namespace"] for d in all_objects()} == {"kube-system"}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_is_valid_strict(path: Path, version: str) -> None:
    docs = load_documents(path)
    assert docs, f"{path} holds no object"
    for doc in docs:
        validate_strict(doc, version)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_command_line_passes_every_manifest(version: str) -> None:
    result = run_cli(version, *MANIFESTS)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == len(all_objects()), lines
    assert all(line.startswith("INFO") and f"against version {version}" in line for line in lines)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("mistake", sorted(broken_daemonsets()))
def test_a_broken_manifest_fails_strict_validation(mistake: str, version: str) -> None:
    broken = broken_daemonsets()[mistake]
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_strict(broken, version)


def test_strict_is_what_catches_a_misspelt_field() -> None:
    broken = broken_daemonsets()["misspelt"]
    kubernetes_validate.validate(broken, "1.37", strict=False)  # passes without --strict
    with pytest.raises(kubernetes_validate.ValidationError, match="imagePullPolicyy"):
        kubernetes_validate.validate(broken, "1.37", strict=True)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_command_line_fails_a_broken_file(tmp_path: Path, version: str) -> None:
    broken = tmp_path / "daemonset.yaml"
    broken.write_text(dump_documents([broken_daemonsets()["misspelt"]]))
    result = run_cli(version, broken)
    assert result.returncode != 0
    assert "ERROR" in result.stdout and "imagePullPolicyy" in result.stdout


def test_kustomization_lists_exactly_the_manifests() -> None:
    """Only `resources`: `kubectl apply -k deploy/` and `kubectl apply -f` on the files are the same
    objects, and there is no transformer whose rendering these tests would have to trust."""
    (kustomization,) = load_documents(KUSTOMIZATION)
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert kustomization["kind"] == "Kustomization"
    assert set(kustomization) == {"apiVersion", "kind", "resources"}
    assert sorted(kustomization["resources"]) == sorted(p.name for p in MANIFESTS)


def kustomize(directory: Path) -> list[Doc]:
    assert KUBECTL is not None
    result = subprocess.run(
        [KUBECTL, "kustomize", str(directory)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env={**os.environ, "KUBECONFIG": os.devnull},
    )
    assert result.returncode == 0, result.stderr
    return parse_documents(result.stdout)


def key(doc: Doc) -> tuple[str, str]:
    return doc["kind"], doc["metadata"]["name"]


@needs_kubectl
def test_kustomize_renders_the_base_to_the_files_objects() -> None:
    rendered = sorted(kustomize(DEPLOY), key=key)
    assert rendered == sorted(all_objects(), key=key)
    for version in KUBERNETES_VERSIONS:
        for doc in rendered:
            validate_strict(doc, version)


@needs_kubectl
def test_an_overlay_sets_the_image_of_every_container(tmp_path: Path) -> None:
    """The way docs/operations.md tells operators to name their image."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(DEPLOY, overlay)],
        "images": [{"name": "ipamd", "newName": "my-registry/ipamd", "newTag": "9.9.9"}],
    }
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    (ds,) = [d for d in kustomize(overlay) if d["kind"] == "DaemonSet"]
    spec = ds["spec"]["template"]["spec"]
    images = {c["name"]: c["image"] for c in spec["containers"] + spec["initContainers"]}
    assert images == {
        "ipamd": "my-registry/ipamd:9.9.9",
        "install-cni": "my-registry/ipamd:9.9.9",
        "host-sysctls": "my-registry/ipamd:9.9.9",
    }


def test_placeholder_image_is_the_one_make_image_builds() -> None:
    spec = daemonset()["spec"]["template"]["spec"]
    images = {c["image"] for c in spec["containers"] + spec["initContainers"]}
    assert images == {f"ipamd:{project()['version']}"}
