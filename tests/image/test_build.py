"""`make image` with Podman on Debian's python3: from scratch, again from the cache, and after a change
to ipamd's code alone, which must not reinstall the dependencies; then the image's own commands."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.deploy.repo import IMAGE_DIR
from tests.image.conftest import Builds, ImageRun
from tests.image.pod import probe
from tests.image.podman import LABEL

IMAGE_BUDGET_MIB = 600
"""What every node pulls. On Debian's python3 the image is about 420 MiB today (docs/operations.md),
most of it boto3's and botocore's data; a jump past this is a dependency or a layer gone wrong."""


def test_a_cached_rebuild_takes_every_step_from_the_cache(builds: Builds) -> None:
    cold = builds.cold.steps()
    assert cold and not any(cached for _, cached in cold), "--no-cache ran every step"
    cached = builds.cached.steps()
    assert [step for step, _ in cached] == [step for step, _ in cold]
    assert all(hit for step, hit in cached if not step.startswith("FROM")), cached
    assert builds.cached.image_id == builds.cold.image_id
    assert builds.cached.seconds < builds.cold.seconds


def test_a_code_change_keeps_the_dependency_layer(builds: Builds) -> None:
    steps = builds.code_change.steps()
    (dependencies,) = [hit for step, hit in steps if "--requirement" in step]
    (project,) = [hit for step, hit in steps if "--no-index" in step]
    assert dependencies, "the dependencies came from the cache"
    assert not project, "ipamd itself was installed again"
    assert builds.code_change.image_id != builds.cached.image_id


def test_the_builders_pip_settings_reach_the_build_as_secrets(
    image_run: ImageRun, builds: Builds, tmp_path: Path
) -> None:
    """`make image` passed what this machine's pip is set up with (deploy/image/pip_build_secrets.py
    decides what) as build secrets, and neither file is anywhere in the image."""
    answer = subprocess.run(
        ["python3", str(IMAGE_DIR / "pip_build_secrets.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    expected = sorted(flag.split(",", 1)[0] for flag in answer.stdout.split())
    (command,) = [
        line for line in builds.cold.log.splitlines() if line.startswith("+ podman build")
    ]
    logged = sorted(
        flag.split(",", 1)[0] for flag in command.split() if flag.startswith("--secret")
    )
    assert logged == expected
    code, out = _run(
        image_run, builds.cached.image, "/", "-xdev", "-name", "pip_c*", entrypoint="find", user="0"
    )
    assert (code, out) == (0, ""), out


def test_the_image_is_within_its_size_budget(image_run: ImageRun, builds: Builds) -> None:
    size = int(image_run.podman.inspect_image(builds.cached.image)["Size"])
    assert size < IMAGE_BUDGET_MIB << 20, f"{size / (1 << 20):.0f} MiB"


def _run(
    image_run: ImageRun, image: str, *command: str, entrypoint: str = "", user: str = ""
) -> tuple[int, str]:
    args = ["run", "--rm", "--network", f"ns:{image_run.netns}"]
    args += ["--user", user] if user else []
    args += ["--label", f"{LABEL}={image_run.name}"]
    if entrypoint:
        args += ["--entrypoint", entrypoint]
    answer = image_run.podman(*args, image, *command, check=False)
    return answer.returncode, answer.stdout + answer.stderr


@pytest.mark.parametrize(
    ("entrypoint", "command", "expected"),
    [
        ("", ["--help"], "usage: ipamd"),
        ("ipamctl", ["--help"], "usage: ipamctl"),
        ("/bin/sh", ["/opt/ipamd/bin/install-cni.sh"], "is not a directory: mount the node's"),
    ],
    ids=["ipamd", "ipamctl", "install-cni-without-its-mount"],
)
def test_the_images_commands_run_as_its_default_user(
    image_run: ImageRun, builds: Builds, entrypoint: str, command: list[str], expected: str
) -> None:
    code, out = _run(image_run, builds.cached.image, *command, entrypoint=entrypoint)
    assert expected in out, out
    assert code == (1 if "/opt/ipamd/bin/install-cni.sh" in command else 0), out
    config = image_run.podman.inspect_image(builds.cached.image)["Config"]
    assert config["User"] == "65532:65532"


def test_the_probe_says_why_when_ipamd_is_not_there(image_run: ImageRun, builds: Builds) -> None:
    first, *rest = probe("ipamd", "readinessProbe")
    code, out = _run(image_run, builds.cached.image, *rest, entrypoint=first)
    assert code == 1, out
    assert "ipamd at /run/ipamd/ipamd.sock" in out, out
