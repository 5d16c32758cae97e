"""`ipamctl`: the operator's view of a running ipamd, through its local API.

`status` prints the pool per ENI (free, assigned, cooling, held, releasing, lost; on an IPv6 node the /80
and what FREE means there), `allocations`, `intents` and `enis` list what the daemon holds, `repair`
shows what the daemon would fix from EC2's view and the runtime's sandboxes (`--apply` fixes it);
`--json` prints the API's answer as is, for scripts, and errors as JSON too. Errors say what to do:
the daemon not running, the socket not accessible, the state file unusable (`status` then exits 1
instead of showing an empty pool). Times are shown in UTC, and output into a closed pipe
(`ipamctl allocations | head`) ends quietly.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from ipamd.cni.client import BadAnswer, DaemonError, Unreachable, call
from ipamd.wire import (
    DEFAULT_SOCKET,
    PATH_ALLOCATIONS,
    PATH_ENIS,
    PATH_INTENTS,
    PATH_POOL,
    PATH_REPAIR,
)

STATES = ("free", "assigned", "cooling", "held", "releasing", "lost")
PATHS = {
    "status": PATH_POOL,
    "allocations": PATH_ALLOCATIONS,
    "intents": PATH_INTENTS,
    "enis": PATH_ENIS,
}


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


IPV6_TARGETS = "the warm targets, MINIMUM_IP_TARGET and MAX_ENI have no effect"


def _ipv6_prefixes(pool: dict[str, Any]) -> list[str]:
    """The lines of an IPv6 node's /80s: where each is and what its FREE count means. A /80 holds
    2^48 addresses; FREE counts the pods max pods still allows, the usable capacity."""
    held = [(eni["eni_id"], cidr) for eni in pool["enis"] for cidr in eni.get("ipv6_prefixes", ())]
    if not held:
        return []
    lines = ["IPv6 prefixes (pods get /128s; never released; FREE = pods max pods still allows):"]
    return lines + [f"  {cidr} on {eni_id}" for eni_id, cidr in held]


def render_status(pool: dict[str, Any]) -> str:
    rows = [["ENI", "DEV", *(s.upper() for s in STATES), "DATAPATH"]]
    blocked: list[str] = []
    for eni in pool["enis"]:
        primary = " (primary)" if eni.get("is_primary") else ""
        datapath = eni.get("datapath", "ready")
        if datapath == "blocked":
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
    prefixes = _ipv6_prefixes(pool)
    lines += prefixes
    if "targets" in pool:
        knobs = "  ".join(f"{k}={v}" for k, v in pool["targets"].items())
        limits = dict(pool["limits"])
        reason = limits.pop("max_pods_reason", None)
        kubelet = limits.pop("kubelet_config", None)
        shown = "  ".join(f"{k}={v}" for k, v in limits.items())
        mode = f"mode: {pool.get('mode', '')}  targets: {knobs}"
        if prefixes:
            mode = f"mode: IPv6, {IPV6_TARGETS}"
        lines += [mode, f"limits: {shown}"]
        if reason:
            lines.append(f"max pods: {limits.get('max_pods')}, {reason}")
        if kubelet:
            lines.append(f"kubelet config: {kubelet}")
    if "subnets" in pool:
        lines.append("subnets: " + "  ".join(f"{k}={v}" for k, v in pool["subnets"].items()))
    return "\n".join(lines)


TIME_KEYS = frozenset({"created_at", "first_del_at", "quarantined_at", "taken_at", "expires_at"})


def show_time(value: object) -> str:
    """A Unix time as UTC to the second (`2026-12-01T07:36:07Z`); anything else as it is."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(value))
    return str(value)


def _cell(key: str, item: dict[str, Any]) -> str:
    value = item.get(key, "")
    if key == "addresses":
        ips = item.get("ips")
        listed = [ip["address"] for ip in ips] if isinstance(ips, list) else value
        return ",".join(str(a) for a in listed) if isinstance(listed, list) else str(listed)
    if key == "pod":
        return "/".join(str(value.get(k, "")) for k in ("namespace", "name")) if value else ""
    return show_time(value) if key in TIME_KEYS else str(value)


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
    if "ips" in items[0] or isinstance(items[0].get("addresses"), list):
        keys.insert(min(3, len(keys)), "addresses")  # an allocation is mostly its address
    if isinstance(items[0].get("pod"), dict):
        keys.append("pod")
    rows = [[k.upper() for k in keys]] + [[_cell(k, i) for k in keys] for i in items]
    return _table(rows)


def render_repair(answer: dict[str, Any]) -> str:
    head = "applied:" if answer["applied"] else "dry run (use --apply to make these changes):"
    return "\n".join([head, *(f"  {line}" for line in answer["actions"])])


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader went away (`ipamctl allocations | head`): not an error of ipamctl's. Point
        # stdout at /dev/null so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _fail(args: argparse.Namespace, code: str, message: str, exit_code: int) -> int:
    if args.json:
        print(json.dumps({"error": {"code": code, "message": message}}, indent=2))
    else:
        print(f"ipamctl: {message}", file=sys.stderr)
    return exit_code


def _main(argv: Sequence[str] | None) -> int:
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
            path = f"{PATH_REPAIR}?apply=true" if args.apply else PATH_REPAIR
            answer = call(args.socket, "POST", path, {}, timeout=120)
        else:
            answer = call(args.socket, "GET", PATHS[args.command])
    except Unreachable as err:
        hint = (
            "is ipamd running? (`ipamd run`, or `make run` for the embedded cloud)"
            if not os.path.exists(args.socket)
            else "the socket exists but cannot be reached: check its permissions (mode 0660)"
        )
        return _fail(args, "unreachable", f"{err}\nipamctl: {hint}", 2)
    except DaemonError as err:
        return _fail(args, err.body.code, str(err), 1)
    except BadAnswer as err:
        return _fail(args, "bad_answer", str(err), 1)
    unusable = answer.get("state_unavailable") if isinstance(answer, dict) else None
    if unusable and not args.json:
        print(f"ipamctl: ipamd serves no pool: {unusable}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(answer, indent=2))
    elif args.command == "status":
        print(render_status(answer))  # type: ignore[arg-type]
    elif args.command == "repair":
        print(render_repair(answer))  # type: ignore[arg-type]
    else:
        print(render_list(answer))
    return 1 if unusable else 0
