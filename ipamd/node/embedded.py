"""The node of `ipamd run --embedded`: the embedded half of the composition root (`ipamd.main`, its only
importer), kept apart so that a production start never loads moto.

It owns what makes a laptop run a node that survives a restart: the embedded cloud kept in the state
directory (`embedded-cloud.json`, see `cloud.embedded.cloud_keeper`: restored on the next start with the
same instance, ENIs, MACs and addresses, so the daemon's restore finds its own instance and quarantines
nothing), the IMDS simulator, the embedded container runtime (`ipamd.runtime.embedded_runtime`), and
the hints printed once ready.

The runtime's sandboxes are the pods the node's ADDs started: each ADD ipamd answers is told to it
with the pod's addresses, and each DEL (`RuntimePods`), as a real runtime learns its pods' IPs from
its CNI ADD. It keeps them in a record of its own beside its socket (`.run/ipamd-cri/sandboxes.json`),
apart from ipamd's state directory as containerd's is, so a lost state file is rebuilt from EC2 and
the runtime with every pod (docs/operations.md's runbook, rehearsed on this node), less those named
in the *gone file*: pods that vanished behind ipamd's back.

It must not touch the machine's network (the host datapath stays off under `--embedded` unless
IPAMD_HOST_NETWORK says otherwise, and that is `main`'s call), and it reads the engine's state only
once, to give a runtime with no record yet the pods ipamd holds; it never changes it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import os
import secrets
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cloud.embedded.cloud_file import CloudFileError
from cloud.embedded.cloud_keeper import CLOUD_FILE, start_kept_world
from cloud.embedded.imds_sim import ImdsSimulator
from cloud.embedded.world import World
from cloud.embedded.world_layout import CNI_ROLE_TAG, Layout, LayoutError, SubnetSpec
from datastore.records import AllocationKey, AllocationRecord
from ipamd.config.kinds import HostPort
from ipamd.config.settings import Config
from ipamd.engine.engine import Engine, PodAddresses
from ipamd.errors import SettingUnusable, StateUnusable, os_reason
from ipamd.model import PodRef
from ipamd.runtime.embedded_cri import CriSandbox, to_ns
from ipamd.runtime.embedded_runtime import RECORD_FILE, EmbeddedCri, SandboxRecordError
from ipamd.unix_socket import MAX_SOCKET_PATH, SocketPathError

GONE_FILE: Final = "embedded-cri-gone"
"""In the state directory: sandbox IDs, one a line, of pods that vanished behind ipamd's back; the
embedded runtime forgets them."""


@dataclass
class EmbeddedNode:
    world: World
    imds_url: str
    state_dir: Path
    runtime: EmbeddedCri | None
    """None when IPAMD_CRI_SOCKET names a runtime of the user's own."""
    restored: bool

    def how_to_try(self, config: Config, listening: Mapping[str, HostPort]) -> str:
        return how_to_try(config, self, listening)

    def how_to_repair(self, config: Config) -> str:
        """For a node that is not ready (an unusable state file): the exact repair command."""
        socket = absolute(config.endpoints.socket_path)
        ipamctl = f"{os.path.dirname(sys.executable)}/ipamctl --socket {socket}"
        return (
            f"ipamd: not ready. `{ipamctl} repair` shows how the state file would be rebuilt from "
            "the cloud and the runtime; `--apply` rebuilds it, and ipamd exits to be started again."
        )

    def runtime_pods(self, engine: Engine, pods: PodAddresses) -> PodAddresses:
        """ADD and DEL as the API serves them, told to the embedded runtime (`RuntimePods`). A
        runtime with no record yet (a node made before it kept one) first records the pods ipamd
        holds, so that a restart keeps them."""
        runtime = self.runtime
        if runtime is None:
            return pods
        if not runtime.kept and engine.unavailable is None:
            runtime.adopt(held_sandboxes(engine))
        return RuntimePods(pods, runtime)


