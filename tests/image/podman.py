"""Podman as the image's smoke test drives it, and what the test checks it left alone.

Podman runs with a configuration of the test's own (`CONTAINERS_CONF`, written by `containers_conf`),
not the machine's: runc as the OCI runtime (crun refuses hybrid cgroup hierarchies), cgroupfs (no
systemd needed), and default ulimits no higher than this process's own hard limits (a runtime that
lacks CAP_SYS_RESOURCE cannot raise them, and Podman's defaults for root are above most machines').
Storage is Podman's own.

No container of the test uses a Podman network: the build runs its steps with `--network=host` and
every container joins a network namespace the test made (`--network ns:/run/netns/<name>`), so
neither Podman nor its network backend creates a bridge, a veth or a firewall rule. `HostState` is
what the test compares before and after to prove it: the machine's own network namespace (links,
addresses, routes, rules, nftables and iptables rulesets), Podman's images and containers.
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LABEL = "io.ipamd.test-image"
"""Every container the test starts carries this label (value: the run's name)."""
ULIMIT_CAP = 16384


def containers_conf(path: Path) -> Path:
    """Writes the test's Podman configuration to `path`."""
    limits = []
    for name, which in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
        _, hard = resource.getrlimit(which)
        value = ULIMIT_CAP if hard == resource.RLIM_INFINITY else min(hard, ULIMIT_CAP)
        limits.append(f'"{name}={value}:{value}"')
    path.write_text(
        "# The image smoke test's own Podman configuration (tests/image/podman.py says why).\n"
        "[containers]\n"
        f"default_ulimits = [{', '.join(limits)}]\n"
        "[engine]\n"
        'runtime = "runc"\n'
        'cgroup_manager = "cgroupfs"\n'
        'events_logger = "file"\n'
    )
    return path


@dataclass(frozen=True)
class Podman:
    env: Mapping[str, str]
    """The environment Podman runs in (`CONTAINERS_CONF` set)."""
    run_name: str
    """This run's name: the containers' label value and the images' tag prefix."""

    def __call__(
        self, *args: str, timeout: float = 120, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        answer = subprocess.run(
            ["podman", *args],
            env=dict(self.env),
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and answer.returncode != 0:
            raise AssertionError(
                f"podman {' '.join(args)} exited {answer.returncode}:\n"
                f"{answer.stdout[-4000:]}\n{answer.stderr[-4000:]}"
            )
        return answer

    def image_ids(self) -> set[str]:
        """Every image in Podman's storage, intermediate ones (the layer cache) included."""
        return set(self("images", "--all", "--quiet", "--no-trunc").stdout.split())

    def container_ids(self) -> set[str]:
        """Every container, Podman's and the build's working containers alike."""
        return set(self("ps", "--all", "--external", "--quiet", "--no-trunc").stdout.split())

    def inspect_image(self, image: str) -> dict[str, Any]:
        (found,) = json.loads(self("image", "inspect", image).stdout)
        assert isinstance(found, dict)
        return found

    def remove_containers(self, ids: Sequence[str]) -> None:
        if ids:
            self("rm", "--force", "--volumes", *ids, timeout=120, check=False)

    def remove_images(self, ids: Sequence[str]) -> None:
        """Removes `ids`, children before parents (Podman refuses a parent with a child left)."""
        left = list(ids)
        for _ in range(len(left) + 1):
            if not left:
                return
            self("rmi", "--force", *left, timeout=300, check=False)
            left = [i for i in left if i in self.image_ids()]
        raise AssertionError(f"images the test built could not be removed: {left}")


def _capture(argv: list[str]) -> str:
    if shutil.which(argv[0]) is None:
        return f"({argv[0]} absent)"
    answer = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    return answer.stdout + answer.stderr


HOST_NETNS_VIEWS = (
    ["ip", "-o", "link"],
    ["ip", "-o", "addr"],
    ["ip", "route"],
    ["ip", "-6", "route"],
    ["ip", "rule"],
    ["ip", "-6", "rule"],
    ["nft", "list", "ruleset"],
    ["iptables-save"],
    ["ip6tables-save"],
)
"""How the machine's own network namespace is read (by this process, which runs in it)."""


def without_counters(text: str) -> str:
    # iptables-save prints packet counters and a timestamp line; neither is a change we made.
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    return "\n".join(line.split(" [", 1)[0] if line.startswith(":") else line for line in lines)


@dataclass(frozen=True)
class HostState:
    netns: dict[str, str]
    images: frozenset[str]
    containers: frozenset[str]

    @classmethod
    def read(cls, podman: Podman) -> HostState:
        views = {" ".join(argv): without_counters(_capture(argv)) for argv in HOST_NETNS_VIEWS}
        return cls(views, frozenset(podman.image_ids()), frozenset(podman.container_ids()))

    def differences(self, later: HostState) -> list[str]:
        """What changed from `self` to `later`, one line per view, image or container."""
        found = [
            f"the machine's network namespace changed: `{view}`\nbefore:\n{text}\n"
            f"after:\n{later.netns.get(view, '')}"
            for view, text in self.netns.items()
            if later.netns.get(view) != text
        ]
        found += [f"image left behind: {i}" for i in sorted(later.images - self.images)]
        found += [f"container left behind: {c}" for c in sorted(later.containers - self.containers)]
        return found
