"""`ipamctl`: the operator's view of a running ipamd, through its local API.

`status` prints the pool per ENI (free, assigned, cooling, held, releasing, lost; on an IPv6 node the /80
and what FREE means there), `allocations`, `intents` and `enis` list what the daemon holds, `repair`
shows what the daemon would fix from EC2's view and the runtime's sandboxes (`--apply` fixes it);
`--json` prints the API's answer as is, for scripts, and errors as JSON too
(`{"error": {"code", "reason"?, "message"}}`). A table's columns are those of all its rows; times are
shown as ISO 8601 in UTC (`2026-12-06T21:56:58Z`), and output into a closed pipe (`ipamctl
allocations | head`) ends quietly.

Exit status 0, or 1 when ipamd answered with an error or serves no pool (an unusable state file:
`status` then shows no empty pool) or, for `status`, is not ready (the first line says why), or 2
when ipamd was not reached; the message then says what is at
the socket's path, and `--json`'s `reason` names it: `no_such_file` (nothing there; after `make
run`, the `--socket ./.run/ipamd.sock` to use), `not_a_socket` (a regular file, a directory),
`not_running` (a socket nobody listens on: a daemon killed with SIGKILL leaves one),
`permission_denied` (connect's EACCES or EPERM only), `not_ipamd` (something answers there that
does not speak ipamd's API), `no_answer` (a timeout, a connection broken off).
"""

from __future__ import annotations

import argparse
import errno
import grp
import json
import os
import pwd
import stat
import sys
from collections.abc import Sequence
from typing import Any

from ipamd.cni.client import TIMEOUT_S, BadAnswer, DaemonError, Unreachable, call
from ipamd.errors import utc_text
from ipamd.version import installed
from ipamd.wire import (
    DEFAULT_SOCKET,
    PATH_ALLOCATIONS,
    PATH_ENIS,
    PATH_INTENTS,
    PATH_POOL,
    PATH_REPAIR,
)

REPAIR_TIMEOUT_S = 120.0
"""Repair reads EC2 and the runtime before it answers."""
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
        knobs = _knobs(pool)
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
        lines.append(
            "subnets: " + "  ".join(f"{k}={_shown(v)}" for k, v in pool["subnets"].items())
        )
    lines += _pool_health(pool)
    return "\n".join([*_readiness(pool), *lines])


def _shown(value: object) -> str:
    """A value as a person reads it: `not read yet` for one the daemon has not learnt."""
    return "not read yet" if value is None else str(value)


def _readiness(pool: dict[str, Any]) -> list[str]:
    """The first lines: ready or not and why, and what works less than it should."""
    if "ready" not in pool:
        return []
    head = ["ipamd: ready" if pool["ready"] else f"ipamd: NOT READY: {pool.get('not_ready')}"]
    head += [f"degraded: {reason}" for reason in pool.get("degraded") or ()]
    return [*head, ""]


def _knobs(pool: dict[str, Any]) -> str:
    """The warm targets, those the pool follows first, then those it ignores and why."""
    targets: dict[str, Any] = pool["targets"]
    force = pool.get("in_force")
    if not isinstance(force, dict):
        return "  ".join(f"{k}={v}" for k, v in targets.items())
    used = "  ".join(f"{k}={targets.get(k)}" for k in force.get("targets", ()))
    ignored = "; ".join(
        f"{k}={targets.get(k)} ({why})" for k, why in force.get("ignored", {}).items()
    )
    return f"{used}  ignored: {ignored}" if ignored else used


def _pool_health(pool: dict[str, Any]) -> list[str]:
    """What the pool waits for: its last failure, and what it keeps spare before giving it back."""
    lines: list[str] = []
    failure = pool.get("last_failure")
    if isinstance(failure, dict):
        state = "blocking: the pool cannot grow" if failure.get("blocking") else "passed"
        after = f"; next try at {failure['next_try_at']}" if failure.get("next_try_at") else ""
        lines.append(
            f"last pool failure at {failure.get('at')} ({state}{after}): {failure['error']}"
        )
    spare = pool.get("spare")
    if isinstance(spare, dict) and spare.get("waiting"):
        lines.append(
            f"spare: {spare['waiting']} ENI(s) or unit(s) to give back, the first at "
            f"{spare.get('release_at')} (IPAMD_RELEASE_DELAY, IPAMD_SHRINK_INTERVAL)"
        )
    return lines


TIME_KEYS = frozenset({"created_at", "first_del_at", "quarantined_at", "taken_at", "expires_at"})