async def start_embedded(
    config: Config, stack: AsyncExitStack, *, own_runtime: bool
) -> EmbeddedNode:
    """The kept cloud, its IMDS and (with `own_runtime`) the embedded CRI, each closed by `stack`.
    Call with the state directory locked. Raises `StateUnusable` (a cloud file that cannot be read
    or rebuilt) or `SettingUnusable` (the runtime's socket cannot be served)."""
    state_dir = absolute(config.storage.state_dir)
    cloud_path = state_dir / CLOUD_FILE
    try:
        kept = start_kept_world(
            cloud_path,
            config.embedded.instance_type,
            config.ec2.region or "us-west-2",
            layout=world_layout(config),
        )
    except CloudFileError as err:
        raise StateUnusable(f"{err}; move it aside to start a new node") from err
    except LayoutError as err:
        raise SettingUnusable(f"IPAMD_EMBEDDED_POD_SUBNET: {err}") from err
    stack.callback(kept.close)
    world = kept.world
    simulator = ImdsSimulator(world)
    imds_url = await simulator.start()
    stack.push_async_callback(simulator.close)
    origin = f"restored from {cloud_path}" if kept.restored else f"new, kept in {cloud_path}"
    print(
        f"ipamd: embedded cloud ({origin}): EC2 at {world.endpoint_url}, IMDS at {imds_url}, "
        f"instance {world.instance_id} ({world.instance_type}) in {world.subnet_cidr}",
        file=sys.stderr,
    )
    for subnet in world.subnets:
        tags = ",".join(f"{k}={v}" for k, v in sorted(subnet.tags.items()))
        print(
            f"ipamd: embedded cloud: subnet {subnet.subnet_id} {subnet.cidr} in "
            f"{subnet.availability_zone}" + (f" tagged {tags}" if tags else ""),
            file=sys.stderr,
        )
    for note in kept.notes:
        print(f"ipamd: {note}", file=sys.stderr)
    runtime = await _runtime(config, state_dir, stack) if own_runtime else None
    return EmbeddedNode(world, imds_url, state_dir, runtime, kept.restored)


def world_layout(config: Config) -> Layout | None:
    """The embedded world's layout: the pod subnet's (IPAMD_EMBEDDED_POD_SUBNET), with IPv6 CIDR
    blocks on the VPC and its subnets when the node runs IPv6 mode (ENABLE_IPv6)."""
    layout = pod_subnet_layout(config.embedded.pod_subnet)
    if not config.family.enable_ipv6:
        return layout
    return dataclasses.replace(layout or Layout(), ipv6=True)


def pod_subnet_layout(cidr: str | None) -> Layout | None:
    """IPAMD_EMBEDDED_POD_SUBNET as a layout: its /16 (or itself, if larger) as a secondary CIDR
    block of the VPC, and the subnet in the node's zone, tagged for subnet discovery."""
    if cidr is None:
        return None
    net = ipaddress.IPv4Network(cidr)
    block = net.supernet(new_prefix=16) if net.prefixlen > 16 else net
    return Layout(
        secondary_cidrs=(str(block),), subnets=(SubnetSpec(cidr, tags={CNI_ROLE_TAG: "1"}),)
    )


def absolute(path: str) -> Path:
    """`path` against the working directory, as the hints print it (start-up only: reads the cwd)."""
    return Path(os.path.abspath(path))


def cri_socket_path(config: Config) -> Path:
    """The embedded runtime's socket, IPAMD_CRI_SOCKET's default under `--embedded`: beside the
    API's, named after it (`ipamd.sock` → `ipamd-cri.sock`), so two nodes with sockets side by side
    do not share one."""
    api = absolute(config.endpoints.socket_path)
    return api.with_name(f"{api.stem}-cri.sock")


