"""Fixtures of the end-to-end tests: real CNI plugins, network namespaces, containerd and ipamd.

They need root (network namespaces, veths, containerd) and the packages `.ci/run` installs as root:
containerd, runc, Debian's CNI plugins in /usr/lib/cni, iproute2, gcc with libc6-dev. Without root
they skip; as root, a missing package fails them (only the CNI-plugin tests skip without the plugins).
Work dirs are short paths in the system temp dir (unix socket paths are limited to 107 bytes) and are
removed afterwards; every process and network namespace a fixture makes is gone after it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bench.vpc.pause.image import PAUSE_IMAGE, build_pause_image
from bench.vpc.processes import add_netns, delete_netns, make_workdir
from tests.e2e.support import require, require_root


@pytest.fixture(scope="session", autouse=True)
def _restore_ip_forwarding() -> Iterator[None]:
    """ptp turns IPv4 forwarding on (the node routes its pods' traffic); put it back as it was."""
    knob = Path("/proc/sys/net/ipv4/ip_forward")
    before = knob.read_text() if os.geteuid() == 0 and knob.exists() else None
    yield
    if before is not None and knob.read_text() != before:
        knob.write_text(before)


@pytest.fixture
def netns() -> Iterator[Callable[[], tuple[str, str]]]:
    """Creates network namespaces on demand (`ip netns add`) as `(name, path)`; deletes them all at
    the end of the test."""
    created: list[str] = []

    def make() -> tuple[str, str]:
        name = f"ipamd-e2e-{os.getpid()}-{len(created)}"
        created.append(name)
        return name, add_netns(name)

    try:
        yield make
    finally:
        for name in created:
            delete_netns(name)


@pytest.fixture(scope="session")
def pause_image() -> Iterator[Path]:
    """The pause image as an OCI archive, built once per session."""
    require_root()
    require("gcc")
    workdir = make_workdir("pause")
    try:
        yield build_pause_image(workdir, PAUSE_IMAGE)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
