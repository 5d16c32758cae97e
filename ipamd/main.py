"""`ipamd run`: its arguments, its signals and its exit codes; the composition root it runs is
`ipamd.node.compose` (with `ipamd.node.embedded`, its other half, under `--embedded`: moto with
ipamd's extension on loopback, an IMDS simulator and a container runtime of its own, kept in the
state directory, so running it again is a restart of the same node).

SIGTERM and SIGINT stop the daemon in order and exit 0 (`daemon.stopped reason=signal`): after
ready, once in-flight requests finish; before ready (start-up retrying EC2, say), where the start
waits; before this module is even imported, in the console script (`ipamd.launch`). A start-up step
the machine refuses is one line on stderr and an exit code, never a traceback:

  2  EXIT_CONFIG   invalid configuration, or a setting this machine cannot serve (a port in use, a
                   socket or state directory that cannot be created)
  3  EXIT_STATE    the state directory is in use by another ipamd, or holds an embedded cloud that
                   cannot be rebuilt
  1  EXIT_FAILED   anything else that stopped the start (IMDS or EC2 unreachable) or the daemon
 75  EXIT_RESTART  repair rebuilt the state file: start again to serve from it
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import sys
from collections.abc import Sequence

from ipamd.config import vpc_cni
from ipamd.config.settings import Config, ConfigError
from ipamd.errors import SettingUnusable, StartupError, StateUnusable
from ipamd.node import compose
from ipamd.node.compose import (
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_STATE,
    INTROSPECTION_ADDR,
    METRICS_ADDR,
)
from ipamd.telemetry.logs import configure_logging
from ipamd.version import installed

logger = logging.getLogger("ipamd")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ipamd", description="Node IP-address daemon")
    parser.add_argument("--version", action="version", version=f"ipamd {installed()}")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the daemon")
    run.add_argument(
        "--embedded", action="store_true", help="run on an embedded cloud (no AWS account needed)"
    )
    return parser


async def serve(
    config: Config,
    embedded: bool,
    *,
    own_runtime: bool = False,
    free_ports: frozenset[str] = frozenset(),
) -> int:
    """Run the daemon until stopped; returns the exit code. Raises `StartupError` for a start-up
    step the machine refused. `own_runtime`: embedded, serve a container runtime of its own.
    `free_ports`: the TCP endpoints' settings (METRICS_ADDR, INTROSPECTION_ADDR) whose port, when
    taken, gives way to a free one.

    SIGTERM and SIGINT are this loop's from its first step on. One that comes before ready (the
    start-up waiting out EC2, say) cancels the start where it waits, whatever it made is closed in
    order, and the exit is a stop's, 0 with `daemon.stopped`, as after ready."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    serving = asyncio.Event()
    run = asyncio.create_task(
        compose.run(
            config, embedded, stop, serving, own_runtime=own_runtime, free_ports=free_ports
        ),
        name="serve",
    )
    signalled = asyncio.create_task(stop.wait(), name="signals")
    try:
        await asyncio.wait({run, signalled}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        signalled.cancel()
    if run.done() or serving.is_set():
        return await run  # from ready on, `_run_until_stopped` answers the signal itself
    run.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        return await run
    logger.info("daemon.stopped reason=signal while=starting")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = Config.from_env(os.environ, embedded=args.embedded)
    except ConfigError as err:
        print(f"ipamd: invalid configuration:\n{err}", file=sys.stderr)
        return EXIT_CONFIG
    # Embedded, the runtime is ipamd's own unless IPAMD_CRI_SOCKET names another; the config then
    # names its socket, so the effective settings (log, introspection) say where leak GC looks.
    own_runtime = args.embedded and not os.environ.get("IPAMD_CRI_SOCKET")
    if own_runtime:
        from ipamd.node.embedded import cri_socket_path

        runtime = dataclasses.replace(config.runtime, cri_socket_path=str(cri_socket_path(config)))
        config = dataclasses.replace(config, runtime=runtime)
    configure_logging(config.logging.format, config.logging.level, config.logging.file)
    logger.info("config.effective %s", " ".join(f"{k}={v}" for k, v in config.describe().items()))
    for name, value, why in vpc_cni.inert(os.environ):
        logger.info("config.inert %s=%s: nothing in ipamd changes: %s", name, value, why)
    # Embedded, a metrics or introspection port nobody set gives way to a free one when taken (a
    # second clone's `make run`); an address set explicitly is served on, or refused.
    free_ports = frozenset(
        s for s in (METRICS_ADDR, INTROSPECTION_ADDR) if args.embedded and not os.environ.get(s)
    )
    with contextlib.suppress(KeyboardInterrupt):
        try:
            return asyncio.run(
                serve(config, args.embedded, own_runtime=own_runtime, free_ports=free_ports)
            )
        except StartupError as err:
            print(f"ipamd: {err}", file=sys.stderr)
            return _exit_code(err)
    return 0


def _exit_code(err: StartupError) -> int:
    if isinstance(err, SettingUnusable):
        return EXIT_CONFIG
    if isinstance(err, StateUnusable):
        return EXIT_STATE
    return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
