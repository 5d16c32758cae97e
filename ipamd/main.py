"""`ipamd`: the entry point and composition root — the only place that builds concrete adapters.

`ipamd run` reads the configuration (the only hand-over of `os.environ`), builds the EC2 adapter, the
IMDS client and the CRI client, hands them to `ipamd.daemon`, serves the local API on its unix socket
and runs the pool manager and the reconcile schedule in one task group until SIGTERM or SIGINT:
then it stops taking work, lets in-flight requests finish, and exits 0. `ipamd run --embedded` does
the same on an embedded cloud: moto with ipamd's extension served on loopback, one VPC, subnet and
instance, and an IMDS simulator — no AWS account needed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path

from cloud.ec2 import Boto3Ec2, client_config, make_client
from cloud.imds import DEFAULT_BASE_URL, Imdsv2Client
from ipamd import conflist
from ipamd.api.app import create_app
from ipamd.api.server import serve_unix
from ipamd.api.views import POD_GATEWAY
from ipamd.clock import SystemClock
from ipamd.config import Config, ConfigError
from ipamd.daemon import Daemon, HostNetAdapters, build_daemon, repair
from ipamd.metrics import Recorders, Sources
from ipamd.metrics_http import latency_middleware, serve_metrics
from ipamd.observability import configure_logging
from ipamd.runtime.cri import GrpcCriRuntime

logger = logging.getLogger("ipamd")

EXIT_CONFIG = 2
EXIT_STATE = 3
EXIT_FAILED = 1
EXIT_RESTART = 75  # EX_TEMPFAIL: the supervisor (kubelet) starts ipamd again on the rebuilt state


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ipamd", description="Node IP-address daemon")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the daemon")
    run.add_argument(
        "--embedded", action="store_true", help="run on an embedded cloud (no AWS account needed)"
    )
    return parser


async def _cloud(
    config: Config, embedded: bool, stack: AsyncExitStack, recorders: Recorders
) -> tuple[Boto3Ec2, str]:
    """The EC2 adapter and the IMDS base URL: real AWS, or the embedded cloud."""
    if not embedded:
        region = config.aws_region or os.environ.get("AWS_DEFAULT_REGION")
        if region is None:
            async with Imdsv2Client(config.imds_endpoint or DEFAULT_BASE_URL) as imds:
                region = (await imds.identity()).region
        client = make_client(region, config.ec2_endpoint, float(config.ec2_http_timeout_s))
        adapter = Boto3Ec2(client, call_timeout_s=config.ec2_call_timeout_s, recorder=recorders)
        return adapter, config.imds_endpoint or DEFAULT_BASE_URL
    from cloud.embedded.imds_sim import ImdsSimulator
    from cloud.embedded.world import EmbeddedEc2

    host = EmbeddedEc2("server").start()
    stack.callback(host.close)
    world = host.world(config.embedded_instance_type, region=config.aws_region or "us-west-2")
    simulator = ImdsSimulator(world)
    imds_url = await simulator.start()
    stack.push_async_callback(simulator.close)
    print(
        f"ipamd: embedded cloud: EC2 at {world.endpoint_url}, IMDS at {imds_url}, "
        f"instance {world.instance_id} ({world.instance_type}) in {world.subnet_cidr}",
        file=sys.stderr,
    )
    client = world.client(client_config(float(config.ec2_http_timeout_s)))
    adapter = Boto3Ec2(client, call_timeout_s=config.ec2_call_timeout_s, recorder=recorders)
    return adapter, imds_url


async def _hostnet(
    config: Config, imds: Imdsv2Client, stack: AsyncExitStack
) -> HostNetAdapters | None:
    """The kernel's adapters when IPAMD_HOST_NETWORK=on (pyroute2 is imported only then)."""
    if config.host_network != "on":
        logger.info("hostnet.off reason=IPAMD_HOST_NETWORK=off: pods on secondary ENIs cannot send")
        return None
    from ipamd.hostnet.netlink import NetlinkHostNetwork
    from ipamd.hostnet.snat import NftSnatTable

    host = NetlinkHostNetwork()
    await host.open()
    stack.push_async_callback(host.close)
    return HostNetAdapters(host=host, snat=NftSnatTable(), vpc_cidrs=imds.vpc_cidrs)


def _how_to_try(config: Config) -> str:
    """Commands a new user can paste: absolute paths, the scripts next to this interpreter."""
    bin_dir = os.path.dirname(sys.executable)
    sock = os.path.abspath(config.socket_path)
    conf = (
        '{"cniVersion":"1.1.0","name":"k8s-pod-network",'
        f'"ipam":{{"type":"ipamd-cni","socket":"{sock}"}}}}'
    )
    return (
        "ipamd: ready. Try, in another terminal:\n"
        f"  {bin_dir}/ipamctl --socket {sock} status\n"
        f"  echo '{conf}' | CNI_COMMAND=ADD CNI_CONTAINERID=demo1 CNI_NETNS=/var/run/netns/demo "
        f"CNI_IFNAME=eth0 CNI_PATH=/opt/cni/bin {bin_dir}/ipamd-cni\n"
        "  (CNI_COMMAND=DEL releases it; Ctrl-C stops ipamd and the embedded cloud)"
    )


def _publish_conflist(config: Config, daemon: Daemon, data: bytes | None) -> Path | None:
    """Write the conflist once ready; with an unusable state file, make sure none is there."""
    if config.cni_conf_dir is None or config.cni_conflist_template is None or data is None:
        return None
    target = Path(config.cni_conf_dir) / Path(config.cni_conflist_template).name
    if not daemon.ready:
        conflist.remove(target, "state_unavailable")
        return None
    return conflist.write(target.parent, target.name, data)


