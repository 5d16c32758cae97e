"""The composition root of `ipamd run`: the only place that builds concrete adapters.

`run` builds the EC2 adapter, the IMDS client, the CRI client and the network-policy agent's client
(on the embedded cloud with `ipamd.node.embedded`, its other half), hands them to
`ipamd.node.daemon`, serves the local API and the agent's config server on their unix sockets, and
runs the pool manager and the reconcile schedule in one task group until `stop` is set: then it
stops taking work, lets in-flight requests finish, and returns 0 (`daemon.stopped reason=signal`).
Argument parsing, signals and the exit codes' meanings are `ipamd.main`'s.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys
import time
from contextlib import AsyncExitStack
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from cloud.ec2 import Boto3Ec2, client_config, make_client
from cloud.errors import CloudError
from cloud.imds import DEFAULT_BASE_URL, Imdsv2Client
from ipamd.api.app import EngineOnly, create_app
from ipamd.api.server import App, Runner, serve_unix
from ipamd.api.views import POD_GATEWAY
from ipamd.awsnode.checkpoint import CheckpointFile
from ipamd.awsnode.keeper import CheckpointedPods
from ipamd.clock import SystemClock
from ipamd.config.kinds import HostPort
from ipamd.config.settings import Config
from ipamd.engine.engine import PodAddresses
from ipamd.errors import SettingUnusable, StartupError, os_reason
from ipamd.kube import kube_node
from ipamd.kube.kube_node import KubeNode
from ipamd.netpolicy.agent import GrpcPolicyAgent
from ipamd.netpolicy.config_server import ConfigServer, read_agent_config
from ipamd.netpolicy.enforcement import NetworkPolicy
from ipamd.node import conflist
from ipamd.node.daemon import Daemon, HostNetAdapters, build_daemon, repair
from ipamd.node.family import family_of
from ipamd.node.report import max_pods_report, metric_sources, pool_report
from ipamd.node.startup import lock_state_dir
from ipamd.runtime.cri import GrpcCriRuntime
from ipamd.telemetry.endpoint import (
    ListenFailed,
    latency_middleware,
    listening_on,
    serve_metrics,
)
from ipamd.telemetry.introspection import serve_introspection
from ipamd.telemetry.metrics import Recorders
from ipamd.unix_socket import SocketPathError

if TYPE_CHECKING:
    from ipamd.node.embedded import EmbeddedNode

logger = logging.getLogger("ipamd")

EXIT_CONFIG = 2  # also a setting this machine refuses: a port in use, a path that cannot be made
EXIT_STATE = 3  # the state directory is another ipamd's, or its embedded cloud cannot be rebuilt
EXIT_FAILED = 1
EXIT_RESTART = 75  # EX_TEMPFAIL: the supervisor (kubelet) starts ipamd again on the rebuilt state

METRICS_ADDR = "IPAMD_METRICS_ADDR"
INTROSPECTION_ADDR = "INTROSPECTION_BIND_ADDRESS"


async def _cloud(
    config: Config,
    embedded: bool,
    stack: AsyncExitStack,
    recorders: Recorders,
    *,
    own_runtime: bool = False,
) -> tuple[Boto3Ec2, str, EmbeddedNode | None]:
    """The EC2 adapter, the IMDS base URL and, embedded, the node around them: real AWS, or the
    embedded cloud kept in the state directory (lock it first). Raises `StartupError`."""
    if not embedded:
        region = config.ec2.region or os.environ.get("AWS_DEFAULT_REGION")
        if region is None:
            async with Imdsv2Client(config.ec2.imds_endpoint or DEFAULT_BASE_URL) as imds:
                try:
                    region = (await imds.identity()).region
                except CloudError as err:
                    raise StartupError(f"cannot read the region from IMDS: {err}") from err
        client = make_client(region, config.ec2.endpoint, float(config.ec2.http_timeout_s))
        adapter = Boto3Ec2(client, call_timeout_s=config.ec2.call_timeout_s, recorder=recorders)
        return adapter, config.ec2.imds_endpoint or DEFAULT_BASE_URL, None
    from ipamd.node.embedded import start_embedded  # loads moto: never on a production start

    node = await start_embedded(config, stack, own_runtime=own_runtime)
    client = node.world.client(client_config(float(config.ec2.http_timeout_s)))
    adapter = Boto3Ec2(client, call_timeout_s=config.ec2.call_timeout_s, recorder=recorders)
    return adapter, node.imds_url, node


async def _hostnet(
    config: Config, imds: Imdsv2Client, stack: AsyncExitStack
) -> HostNetAdapters | None:
    """The kernel's adapters when IPAMD_HOST_NETWORK=on (pyroute2 is imported only then)."""
    if config.datapath.host_network != "on":
        lacking = family_of(config).hostnet_off_lacks
        logger.info("hostnet.off reason=IPAMD_HOST_NETWORK=off: pods lack %s", lacking)
        return None
    from ipamd.hostnet.aws_snat import NftAwsNodeSnat
    from ipamd.hostnet.netlink import NetlinkHostNetwork
    from ipamd.hostnet.snat import NftSnatTable
    from ipamd.hostnet.sysctl import read_rp_filter

    host = NetlinkHostNetwork()
    await host.open()
    stack.push_async_callback(host.close)
    return HostNetAdapters(
        host=host,
        snat=NftSnatTable(),
        vpc_cidrs=imds.vpc_cidrs,
        aws_node_snat=NftAwsNodeSnat.installed(),
        rp_filter=read_rp_filter,
    )


