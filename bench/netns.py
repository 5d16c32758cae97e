"""The network namespaces `bench.plugin`'s interface-mode figure runs in: one standing for the
node's, which the bench's own thread enters for the measuring loop, so that every process it
spawns (the plugin included) starts there; and one per pod, made before each ADD and deleted after.

It owns their creation and removal: whatever fails, every namespace it made is deleted and the
thread is back in the namespace it started in. It configures nothing inside them (the plugin
does) and never touches the machine's own namespace.

Only the calling thread moves: setns(2) acts per thread and a child starts in its parent thread's
namespace, so no `nsenter` stands between the bench and the plugin it times. The daemon, started
before, stays where it was; the plugin reaches it by its unix socket's path, which no network
namespace scopes.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

CLONE_NEWNET = 0x40000000
NETNS_DIR = "/run/netns"
"""Where `ip netns add` bind-mounts a namespace, the path a runtime hands as CNI_NETNS."""


def unavailable() -> str | None:
    """Why the namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "not root (network namespaces and veths need it)"
    if shutil.which("ip") is None:
        return "ip absent (package iproute2)"
    return None


def _setns(fd: int) -> None:
    setns = getattr(os, "setns", None)  # Python 3.12+
    if setns is not None:
        setns(fd, CLONE_NEWNET)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns: {os.strerror(errno)}")


def _add(name: str) -> str:
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True, timeout=30)
    return f"{NETNS_DIR}/{name}"


def _delete(name: str) -> None:
    # Also after a failed `ip netns add`, which may leave its mount point behind.
    subprocess.run(["ip", "netns", "delete", name], check=False, capture_output=True, timeout=30)


class Pods:
    """Makes each pod's namespace; the node's is `node.path`."""

    def __init__(self, prefix: str, node_path: str) -> None:
        self._prefix = prefix
        self._made = 0
        self.node_path = node_path

    @contextmanager
    def pod(self) -> Iterator[str]:
        """A fresh namespace's path (CNI_NETNS) for one ADD; deleted when the block ends."""
        name = f"{self._prefix}-pod-{self._made}"
        self._made += 1
        try:
            yield _add(name)
        finally:
            _delete(name)


@contextmanager
def node_namespace(prefix: str) -> Iterator[Pods]:
    """Creates the node's namespace (lo up), moves the calling thread into it and yields; the
    thread comes back and the namespace is deleted when the block ends, however it ends."""
    prefix = f"{prefix}-{os.getpid()}"
    name = f"{prefix}-node"
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        path = _add(name)
        subprocess.run(
            ["ip", "-n", name, "link", "set", "lo", "up"],
            check=True,
            capture_output=True,
            timeout=30,
        )
        node = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            _setns(node)
        finally:
            os.close(node)
        try:
            yield Pods(prefix, path)
        finally:
            _setns(home)
    finally:
        os.close(home)
        _delete(name)