def runtime_record_path(cri_socket: Path) -> Path:
    """The embedded runtime's record of its sandboxes, in a directory of its own beside its socket
    and named after it (`ipamd-cri.sock` → `ipamd-cri/sandboxes.json`)."""
    return cri_socket.with_suffix("") / RECORD_FILE


async def _runtime(config: Config, state_dir: Path, stack: AsyncExitStack) -> EmbeddedCri:
    path = Path(config.runtime.cri_socket_path)  # `main` set it to `cri_socket_path()`
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise SettingUnusable(
            f"the embedded runtime's socket {path} is longer than {MAX_SOCKET_PATH} bytes "
            "(IPAMD_SOCKET: use a shorter path, or set IPAMD_CRI_SOCKET)"
        )
    runtime = EmbeddedCri(path, runtime_record_path(path), state_dir / GONE_FILE)
    try:
        await runtime.start()
    except SocketPathError as err:
        raise SettingUnusable(f"cannot serve the embedded runtime: {err}") from err
    except OSError as err:
        raise SettingUnusable(
            f"cannot serve the embedded runtime on {path} (beside IPAMD_SOCKET): {os_reason(err)}"
        ) from err
    stack.push_async_callback(runtime.close)
    try:
        runtime.load()  # once bound: a socket path in the way is IPAMD_SOCKET's refusal, above
    except SandboxRecordError as err:
        raise StateUnusable(f"{err}; move it aside to start the runtime without its pods") from err
    return runtime


def held_sandboxes(engine: Engine) -> list[CriSandbox]:
    """One sandbox per container ID that holds an allocation (a pod with two interfaces is one
    sandbox), created when its first allocation was: what a runtime with no record yet adopts."""
    found: dict[str, CriSandbox] = {}
    for alloc in engine.state.allocations().values():
        cid = alloc.key.container_id
        had = found.get(cid)
        created_ns = to_ns(alloc.created_at)
        found[cid] = CriSandbox(
            sandbox_id=cid,
            created_at_ns=min(created_ns, had.created_at_ns) if had else created_ns,
            namespace=alloc.pod_namespace or (had.namespace if had else ""),
            name=alloc.pod_name or (had.name if had else ""),
            uid=alloc.pod_uid or (had.uid if had else ""),
            addresses=(*(had.addresses if had else ()), *alloc.addresses),
        )
    return list(found.values())


