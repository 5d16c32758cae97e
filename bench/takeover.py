"""Taking a node over from aws-node: `ipamd run` started on a node whose aws-node left 250 pods
running, timed from the process's start until `/readyz` answers 200, against the same node's start
with no checkpoint (the floor, measured in the same run on the same machine).

The node is an m5.large in prefix mode on an embedded EC2 and IMDS served from this process: aws-node
left three ENIs of nine /28s each (432 addresses; `AssignPrivateIpAddresses` with a prefix count), a
checkpoint (`vpc-cni-ipam/1`) of 250 pods spread over them, and a CRI runtime (the tests' gRPC
double) listing those 250 sandboxes. Each start is a fresh state directory; the cloud, the checkpoint
and the runtime are the same (the runtime lists the 250 sandboxes in both; the starts interleave,
after one untimed start). What takeover adds is the checkpoint read, the runtime listing and one
commit of 250 allocations and their ENIs' cooldowns; the rest (EC2 reads, the first leak-GC listing)
is in both figures. Host networking is off (`bench.hostnet` prices the rules).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from bench.api import _ready, _request
from bench.timing import median
from bench.vpc.processes import free_port
from chaos.daemon import BIN, Endpoints, daemon_environment
from cloud.embedded.imds_sim import ImdsSimulator
from cloud.embedded.world import EmbeddedEc2, World
from ipamd.runtime.embedded_cri import CriServer
from ipamd.wire import PATH_ALLOCATIONS

PODS = 250
ENIS = 3
PREFIXES_PER_ENI = 9
RUNS = 3
SETTINGS = {
    "ENABLE_PREFIX_DELEGATION": "true",
    "WARM_PREFIX_TARGET": "1",
    "IPAMD_MAX_PODS": "432",
    "IPAMD_HOST_NETWORK": "off",
    "AWS_VPC_K8S_CNI_LOGLEVEL": "warn",
    "DISABLE_INTROSPECTION": "true",
}


async def run(workdir: Path) -> dict[str, float]:
    plain: list[float] = []
    adopted: list[float] = []
    async with _node(workdir) as (world, imds_url, cri):
        checkpoint = _checkpoint(world)
        for n in range(PODS):
            cri.add(f"{n:064x}", namespace="bench", name=f"pod-{n}")
        await _start(workdir, world, imds_url, cri, None)  # untimed: the first start warms caches
        for _ in range(RUNS):  # interleaved, so a machine's slow spell weighs on both alike
            plain.append(await _start(workdir, world, imds_url, cri, None))
            adopted.append(await _start(workdir, world, imds_url, cri, checkpoint))
    takeover, floor = median(adopted), median(plain)
    return {
        "takeover_ms_250_pods": takeover,
        "start_ms_without_takeover": floor,
        "takeover_over_plain_start": takeover / floor,
    }


@contextlib.asynccontextmanager
async def _node(workdir: Path) -> AsyncIterator[tuple[World, str, CriServer]]:
    host = EmbeddedEc2("server").start()
    imds: ImdsSimulator | None = None
    try:
        world = host.world("m5.large", region="us-west-2")
        _aws_node_enis(world)
        imds = ImdsSimulator(world)
        imds_url = await imds.start()
        async with CriServer(workdir / "cri.sock") as cri:
            yield world, imds_url, cri
    finally:
        if imds is not None:
            await imds.close()
        host.close()


def _aws_node_enis(world: World) -> None:
    """What aws-node left in EC2: two more ENIs, nine /28s on each of the three."""
    ec2 = world.client()
    enis = [world.primary_eni_id]
    for device in range(1, ENIS):
        eni = ec2.create_network_interface(
            SubnetId=world.subnet_id,
            Groups=[world.security_group_id],
            Description=f"aws-K8S-{world.instance_id}",
        )["NetworkInterface"]["NetworkInterfaceId"]
        ec2.attach_network_interface(
            NetworkInterfaceId=eni, InstanceId=world.instance_id, DeviceIndex=device
        )
        enis.append(eni)
    for eni in enis:
        ec2.assign_private_ip_addresses(NetworkInterfaceId=eni, Ipv4PrefixCount=PREFIXES_PER_ENI)


def _pod_addresses(world: World) -> list[str]:
    ec2 = world.client()
    found = ec2.describe_network_interfaces(
        Filters=[{"Name": "attachment.instance-id", "Values": [world.instance_id]}]
    )["NetworkInterfaces"]
    addresses = [
        str(a)
        for eni in sorted(found, key=lambda e: e["Attachment"]["DeviceIndex"])
        for p in eni.get("Ipv4Prefixes", [])
        for a in ipaddress.IPv4Network(p["Ipv4Prefix"])
    ]
    if len(addresses) < PODS:
        raise RuntimeError(f"aws-node's ENIs hold {len(addresses)} addresses, fewer than {PODS}")
    return addresses[:PODS]


def _checkpoint(world: World) -> bytes:
    entries: list[dict[str, Any]] = []
    for n, address in enumerate(_pod_addresses(world)):
        entries.append(
            {
                "networkName": "aws-cni",
                "containerID": f"{n:064x}",
                "ifName": "eth0",
                "ipv4": address,
                "allocationTimestamp": time.time_ns(),
                "metadata": {
                    "k8sPodNamespace": "bench",
                    "k8sPodName": f"pod-{n}",
                    "interfacesCount": 1,
                },
            }
        )
    return json.dumps({"version": "vpc-cni-ipam/1", "allocations": entries}).encode()


async def _start(
    workdir: Path, world: World, imds_url: str, cri: CriServer, checkpoint: bytes | None
) -> float:
    """One start of `ipamd run` on a fresh state directory: ms until ready."""
    run_dir = workdir / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    (run_dir / "aws-node").mkdir(parents=True)
    if checkpoint is not None:
        (run_dir / "aws-node" / "ipam.json").write_bytes(checkpoint)
    assert world.endpoint_url is not None
    ends = Endpoints(
        ec2_url=world.endpoint_url,
        imds_url=imds_url,
        region=world.region,
        cri_socket=cri.socket_path,
        state_dir=run_dir / "state",
        socket_path=run_dir / "ipamd.sock",
        metrics_port=free_port(),
    )
    env = {k: v for k, v in (daemon_environment(ends, os.environ) | SETTINGS).items() if v}
    started = time.perf_counter()
    with (workdir / "ipamd.log").open("ab") as log:
        process = await asyncio.create_subprocess_exec(
            str(BIN / "ipamd"),
            "run",
            env=env,
            cwd=str(run_dir),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=log,
        )
    try:
        await _ready(ends.socket_path, process, workdir)
        elapsed = (time.perf_counter() - started) * 1000.0
        if checkpoint is not None:
            await _check_adopted(ends.socket_path)
    finally:
        if process.returncode is None:
            process.terminate()
            await process.wait()
    return elapsed


async def _check_adopted(socket_path: Path) -> None:
    status, body = await _request(socket_path, "GET", PATH_ALLOCATIONS)
    held = [a for a in body.get("allocations", []) if a.get("network") == "aws-cni"]
    if status != 200 or len(held) != PODS:
        raise RuntimeError(f"takeover adopted {len(held)} of {PODS} pods")


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ipamd-bench-takeover-") as tmp:
        for name, value in asyncio.run(run(Path(tmp))).items():
            print(f"{name}: {value:.3f}")
