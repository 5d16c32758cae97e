"""The `host-sysctls` init container's script, run in a network namespace made here standing for the
node (its /proc/sys/net is the namespace's own): loose reverse-path filtering on the primary
interface, and in IPv6 mode the IPv6 forwarding and router-advertisement knobs too."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from tests.deploy.repo import REPO

SCRIPT = REPO / "deploy" / "image" / "host-sysctls.sh"

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and ip (iproute2)"
    ),
    pytest.mark.timeout(60),
]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def node() -> Iterator[str]:
    name = f"ipamd-sysctls-{os.getpid()}"
    _ip("netns", "add", name)
    try:
        _ip("-n", name, "link", "add", "eth0", "type", "veth", "peer", "name", "vpc0")
        _ip("-n", name, "link", "set", "vpc0", "up")
        _ip("-n", name, "link", "set", "eth0", "up")
        _ip("-n", name, "addr", "add", "10.0.1.5/24", "dev", "eth0")
        _ip("-n", name, "route", "add", "default", "via", "10.0.1.1")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)


def _run(node: str, **env: str) -> str:
    done = subprocess.run(
        ["ip", "netns", "exec", node, "sh", str(SCRIPT)],
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _knob(node: str, path: str) -> str:
    done = subprocess.run(
        ["ip", "netns", "exec", node, "cat", f"/proc/sys/net/{path}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout.strip()


def test_ipv4_mode_sets_loose_rp_filter_and_leaves_ipv6_alone(node: str) -> None:
    _run(node)

    assert _knob(node, "ipv4/conf/eth0/rp_filter") == "2"
    assert _knob(node, "ipv6/conf/all/forwarding") == "0"
    assert _knob(node, "ipv6/conf/eth0/accept_ra") == "1"


def test_ipv6_mode_forwards_ipv6_and_keeps_accepting_router_advertisements(node: str) -> None:
    printed = _run(node, ENABLE_IPv6="true")

    assert _knob(node, "ipv4/conf/eth0/rp_filter") == "2"
    assert _knob(node, "ipv6/conf/eth0/accept_ra") == "2"
    assert _knob(node, "ipv6/conf/all/forwarding") == "1"
    assert "net.ipv6.conf.eth0.accept_ra=2" in printed