class RuntimePods:
    """ADD and DEL as the API serves them on the embedded node, told to its runtime: a sandbox is
    recorded with the addresses its ADD was answered with, and forgotten once its DEL was sent,
    whatever ipamd answered (the plugin reports a DEL ipamd could not do as done, and the runtime
    tears the pod down). One container's ADDs and DELs take turns, so the runtime hears them in the
    order ipamd answered them."""

    def __init__(self, inner: PodAddresses, runtime: EmbeddedCri) -> None:
        self._inner = inner
        self._runtime = runtime
        self._turns: dict[str, tuple[asyncio.Lock, int]] = {}

    async def add(self, key: AllocationKey, pod: PodRef | None) -> AllocationRecord:
        async with self._turn(key.container_id):
            record = await self._inner.add(key, pod)
            self._runtime.started(key.container_id, record.addresses, record.created_at, pod)
            return record

    async def release(self, key: AllocationKey) -> tuple[AllocationRecord, ...]:
        async with self._turn(key.container_id):
            try:
                return await self._inner.release(key)
            finally:
                self._runtime.remove(key.container_id)

    @asynccontextmanager
    async def _turn(self, container_id: str) -> AsyncIterator[None]:
        lock, users = self._turns.get(container_id, (asyncio.Lock(), 0))
        self._turns[container_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._turns[container_id]
            if users == 1:
                del self._turns[container_id]
            else:
                self._turns[container_id] = (lock, users - 1)


def how_to_try(config: Config, node: EmbeddedNode, listening: Mapping[str, HostPort]) -> str:
    """Steps a new user can paste once ready, one command a line, in an order where each still
    finds what it acts on: a pod ADDed and DELeted (which leaves a delete intent on its container
    ID), then, with the embedded runtime, another pod ADDed, made to vanish and released by repair.
    Absolute paths, the scripts next to this interpreter, and container IDs of this run's own (a
    second run on the same state directory would otherwise meet the first run's pods, or their
    delete intents); then where the metrics and introspection endpoints listen (`listening`, by
    setting), saying so when a port was taken."""
    bin_dir = os.path.dirname(sys.executable)
    sock = os.path.abspath(config.endpoints.socket_path)
    ipamctl = f"{bin_dir}/ipamctl --socket {sock}"
    pod = f"demo-{secrets.token_hex(3)}"
    vanishing = f"{pod}-vanishes"
    conf = (
        '{"cniVersion":"1.1.0","name":"k8s-pod-network",'
        f'"ipam":{{"type":"ipamd-cni","socket":"{sock}"}}}}'
    )

    def cni(command: str, container: str) -> str:
        return (
            f"    echo '{conf}' | CNI_COMMAND={command} CNI_CONTAINERID={container} "
            f"CNI_NETNS=/var/run/netns/{container} CNI_IFNAME=eth0 CNI_PATH=/opt/cni/bin "
            f"{bin_dir}/ipamd-cni"
        )

    lines = [
        "ipamd: ready. Try these in another terminal, in this order:",
        "  The node: ready or not, its ENIs and addresses.",
        f"    {ipamctl} status",
        f"  A pod's ADD: its address is in the answer (code 11 while the warm pool fills: run it "
        f"again); then {pod} holds it.",
        cni("ADD", pod),
        f"    {ipamctl} allocations",
        f"  Its DEL: the address goes back to the pool; the delete intent it leaves refuses a late "
        f"ADD of {pod} for IPAMD_DELETE_INTENT_TTL ({config.engine.delete_intent_ttl_s:g} s).",
        cni("DEL", pod),
        f"    {ipamctl} intents",
    ]
    if node.runtime is not None:
        lines += [
            f"  Another pod, ADDed, then made to vanish behind ipamd's back (its DEL never sent): "
            f"the runtime forgets {vanishing}, ipamd still holds its address.",
            cni("ADD", vanishing),
            f"    echo {vanishing} >> {node.runtime.gone_file}",
            f"  Repair shows its release, then --apply does it (the leak GC does it alone after "
            f"IPAMD_LEAK_GRACE, {config.runtime.leak_grace_s:g} s, and two listings, "
            f"IPAMD_LEAK_GC_INTERVAL, {config.runtime.leak_gc_interval_s:g} s).",
            f"    {ipamctl} repair",
            f"    {ipamctl} repair --apply",
            f"  The embedded runtime (CRI) is at {node.runtime.endpoint}.",
        ]
    lines += _endpoints(config, listening)
    lines.append(
        f"  Ctrl-C stops ipamd; running it again on {node.state_dir} is a restart of this node "
        f"({node.world.instance_id}: same ENIs, addresses and pods)."
    )
    return "\n".join(lines)


def _endpoints(config: Config, listening: Mapping[str, HostPort]) -> list[str]:
    """A line per TCP endpoint served: its URL, and the port it wanted if that one was taken."""
    lines = []
    for name, setting, path, wanted in (
        ("Metrics", "IPAMD_METRICS_ADDR", "/metrics", config.endpoints.metrics_addr),
        (
            "Introspection",
            "INTROSPECTION_BIND_ADDRESS",
            "/v1/enis",
            config.endpoints.introspection_bind_address,
        ),
    ):
        bound = listening.get(setting)
        if bound is None:
            continue
        moved = (
            ""
            if bound.port == wanted.port
            else f" (port {wanted.port} was taken; {setting} sets it)"
        )
        lines.append(f"  {name}: http://{bound}{path}{moved}")
    return lines
