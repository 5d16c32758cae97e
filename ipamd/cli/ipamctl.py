"""`ipamctl`: the operator's view of a running ipamd, through its local API.

`status` prints the pool per ENI (free, assigned, cooling, releasing, lost), `allocations`, `intents`
and `enis` list what the daemon holds, `repair` shows what the daemon would fix from EC2's view and the
runtime's sandboxes (`--apply` fixes it); `--json` prints the API's answer as is, for scripts. Errors say
what to do: the daemon not running, the socket not accessible.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from ipamd.cni.client import BadAnswer, DaemonError, Unreachable, call

DEFAULT_SOCKET = "/run/ipamd/ipamd.sock"
STATES = ("free", "assigned", "cooling", "releasing", "lost")
PATHS = {
    "status": "/v1/pool",
    "allocations": "/v1/allocations",
    "intents": "/v1/intents",
    "enis": "/v1/enis",
}


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def render_status(pool: dict[str, Any]) -> str:
    rows = [["ENI", "DEV", *(s.upper() for s in STATES), "DATAPATH"]]
    blocked: list[str] = []
    for eni in pool["enis"]:
        primary = " (primary)" if eni.get("is_primary") else ""
        datapath = eni.get("datapath", "ready")
        if datapath != "ready":
            blocked.append(f"{eni['eni_id']}: {eni.get('datapath_reason', '')}")
        rows.append(
            [
                eni["eni_id"] + primary,
                str(eni["device_index"]),
                *(str(eni["counts"][s]) for s in STATES),
                datapath,
            ]
        )
    rows.append(["total", "", *(str(pool["counts"][s]) for s in STATES), ""])
    summary = (
        f"allocations: {pool['allocations']}  delete intents: {pool['intents']}  "
        f"quarantined: {pool['quarantined']}"
    )
    lines = [_table(rows), "", summary]
    if blocked:
        # A blocked ENI's addresses are not handed out: its link is not set up on the host yet.
        lines += ["blocked ENIs (addresses held back until the host link is set up):"]
        lines += [f"  {line}" for line in blocked]
    if "targets" in pool:
        knobs = "  ".join(f"{k}={v}" for k, v in pool["targets"].items())
        limits = "  ".join(f"{k}={v}" for k, v in pool["limits"].items())
        lines += [f"mode: {pool.get('mode', '')}  targets: {knobs}", f"limits: {limits}"]
    return "\n".join(lines)


def render_list(answer: Any) -> str:
    items = (
        answer
        if isinstance(answer, list)
        else next((v for v in answer.values() if isinstance(v, list)), [answer])
    )
    if not items:
        return "(none)"
    if not isinstance(items[0], dict):
        return "\n".join(str(i) for i in items)
    keys = [k for k in items[0] if not isinstance(items[0][k], (dict, list))]
    rows = [[k.upper() for k in keys]] + [[str(i.get(k, "")) for k in keys] for i in items]
    return _table(rows)


def render_repair(answer: dict[str, Any]) -> str:
    head = "applied:" if answer["applied"] else "dry run (use --apply to make these changes):"
    return "\n".join([head, *(f"  {line}" for line in answer["actions"])])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ipamctl", description="Inspect a running ipamd")
    parser.add_argument(
        "--socket",
        default=os.environ.get("IPAMD_SOCKET", DEFAULT_SOCKET),
        help=f"the daemon's socket (default: $IPAMD_SOCKET or {DEFAULT_SOCKET})",
    )
    parser.add_argument("--json", action="store_true", help="print the API's JSON answer")
    parser.add_argument("command", choices=(*PATHS, "repair"))
    parser.add_argument(
        "--apply", action="store_true", help="repair: make the changes (default: a dry run)"
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "repair":
            path = "/v1/repair?apply=true" if args.apply else "/v1/repair"
            answer = call(args.socket, "POST", path, {}, timeout=120)
        else:
            answer = call(args.socket, "GET", PATHS[args.command])
    except Unreachable as err:
        hint = (
            "is ipamd running? (`ipamd run`, or `make run` for the embedded cloud)"
            if not os.path.exists(args.socket)
            else "the socket exists but cannot be reached: check its permissions (mode 0660)"
        )
        print(f"ipamctl: {err}\nipamctl: {hint}", file=sys.stderr)
        return 2
    except (DaemonError, BadAnswer) as err:
        print(f"ipamctl: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(answer, indent=2))
    elif args.command == "status":
        print(render_status(answer))  # type: ignore[arg-type]
    elif args.command == "repair":
        print(render_repair(answer))  # type: ignore[arg-type]
    else:
        print(render_list(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