async def _serve_api(app: App, path: str) -> Runner:
    try:
        return await serve_unix(app, path)
    except SocketPathError as err:
        raise SettingUnusable(f"cannot serve the API (IPAMD_SOCKET): {err}") from err
    except OSError as err:
        reason = os_reason(err)
        raise SettingUnusable(f"cannot serve the API on {path} (IPAMD_SOCKET): {reason}") from err


def _publish_conflist(config: Config, daemon: Daemon, data: bytes | None) -> Path | None:
    """Write the conflist once ready; with an unusable state file, make sure none is there."""
    if config.conflist.conf_dir is None or config.conflist.template is None or data is None:
        return None
    target = Path(config.conflist.conf_dir) / Path(config.conflist.template).name
    if not daemon.ready:
        conflist.remove(target, "state_unavailable")
        return None
    return conflist.write(target.parent, target.name, data)


async def _kube(
    config: Config, embedded: bool, stack: AsyncExitStack
) -> tuple[KubeNode | None, Config]:
    """The Kubernetes API part (None: not used), closed with `stack`, and `config` with the max
    pods the Node's capacity says where no kubelet config file does."""
    kube = await kube_node.open_for(
        config.kube, config.custom_networking, os.environ, embedded, stack
    )
    if kube is None:
        return None, config
    kubelet = await kube.node_max_pods(config.sizing.kubelet_config)
    return kube, replace(config, sizing=replace(config.sizing, kubelet_config=kubelet))


