"""`ipamctl`: status, allocations, intents, enis and repair, through the daemon's local API.

The local API is not part of this build yet; every command says so and exits non-zero.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

COMMANDS = ("status", "allocations", "intents", "enis", "repair")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ipamctl", description="Inspect and repair ipamd")
    parser.add_argument("--socket", default="/run/ipamd/ipamd.sock", help="the daemon's socket")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("command", choices=COMMANDS)
    args = parser.parse_args(argv)
    print(
        f"ipamctl: {args.command}: the daemon's local API is not included in this build yet",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
