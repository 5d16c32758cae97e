"""`ChaosNode`: the world the chaos runner owns around one daemon process.

It owns, in this process: moto's EC2 served on loopback (`EmbeddedEc2("server")`) with one VPC, subnet
and instance; the `Ec2FaultProxy` the daemon talks to instead of moto; the IMDS simulator, reading
moto's live state; the CRI runtime double on a unix socket; and the daemon's state directory, on a
small tmpfs of its own when this process may mount one (root), so that the disk can be filled without
touching anything else. The daemon itself (`DaemonProcess`) runs as a child process pointed at them.

It must not outlive its `async with`: the daemon is stopped, the tmpfs unmounted and the working
directory removed on the way out, whatever happened.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import random
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.vpc.processes import free_port
from chaos.daemon import DaemonProcess, Endpoints, daemon_environment
from chaos.proxy import Ec2FaultProxy
from cloud.embedded.eni_rules import LOCK
from cloud.embedded.imds_sim import ImdsSimulator
from cloud.embedded.world import EmbeddedEc2, World
from datastore.store import STATE_FILE_NAME
from ipamd.runtime.embedded_cri import CriServer

logger = logging.getLogger(__name__)

INSTANCE_TYPE = "m5.large"
REGION = "us-west-2"


@dataclass
class StateDisk:
    """The daemon's state directory; `mounted` when it is a tmpfs of `size_bytes` of its own."""

    path: Path
    mounted: bool
    size_bytes: int
    why_not: str = ""

    @property
    def ballast(self) -> Path:
        return self.path / "ballast"

    def unmount(self) -> None:
        if self.mounted:
            result = _run(["umount", str(self.path)])
            if result.returncode != 0:
                _run(["umount", "-l", str(self.path)])
            self.mounted = False


def mount_state_disk(path: Path, size_bytes: int) -> StateDisk:
    """A tmpfs at `path` when possible (root, `mount` works); otherwise a plain directory."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return StateDisk(path, False, size_bytes, "not root: cannot mount a tmpfs")
    options = f"size={size_bytes},mode=0755"
    result = _run(["mount", "-t", "tmpfs", "-o", options, "chaos-state", str(path)])
    if result.returncode != 0:
        return StateDisk(path, False, size_bytes, f"mount failed: {result.stderr.strip()}")
    return StateDisk(path, True, size_bytes)


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return subprocess.CompletedProcess(argv, 1, "", str(err))


@dataclass
class ChaosNode:
    world: World
    imds: ImdsSimulator
    cri: CriServer
    proxy: Ec2FaultProxy
    disk: StateDisk
    daemon: DaemonProcess
    workdir: Path

    @property
    def state_file(self) -> Path:
        return self.disk.path / STATE_FILE_NAME

    def ec2_addresses(self) -> set[str]:
        """Every address on the instance's ENIs in moto now (secondary IPs and prefixes' addresses)."""
        with LOCK:  # moto is changed from its server's threads: read one consistent state
            instance: Any = self.world.backend().get_instance(self.world.instance_id)
            found: set[str] = set()
            for nic in instance.nics.values():
                found.update(str(e["PrivateIpAddress"]) for e in nic.private_ip_addresses)
                found.update(_prefix_addresses(nic))
        return found


def _prefix_addresses(nic: Any) -> set[str]:
    return {
        str(address)
        for prefix in nic.ipv4_prefixes
        for address in ipaddress.IPv4Network(str(prefix["Ipv4Prefix"]))
    }


@contextlib.asynccontextmanager
async def open_node(*, seed: int, disk_bytes: int) -> AsyncIterator[ChaosNode]:
    """The world and a started daemon (not necessarily ready yet)."""
    # A short directory: unix socket paths are limited to 107 bytes.
    workdir = Path(tempfile.mkdtemp(prefix="ipamd-chaos-", dir="/tmp"))
    async with AsyncExitStack() as stack:
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        host = EmbeddedEc2("server").start()
        stack.callback(host.close)
        world = host.world(INSTANCE_TYPE, region=REGION, seed=seed)
        assert world.endpoint_url is not None
        imds = ImdsSimulator(world, rng=random.Random(seed))
        imds_url = await imds.start()
        stack.push_async_callback(imds.close)
        cri = CriServer(workdir / "cri.sock")
        await cri.start()
        stack.push_async_callback(cri.close)
        proxy = Ec2FaultProxy(world.endpoint_url)
        await proxy.start()
        stack.push_async_callback(proxy.close)
        disk = mount_state_disk(workdir / "state", disk_bytes)
        stack.callback(disk.unmount)
        ends = Endpoints(
            ec2_url=proxy.url,
            imds_url=imds_url,
            region=REGION,
            cri_socket=cri.socket_path,
            state_dir=disk.path,
            socket_path=workdir / "ipamd.sock",
            metrics_port=free_port(),
        )
        daemon = DaemonProcess(ends, daemon_environment(ends, os.environ), workdir / "ipamd.log")
        stack.push_async_callback(daemon.close)
        await daemon.start()
        yield ChaosNode(world, imds, cri, proxy, disk, daemon, workdir)