async def run(
    config: Config,
    embedded: bool,
    stop: asyncio.Event,
    serving: asyncio.Event,
    *,
    own_runtime: bool,
    free_ports: frozenset[str],
) -> int:
    """Start-up and run (`ipamd.main.serve`'s); sets `serving` once started, from which on it
    answers `stop`."""
    started = time.monotonic()
    clock = SystemClock()
    try:
        conflist_bytes = conflist.render_for(config)
    except conflist.ConflistError as err:
        print(f"ipamd: invalid configuration:\n{err}", file=sys.stderr)
        return EXIT_CONFIG
    async with AsyncExitStack() as stack:
        # Before anything opens a file in the state directory (the state file, the embedded
        # cloud's): a second ipamd on it must touch neither.
        stack.callback(lock_state_dir(Path(config.storage.state_dir)).release)
        recorders = Recorders()
        ec2, imds_url, node = await _cloud(
            config, embedded, stack, recorders, own_runtime=own_runtime
        )
        imds = Imdsv2Client(imds_url, ipv6_prefixes=family_of(config).imds_ipv6_prefixes)
        stack.push_async_callback(imds.close)
        runtime = GrpcCriRuntime(config.runtime.cri_socket_path)
        stack.push_async_callback(runtime.close)
        hostnet = await _hostnet(config, imds, stack)
        kube, config = await _kube(config, embedded, stack)
        try:
            daemon = await build_daemon(
                config,
                ec2=ec2,
                imds=imds,
                runtime=runtime,
                addresses=runtime,
                clock=clock,
                hostnet=hostnet,
                checkpoint=CheckpointFile(Path(config.storage.aws_node_checkpoint)),
                eni_config=await kube_node.eni_config_for(kube),
            )
        except CloudError as err:
            raise StartupError(f"cannot read this instance from IMDS and EC2: {err}") from err
        stack.push_async_callback(daemon.close)
        logger.info(
            "pool.max_pods %s", " ".join(f"{k}={v!r}" for k, v in max_pods_report(daemon).items())
        )
        policy, config_server = await _network_policy(config, daemon, imds, stack)
        app = create_app(
            daemon.engine,
            ready=lambda: daemon.ready,
            degraded=daemon.degraded,
            gc_grace_s=config.runtime.leak_grace_s,
            clock=clock,
            pod_routes=family_of(config).pod_routes(daemon.node_ip or POD_GATEWAY),
            pool_settings=lambda: pool_report(daemon),
            pods=_served_pods(daemon, node, kube),
            repair=lambda apply: repair(daemon, apply),
            network_policy=policy,
            host_network=daemon.datapath is not None,
        )
        app.middlewares.append(latency_middleware(recorders))
        runner = await _serve_api(app, config.endpoints.socket_path)
        stack.push_async_callback(runner.cleanup)
        try:
            listening = await _serve_observability(
                config, daemon, policy, recorders, stack, free_ports
            )
        except ListenFailed as err:
            print(f"ipamd: {err}", file=sys.stderr)
            return EXIT_CONFIG
        await _start_timed(daemon, recorders, started)
        serving.set()  # no await from here to `_run_until_stopped`, which answers `stop`
        freeze_start_up()
        if daemon.engine.unavailable is not None:
            print(f"ipamd: {daemon.engine.unavailable}", file=sys.stderr)
        written = _publish_conflist(config, daemon, conflist_bytes)
        if written is not None:
            conflist.remove_aws_node(written)  # only now: it sorts first and aws-node is gone
        kube_node.start_when_ready(kube, daemon.ready, daemon.pool, daemon.engine, stack)
        if node is not None:  # the hints only once ready; else the line above says why
            hints = (
                node.how_to_try(config, listening) if daemon.ready else node.how_to_repair(config)
            )
            print(hints, file=sys.stderr)
        try:
            return await _run_until_stopped(daemon, config_server, stop)
        finally:
            if written is not None:
                conflist.remove(written, "stopped", only_if=conflist_bytes)


def _served_pods(daemon: Daemon, node: EmbeddedNode | None, kube: KubeNode | None) -> PodAddresses:
    """ADD and DEL as the API serves them (`_pods`), through the embedded runtime's record and
    ANNOTATE_POD_IP's writes where those are on."""
    pods = _pods(daemon) if node is None else node.runtime_pods(daemon.engine, _pods(daemon))
    return pods if kube is None else kube.annotating(pods)


async def _network_policy(
    config: Config, daemon: Daemon, imds: Imdsv2Client, stack: AsyncExitStack
) -> tuple[NetworkPolicy, ConfigServer]:
    """The agent's part in ADD and DEL, and the config server it asks at its start, serving from
    here: before ready, since the agent exits when it cannot reach ipamd (its crash-loop backoff
    would delay every pod's policy) and the answer needs nothing start-up reads."""
    agent = GrpcPolicyAgent(config.network_policy.agent_socket)
    stack.push_async_callback(agent.close)
    try:
        reply = await read_agent_config(imds, config.network_policy.mode, daemon.node_ip)
    except CloudError as err:
        raise StartupError(f"cannot read this instance from IMDS: {err}") from err
    server = ConfigServer(config.network_policy.config_server_socket, reply)
    await server.start()
    stack.push_async_callback(server.close)
    policy = NetworkPolicy(daemon.engine, agent, config.network_policy.mode)
    if not policy.applies():
        logger.warning(
            "netpolicy.not_enforced mode=%r agent_socket=%s (pods run without network policy "
            "until the agent's socket appears; NETWORK_POLICY_ENFORCING_MODE=standard or strict "
            "makes ADD require the agent)",
            config.network_policy.mode,
            config.network_policy.agent_socket,
        )
    return policy, server


