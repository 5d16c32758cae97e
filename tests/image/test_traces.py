"""Last of the smoke test (files run in name order): once the run has taken down what it made, the
machine is as the run found it: its own network namespace (links, addresses, routes, rules, nftables
and iptables rulesets), Podman's images (the base image stays, cached) and containers."""

from __future__ import annotations

import subprocess

from tests.image.conftest import ImageRun
from tests.image.podman import HostState, Podman


def test_the_run_leaves_the_machine_as_it_found_it(image_run: ImageRun) -> None:
    image_run.close()
    # The run's Podman configuration went with its work directory; listing needs none.
    env = {k: v for k, v in image_run.podman.env.items() if k != "CONTAINERS_CONF"}
    after = HostState.read(Podman(env, image_run.name))
    assert image_run.before.differences(after) == []
    namespaces = subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    assert image_run.netns_name not in namespaces
    assert not image_run.workdir.exists()
