"""Probes of an IPv6 node shared by its tests: the /80s EC2 lists on the primary ENI (asked from
inside the node, where the world's EC2 listens) and counted pings from a namespace."""

from __future__ import annotations

import subprocess
import sys

from bench.vpc.fabric import in_netns
from tests.e2e.vpc.harness import REPO, VpcNode


def ec2_prefixes(node: VpcNode, command: str = "list") -> list[str]:
    """The /80s EC2 lists on the primary ENI (`command` "assign": after giving it one more)."""
    ready = node.world_ready
    argv = [sys.executable, "-m", "tests.e2e.vpc.ec2_ipv6", ready.ec2_url, ready.region]
    argv += [ready.primary_eni_id, command]
    done = subprocess.run(
        in_netns(node.ns.node, *argv),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def ping(netns: str, target: str, *flags: str, count: int = 1) -> int:
    """Echo replies `target` gave to `count` requests sent 0.2 s apart from a namespace's path."""
    argv = ["ping", "-n", "-c", str(count), "-i", "0.2", "-W", "1", *flags, target]
    done = subprocess.run(
        ["nsenter", f"--net={netns}", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    received = [line for line in done.stdout.splitlines() if "packets transmitted" in line]
    return int(received[0].split(",")[1].split()[0]) if received else 0