def show_time(value: object) -> str:
    """A Unix time as UTC to the second (`2026-12-01T07:36:07Z`); anything else as it is."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return utc_text(value)
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
    if not all(isinstance(i, dict) for i in items):
        return "\n".join(str(i) for i in items)
    # The columns of every row, in the order they first appear: a field that only some rows have
    # (a pod's name, given by the runtime or not) is shown whichever row has it.
    nested = {k for i in items for k, v in i.items() if isinstance(v, (dict, list))}
    keys = list(dict.fromkeys(k for i in items for k in i if k not in nested))
    if nested & {"ips", "addresses"}:
        keys = [k for k in keys if k != "addresses"]
        keys.insert(min(3, len(keys)), "addresses")  # an allocation is mostly its address
    if "pod" in nested:
        keys = [k for k in keys if k != "pod"] + ["pod"]
    rows = [[k.upper() for k in keys]] + [[_cell(k, i) for k in keys] for i in items]
    return _table(rows)


NOTHING_TO_REPAIR = "nothing to repair"
"""The one action of a repair that found nothing (`ipamd.reconcile.repair`)."""


def render_repair(answer: dict[str, Any], apply: bool) -> str:
    """A dry run's plan, what an apply did, or that an apply had nothing to do (never "dry run")."""
    actions = [str(a) for a in answer["actions"]]
    if answer["applied"]:
        head = "applied:"
    elif not apply:
        head = "dry run (use --apply to make these changes):"
    elif actions in ([], [NOTHING_TO_REPAIR]):
        return f"{NOTHING_TO_REPAIR}; nothing changed"
    else:
        head = "nothing changed:"  # only what repair cannot fix
    return "\n".join([head, *(f"  {line}" for line in actions)])


SHAPES = {
    "status": ("counts", "enis"),
    "allocations": ("allocations",),
    "intents": ("intents",),
    "enis": ("enis",),
    "repair": ("applied", "actions"),
}
"""The fields each command's answer must have: another HTTP service's 200 is not taken for ipamd's."""


def _shaped(command: str, answer: object) -> bool:
    return isinstance(answer, dict) and all(k in answer for k in SHAPES[command])


def _not_ipamd(args: argparse.Namespace, detail: str) -> int:
    message = f"something answers at {args.socket}, but it is not ipamd: {detail}\n{NOT_IPAMD_HINT}"
    return _fail(args, "unreachable", message, 2, "not_ipamd")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader went away (`ipamctl allocations | head`): not an error of ipamctl's. Point
        # stdout at /dev/null so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _fail(
    args: argparse.Namespace, code: str, message: str, exit_code: int, reason: str | None = None
) -> int:
    if args.json:
        error = {"code": code, **({"reason": reason} if reason else {}), "message": message}
        print(json.dumps({"error": error}, indent=2))
    else:
        print("\n".join(f"ipamctl: {line}" for line in message.splitlines()), file=sys.stderr)
    return exit_code


MAKE_RUN_SOCKET = "./.run/ipamd.sock"
"""Where `make run` (`ipamd run --embedded`) serves, relative to the clone it runs in."""
START_HINT = "is ipamd running? (`ipamd run`, or `make run` for the embedded cloud)"
NOT_IPAMD_HINT = (
    f"ipamd serves its IPAMD_SOCKET (default {DEFAULT_SOCKET}): give that path with --socket "
    "or $IPAMD_SOCKET"
)


def _owner(st: os.stat_result) -> str:
    """`user:group` of a file, by name where the system knows them."""
    try:
        user = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        user = str(st.st_uid)
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    return f"{user}:{group}"


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "a special file"


def diagnose(socket_path: str, err: Unreachable, timeout: float, command: str) -> tuple[str, str]:
    """Why ipamd at `socket_path` was not reached, as (reason, message): nothing there, not a
    socket, nobody listening, permission denied, or something there that does not answer as ipamd.
    `command`: ipamctl's, for the command line it suggests."""
    cause = err.cause
    if isinstance(cause, TimeoutError):
        return "no_answer", (
            f"{socket_path} did not answer within {timeout:g} s: ipamd is stuck or overloaded, "
            f"or what listens there is not ipamd\n{NOT_IPAMD_HINT}"
        )
    if err.connected and isinstance(cause, OSError):
        return "no_answer", (
            f"the connection to {socket_path} broke off ({cause.strerror or cause}): ipamd "
            "stopped while answering (run ipamctl again), or what listens there is not ipamd"
        )
    if err.connected:
        return "not_ipamd", (
            f"something answers at {socket_path}, but it is not ipamd: {cause}\n{NOT_IPAMD_HINT}"
        )
    return _not_connected(socket_path, cause, command)


