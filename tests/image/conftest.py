"""The image's smoke test: the image built with Podman, then run the way the DaemonSet runs it.

It runs under `make test-image` (tests/image/run.sh), as root, which installs Podman and mmdebstrap
when missing, builds (once, then keeps) the base image of Debian bookworm with python3, and sets
IPAMD_TEST_IMAGE=1 and IPAMD_TEST_IMAGE_BASE. Anywhere else, `make test` included, these tests are
collected and skipped, so the default run never pays for an image build.

`image_run` owns everything the run makes, and takes it all down at the end of the session, or when
test_traces.py asks: the images it built (the layer cache of this run included; the base image is
kept), the network namespace standing in for the node's, and its work directory. Before it makes
anything it reads the machine's state (`HostState`), and test_traces.py checks that the run changed
none of it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.deploy.repo import REPO
from tests.image.podman import HostState, Podman, containers_conf

ENABLED = os.environ.get("IPAMD_TEST_IMAGE") == "1"
FIGURES: dict[str, float] = {}
"""What the run measured (`image_size_mib`, build times in seconds), printed at the end."""
BUILD_TIMEOUT_S = 1200


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    if ENABLED and os.geteuid() == 0:
        return
    reason = (
        "the image smoke test runs under `make test-image`, as root (it builds and runs the image)"
    )
    for item in items:
        if item.path.is_relative_to(here):
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if FIGURES:
        line = " ".join(f"{key}={value:g}" for key, value in FIGURES.items())
        terminalreporter.write_line(f"image: {line}")


@dataclass
class ImageRun:
    """One run of the smoke test: its Podman, its work directory and its node's network namespace."""

    name: str
    workdir: Path
    podman: Podman
    base_image: str
    before: HostState
    netns_name: str = ""
    _stack: ExitStack = field(default_factory=ExitStack)

    @property
    def netns(self) -> Path:
        return Path("/run/netns") / self.netns_name

    def image(self, flavour: str) -> str:
        return f"localhost/ipamd-test:{self.name}-{flavour}"

    def on_close(self, callback: Callable[[], object]) -> None:
        self._stack.callback(callback)

    def close(self) -> None:
        """Takes down everything the run made (idempotent)."""
        self._stack.close()


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def _forget_new_images(run: ImageRun) -> None:
    run.podman.remove_containers(sorted(run.podman.container_ids() - run.before.containers))
    run.podman.remove_images(sorted(run.podman.image_ids() - run.before.images))


@pytest.fixture(scope="session")
def image_run() -> Iterator[ImageRun]:
    base = os.environ.get("IPAMD_TEST_IMAGE_BASE", "")
    assert base, "IPAMD_TEST_IMAGE_BASE names the base image (tests/image/run.sh sets it)"
    assert shutil.which("podman"), "podman is missing: tests/image/run.sh installs it"
    name = f"run{os.getpid()}{secrets.token_hex(2)}"
    # A short path: unix socket paths under it are limited to 107 bytes.
    workdir = Path(tempfile.mkdtemp(prefix="ipamd-img-", dir="/tmp"))
    env = dict(os.environ, CONTAINERS_CONF=str(containers_conf(workdir / "containers.conf")))
    podman = Podman(env, name)
    podman("image", "exists", base)
    run = ImageRun(name, workdir, podman, base, HostState.read(podman))
    run.on_close(lambda: shutil.rmtree(workdir, ignore_errors=True))
    run.on_close(lambda: _forget_new_images(run))
    run.netns_name = f"ipamd-img-{name}"
    _ip("netns", "add", run.netns_name)
    run.on_close(lambda: _ip("netns", "delete", run.netns_name))
    _ip("-n", run.netns_name, "link", "set", "lo", "up")
    try:
        yield run
    finally:
        run.close()


@dataclass(frozen=True)
class Build:
    image: str
    log: str
    seconds: float
    image_id: str

    def steps(self) -> list[tuple[str, bool]]:
        """Each build step's instruction, and whether Podman took it from its layer cache."""
        found: list[tuple[str, bool]] = []
        for line in self.log.splitlines():
            if (
                "STEP " in line
                and ": " in line
                and line.lstrip("[0123456789/] ").startswith("STEP")
            ):
                found.append((line.split(": ", 1)[1], False))
            elif line.startswith("--> Using cache") and found:
                found[-1] = (found[-1][0], True)
        return found


@dataclass(frozen=True)
class Builds:
    cold: Build
    """From scratch (`--no-cache`): every step runs."""
    cached: Build
    """The same context again: every step from the cache. The image the smoke test runs."""
    code_change: Build
    """A context whose only change is in ipamd's code."""


CONTEXT = ("Makefile", "Dockerfile", ".dockerignore")
"""Beside the build context's own entries (.dockerignore's allow list): what `make image` needs."""


def build_context(dest: Path) -> Path:
    """A copy of what `make image` reads from this checkout."""
    dest.mkdir()
    allowed = [
        line[1:].strip("/")
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    ]
    for entry in [*CONTEXT, *allowed]:
        source = REPO / entry
        if source.is_dir():
            shutil.copytree(source, dest / entry, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, dest / entry)
    return dest


def make_image(run: ImageRun, context: Path, image: str, *flags: str) -> Build:
    """`make image` with Podman on the run's base image, as a user would run it."""
    build_flags = " ".join(["--network=host", *flags])
    started = time.monotonic()
    settings = [
        "CONTAINER_ENGINE=podman",
        f"PYTHON_IMAGE={run.base_image}",
        f"IMAGE={image}",
        f"IMAGE_BUILD_FLAGS={build_flags}",
    ]
    answer = subprocess.run(
        ["make", "--no-print-directory", "-C", str(context), "image", *settings],
        env=dict(run.podman.env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    seconds = time.monotonic() - started
    log = answer.stdout + answer.stderr
    assert answer.returncode == 0, f"make image failed:\n{log[-6000:]}"
    image_id = run.podman.inspect_image(image)["Id"]
    return Build(image, log, seconds, str(image_id))


@pytest.fixture(scope="session")
def builds(image_run: ImageRun) -> Builds:
    cold = make_image(image_run, REPO, image_run.image("cold"), "--no-cache")
    cached = make_image(image_run, REPO, image_run.image("smoke"))
    changed = build_context(image_run.workdir / "context")
    init = changed / "ipamd" / "__init__.py"
    init.write_text(init.read_text() + "# a change to ipamd's code alone\n")
    code_change = make_image(image_run, changed, image_run.image("code-change"))
    size = image_run.podman.inspect_image(cached.image)["Size"]
    FIGURES.update(
        image_size_mib=round(int(size) / (1 << 20), 1),
        build_cold_s=round(cold.seconds, 1),
        build_cached_s=round(cached.seconds, 1),
        build_code_change_s=round(code_change.seconds, 1),
    )
    return Builds(cold, cached, code_change)
