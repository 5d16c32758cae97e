"""`python -m chaos` (`make chaos`): the default run, `name: value` figures on stdout, progress on
stderr, exit 1 unless every fault injected was survived with nothing lost."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from chaos.faults import KINDS
from chaos.report import Report
from chaos.runner import ChaosError, Options, run


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__)
    defaults = Options()
    parser.add_argument("--faults", type=int, default=defaults.faults, help="faults to inject")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seed of the schedule")
    parser.add_argument("--json", type=Path, help="also write the report as JSON here")
    parser.add_argument(
        "--kinds",
        default=",".join(KINDS),
        help=f"comma-separated fault kinds to rotate through (default: all of {','.join(KINDS)})",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    kinds = tuple(k for k in args.kinds.split(",") if k)
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or not kinds or args.faults < 1:
        print(f"chaos: bad --kinds {unknown} or --faults {args.faults}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    options = Options(faults=args.faults, seed=args.seed, kinds=kinds)
    try:
        outcome = asyncio.run(run(options, sys.stderr))
    except ChaosError as err:
        print(f"chaos: {err}", file=sys.stderr)
        return 1
    report = Report(outcome)
    for line in report.lines():
        print(line)
    if args.json is not None:
        args.json.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    if outcome.log_tail:
        print(f"chaos: the daemon's last log lines:\n{outcome.log_tail}", file=sys.stderr)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