def _not_connected(socket_path: str, cause: Exception | None, command: str) -> tuple[str, str]:
    """Why connect() failed, from its error and what is at the path now."""
    code = cause.errno if isinstance(cause, OSError) else None
    try:
        st = os.stat(socket_path)
    except (FileNotFoundError, NotADirectoryError):
        return "no_such_file", _no_such_file(socket_path, command)
    except PermissionError:
        return "permission_denied", (
            f"permission denied: uid {os.getuid()} cannot reach {socket_path} (a directory on "
            "its path is not searchable)\nrun ipamctl as root, or as the daemon's user"
        )
    except OSError as stat_err:
        return "unreachable", f"cannot connect to {socket_path}: {stat_err.strerror}"
    if code in (errno.ENOENT, errno.ENOTDIR):
        return "no_such_file", _no_such_file(socket_path, command)
    if not stat.S_ISSOCK(st.st_mode):
        return (
            "not_a_socket",
            f"{socket_path} is {_kind(st.st_mode)}, not a socket\n{NOT_IPAMD_HINT}",
        )
    if code in (errno.EACCES, errno.EPERM):
        return "permission_denied", (
            f"permission denied on {socket_path} (owner {_owner(st)}, mode "
            f"{stat.S_IMODE(st.st_mode):04o}; ipamctl runs as uid {os.getuid()})\n"
            "run ipamctl as root, or as a member of the socket's group"
        )
    if code == errno.ECONNREFUSED:
        return "not_running", (
            f"ipamd is not running: nothing listens on {socket_path}, a socket left behind by a "
            "daemon that was killed (or one still starting)\n"
            "start it (`ipamd run`, or `make run` for the embedded cloud), or see why it stopped "
            "in its log"
        )
    detail = cause.strerror if isinstance(cause, OSError) and cause.strerror else str(cause)
    return "unreachable", f"cannot connect to {socket_path}: {detail}"


def _no_such_file(socket_path: str, command: str) -> str:
    lines = [f"no such file: nothing at {socket_path}", START_HINT]
    here = os.path.abspath(MAKE_RUN_SOCKET)
    if os.path.abspath(socket_path) != here and os.path.exists(here):
        lines.append(
            f"`make run` serves {MAKE_RUN_SOCKET} here: ipamctl --socket {MAKE_RUN_SOCKET} {command}"
        )
    return "\n".join(lines)


def _main(argv: Sequence[str] | None) -> int:
    parser = argparse.ArgumentParser(prog="ipamctl", description="Inspect a running ipamd")
    parser.add_argument(
        "--socket",
        default=os.environ.get("IPAMD_SOCKET", DEFAULT_SOCKET),
        help=f"the daemon's socket (default: $IPAMD_SOCKET or {DEFAULT_SOCKET})",
    )
    parser.add_argument("--json", action="store_true", help="print the API's JSON answer")
    parser.add_argument("--version", action="version", version=f"ipamctl {installed()}")
    parser.add_argument("command", choices=(*PATHS, "repair"))
    parser.add_argument(
        "--apply", action="store_true", help="repair: make the changes (default: a dry run)"
    )
    args = parser.parse_args(argv)
    timeout = REPAIR_TIMEOUT_S if args.command == "repair" else TIMEOUT_S
    try:
        if args.command == "repair":
            path = f"{PATH_REPAIR}?apply=true" if args.apply else PATH_REPAIR
            answer = call(args.socket, "POST", path, {}, timeout=timeout)
        else:
            answer = call(args.socket, "GET", PATHS[args.command], timeout=timeout)
    except Unreachable as err:
        reason, message = diagnose(args.socket, err, timeout, args.command)
        return _fail(args, "unreachable", message, 2, reason)
    except DaemonError as err:
        return _fail(args, err.body.code, str(err), 1)
    except BadAnswer as err:
        return _not_ipamd(args, str(err))
    if not _shaped(args.command, answer):
        return _not_ipamd(args, f"an answer without {' and '.join(SHAPES[args.command])}")
    unusable = answer.get("state_unavailable") if isinstance(answer, dict) else None
    if unusable and not args.json:
        print(f"ipamctl: ipamd serves no pool: {unusable}", file=sys.stderr)
        return 1
    _print(args, answer)
    # A node that is not ready exits 1 from `status`, for scripts and probes.
    not_ready = (
        args.command == "status" and isinstance(answer, dict) and answer.get("ready") is False
    )
    return 1 if unusable or not_ready else 0


def _print(args: argparse.Namespace, answer: Any) -> None:
    if args.json:
        print(json.dumps(answer, indent=2))
    elif args.command == "status":
        print(render_status(answer))
    elif args.command == "repair":
        print(render_repair(answer, args.apply))
    else:
        print(render_list(answer))
