"""The image for a named platform, read without building it (no emulation here): `make image
PLATFORM=...` hands the builder `--platform`, and only then; the Dockerfile and the image's scripts
name no architecture, so the same steps build for amd64 and arm64, the two the DaemonSet runs on;
docs/operations.md publishes both under one name."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.deploy.repo import DOCKERFILE, IMAGE_DIR, REPO, pod_spec

MAKE = shutil.which("make")
ARCH_NAMES = re.compile(r"x86_64|x86-64|amd64|aarch64|arm64|i[3-6]86|-linux-gnu")


def dry_run(*settings: str) -> str:
    """The `image` recipe as make would run it (`make -n`: printed, nothing built)."""
    assert MAKE is not None
    answer = subprocess.run(
        [MAKE, "--no-print-directory", "-n", "-C", str(REPO), "image", *settings],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return re.sub(r"\\\n\s*", " ", answer.stdout)


@pytest.mark.skipif(MAKE is None, reason="make absent")
def test_platform_reaches_the_builder_as_its_flag() -> None:
    recipe = dry_run("PLATFORM=linux/arm64", "CONTAINER_ENGINE=podman")
    assert re.search(r"podman build \S+ --platform linux/arm64 .* -t ipamd:\S+ \.", recipe), recipe


@pytest.mark.skipif(MAKE is None, reason="make absent")
def test_without_platform_the_engine_builds_for_the_machine() -> None:
    """No flag at all: Podman given --platform asks the registry for a base image it has locally."""
    recipe = dry_run()
    assert "docker build" in recipe
    assert "--platform" not in recipe


def code_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.lstrip().startswith("#")]


def test_the_dockerfile_and_the_install_scripts_name_no_architecture() -> None:
    for path in (DOCKERFILE, *sorted(IMAGE_DIR.glob("*.sh"))):
        named = [line for line in code_lines(path.read_text()) if ARCH_NAMES.search(line)]
        assert not named, (path.name, named)


def test_the_documented_platforms_are_the_daemonsets_architectures() -> None:
    (term,) = pod_spec()["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    (arch,) = [e for e in term["matchExpressions"] if e["key"] == "kubernetes.io/arch"]
    platforms = ",".join(f"linux/{a}" for a in arch["values"])
    operations = (REPO / "docs" / "operations.md").read_text()
    assert f"--platform {platforms}" in operations, "docker buildx builds them all at once"
    for a in arch["values"]:
        assert f"PLATFORM=linux/{a}" in operations, a
    assert "podman manifest create" in operations and "podman manifest push" in operations