async def _serve_observability(
    config: Config,
    daemon: Daemon,
    policy: NetworkPolicy,
    recorders: Recorders,
    stack: AsyncExitStack,
    free_ports: frozenset[str],
) -> dict[str, HostPort]:
    """Metrics and introspection on their TCP addresses, each unless disabled, a setting of
    `free_ports` on a free port if its own is taken; returns where each listens, by setting. Raises
    `ListenFailed` (a port in use) for `serve` to report in one line."""
    daemon.engine.subscribe(lambda m, _: recorders.note_commit(daemon.engine.state, m))
    listening: dict[str, HostPort] = {}
    if not config.endpoints.disable_metrics:
        metrics = await serve_metrics(
            recorders,
            metric_sources(daemon, policy),
            config.endpoints.metrics_addr,
            or_free_port=METRICS_ADDR in free_ports,
        )
        stack.push_async_callback(metrics.cleanup)
        listening[METRICS_ADDR] = listening_on(metrics)
    if not config.endpoints.disable_introspection:
        settings = config.describe()
        addr = config.endpoints.introspection_bind_address
        introspection = await serve_introspection(
            daemon.engine,
            settings,
            addr,
            max_pods_report(daemon),
            or_free_port=INTROSPECTION_ADDR in free_ports,
        )
        stack.push_async_callback(introspection.cleanup)
        listening[INTROSPECTION_ADDR] = listening_on(introspection)
    return listening


async def _start_timed(daemon: Daemon, recorders: Recorders, process_started: float) -> None:
    """`daemon.start()`, its duration and the whole start-up's recorded for the metrics."""
    began = time.monotonic()
    await daemon.start()
    done = time.monotonic()
    recorders.started(daemon.ready, done - process_started, done - began)


def freeze_start_up() -> None:
    """Leave what start-up made out of every later garbage collection. Modules, botocore's service
    models and the restored state live as long as the process, and a full collection walked them
    all with the loop stopped: about 50 ms in the middle of a burst of ADDs, the slowest pairs of
    32 concurrent clients (`bench.api`). Frozen once here, collections walk only what came after;
    a frozen object freed by its reference count is still freed."""
    gc.collect()
    gc.freeze()


def _pods(daemon: Daemon) -> PodAddresses:
    """ADD and DEL as the API serves them: the engine's, through the host's datapath when it is
    on, an ADD answered once aws-node's checkpoint holds it (`ipamd.awsnode.keeper`)."""
    pods: PodAddresses = daemon.datapath or EngineOnly(daemon.engine)
    return pods if daemon.keeper is None else CheckpointedPods(pods, daemon.keeper)


async def _run_until_stopped(
    daemon: Daemon, config_server: ConfigServer, stop: asyncio.Event
) -> int:
    serving = daemon.engine.unavailable is None  # fail closed: no pool work on an untrusted state
    if serving:
        daemon.schedule()
        daemon.jobs.start()
    async with asyncio.TaskGroup() as tasks:
        workers = (
            [
                tasks.create_task(daemon.pool.run(daemon.config.pool.interval_s), name="pool"),
                tasks.create_task(daemon.drift_on_demand(), name="drift-on-demand"),
                *(
                    [tasks.create_task(daemon.datapath.run(), name="hostnet")]
                    if daemon.datapath is not None
                    else []
                ),
                *(
                    [tasks.create_task(daemon.keeper.run(), name="checkpoint")]
                    if daemon.keeper is not None
                    else []
                ),
            ]
            if serving
            else []
        )
        served = tasks.create_task(config_server.serve(), name="config-server")
        stopped = tasks.create_task(stop.wait(), name="signals")
        failed = tasks.create_task(daemon.jobs.failed.wait(), name="job-failures")
        rebuilt = tasks.create_task(daemon.restart_wanted.wait(), name="restart-after-rebuild")
        await asyncio.wait({stopped, failed, rebuilt}, return_when=asyncio.FIRST_COMPLETED)
        for task in (*workers, served, stopped, failed, rebuilt):
            task.cancel()
    if daemon.keeper is not None and serving:
        daemon.keeper.write_now()  # the last word before aws-node may start again on this node
    if daemon.restart_wanted.is_set():
        logger.warning("daemon.stopped reason=state_rebuilt: start ipamd again to serve from it")
        return EXIT_RESTART
    if daemon.jobs.fatal is not None:
        logger.error("daemon.stopped reason=%r", daemon.jobs.fatal)
        return EXIT_FAILED
    logger.info("daemon.stopped reason=signal")
    return 0
