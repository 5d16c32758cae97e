"""`ipamd`: the daemon's entry point and composition root.

It reads the configuration (the only place `os.environ` is handed over), opens the state file and
reports what it found. The cloud, the pool manager, reconcile and the local API are wired here as they
arrive; until then `ipamd run` validates configuration and state, then says what is missing.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ipamd.clock import SystemClock
from ipamd.config import Config, ConfigError
from ipamd.engine.allocator import EngineSettings
from ipamd.engine.engine import Engine

logger = logging.getLogger("ipamd")

EXIT_CONFIG = 2
EXIT_STATE = 3
EXIT_UNAVAILABLE = 4


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ipamd", description="Node IP-address daemon")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the daemon")
    run.add_argument(
        "--embedded", action="store_true", help="run on an embedded cloud (no AWS account needed)"
    )
    return parser


def engine_settings(config: Config) -> EngineSettings:
    return EngineSettings(
        cooldown_s=float(config.ip_cooldown_period_s),
        intent_ttl_s=config.delete_intent_ttl_s,
    )


async def _open_state(config: Config) -> int:
    path = Path(config.state_dir) / "ipamd.db"
    engine = await Engine.open(path, SystemClock(), engine_settings(config))
    try:
        if engine.unavailable is not None:
            print(f"ipamd: {engine.unavailable}", file=sys.stderr)
            return EXIT_STATE
        snapshot = engine.snapshot()
        print(
            f"ipamd: state {path}: {snapshot.allocations} allocations, "
            f"{snapshot.intents} delete intents, {snapshot.quarantined} quarantined",
            file=sys.stderr,
        )
    finally:
        await engine.close()
    print(
        "ipamd: configuration and state are valid, but this build does not yet include the "
        "EC2 layer and local API the daemon serves through",
        file=sys.stderr,
    )
    return EXIT_UNAVAILABLE


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = Config.from_env(os.environ, embedded=args.embedded)
    except ConfigError as err:
        print(f"ipamd: invalid configuration:\n{err}", file=sys.stderr)
        return EXIT_CONFIG
    logging.basicConfig(level=config.log_level.upper(), format="%(levelname)s %(name)s %(message)s")
    logger.info("config.effective %s", " ".join(f"{k}={v}" for k, v in config.describe().items()))
    return asyncio.run(_open_state(config))


if __name__ == "__main__":
    sys.exit(main())