async def serve(config: Config, embedded: bool) -> int:
    clock = SystemClock()
    conflist_bytes = None
    if config.cni_conflist_template is not None:
        try:
            conflist_bytes = conflist.render(
                Path(config.cni_conflist_template),
                config.socket_path,
                config.pod_mtu or config.eni_mtu,
            )
        except conflist.ConflistError as err:
            print(f"ipamd: invalid configuration:\n{err}", file=sys.stderr)
            return EXIT_CONFIG
    async with AsyncExitStack() as stack:
        recorders = Recorders()
        ec2, imds_url = await _cloud(config, embedded, stack, recorders)
        imds = Imdsv2Client(imds_url)
        stack.push_async_callback(imds.close)
        runtime = GrpcCriRuntime(config.cri_socket_path)
        stack.push_async_callback(runtime.close)
        hostnet = await _hostnet(config, imds, stack)
        daemon = await build_daemon(
            config,
            ec2=ec2,
            imds=imds,
            runtime=runtime,
            addresses=runtime,
            clock=clock,
            hostnet=hostnet,
        )
        stack.push_async_callback(daemon.close)
        app = create_app(
            daemon.engine,
            ready=lambda: daemon.ready,
            gc_grace_s=config.leak_grace_s,
            clock=clock,
            pod_gateway=daemon.node_ip or POD_GATEWAY,
            pool_settings=lambda: _pool_settings(daemon),
            pods=daemon.datapath,
            repair=lambda apply: repair(daemon, apply),
        )
        app.middlewares.append(latency_middleware(recorders))
        runner = await serve_unix(app, config.socket_path)
        stack.push_async_callback(runner.cleanup)
        if not config.disable_metrics:
            metrics = await serve_metrics(recorders, _sources(daemon), config.metrics_addr)
            stack.push_async_callback(metrics.cleanup)
        await daemon.start()
        if daemon.engine.unavailable is not None:
            print(f"ipamd: {daemon.engine.unavailable}", file=sys.stderr)
        written = _publish_conflist(config, daemon, conflist_bytes)
        if embedded:
            print(_how_to_try(config), file=sys.stderr)
        try:
            return await _run_until_stopped(daemon)
        finally:
            if written is not None:
                conflist.remove(written, "stopped", only_if=conflist_bytes)


def _pool_settings(daemon: Daemon) -> dict[str, object]:
    """The knobs and limits `GET /v1/pool` reports beside the counts (`ipamctl status`)."""
    targets, limits = daemon.pool._settings.targets, daemon.pool._limits
    return {
        "mode": daemon.pool.strategy.kind,
        "targets": {
            "WARM_ENI_TARGET": targets.warm_eni_target,
            "WARM_IP_TARGET": targets.warm_ip_target,
            "MINIMUM_IP_TARGET": targets.minimum_ip_target,
            "WARM_PREFIX_TARGET": targets.warm_prefix_target,
        },
        "limits": {
            "max_enis": limits.max_enis,
            "units_per_eni": limits.units_per_eni,
            "max_pods": daemon.engine.settings.max_pods,
        },
    }


def _sources(daemon: Daemon) -> Sources:
    limits = daemon.pool._limits
    return Sources(
        snapshot=daemon.engine.snapshot,
        max_enis=limits.max_enis,
        max_addresses=daemon.engine.settings.max_pods or 0,
        job_outcomes=lambda: daemon.jobs.outcomes,
        leaks_released=lambda: daemon.leak_gc.released,
        pool_failures=lambda: daemon.pool.health.errors_by_code,
        hostnet_fixes=lambda: daemon.datapath.health.fixes if daemon.datapath else {},
        hostnet_add_failures=lambda: daemon.datapath.health.add_failures if daemon.datapath else 0,
    )


async def _run_until_stopped(daemon: Daemon) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    serving = daemon.engine.unavailable is None  # fail closed: no pool work on an untrusted state
    if serving:
        daemon.schedule()
        daemon.jobs.start()
    async with asyncio.TaskGroup() as tasks:
        workers = (
            [
                tasks.create_task(daemon.pool.run(daemon.config.pool_interval_s), name="pool"),
                tasks.create_task(daemon.drift_on_demand(), name="drift-on-demand"),
                *(
                    [tasks.create_task(daemon.datapath.run(), name="hostnet")]
                    if daemon.datapath is not None
                    else []
                ),
            ]
            if serving
            else []
        )
        stopped = tasks.create_task(stop.wait(), name="signals")
        failed = tasks.create_task(daemon.jobs.failed.wait(), name="job-failures")
        rebuilt = tasks.create_task(daemon.restart_wanted.wait(), name="restart-after-rebuild")
        await asyncio.wait({stopped, failed, rebuilt}, return_when=asyncio.FIRST_COMPLETED)
        for task in (*workers, stopped, failed, rebuilt):
            task.cancel()
    if daemon.restart_wanted.is_set():
        logger.warning("daemon.stopped reason=state_rebuilt: start ipamd again to serve from it")
        return EXIT_RESTART
    if daemon.jobs.fatal is not None:
        logger.error("daemon.stopped reason=%r", daemon.jobs.fatal)
        return EXIT_FAILED
    logger.info("daemon.stopped reason=signal")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = Config.from_env(os.environ, embedded=args.embedded)
    except ConfigError as err:
        print(f"ipamd: invalid configuration:\n{err}", file=sys.stderr)
        return EXIT_CONFIG
    configure_logging(config.log_format, config.log_level)
    logger.info("config.effective %s", " ".join(f"{k}={v}" for k, v in config.describe().items()))
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(serve(config, args.embedded))
    return 0


if __name__ == "__main__":
    sys.exit(main())
