"""`ipamd-cni`: the CNI plugin the runtime executes for each pod (CNI spec 1.1).

Two modes, by the conf's own `type` (`ipamd.cni.invocation`):
- the interface plugin (`"type": "ipamd-cni"`, the shipped conflist): ADD, DEL and CHECK also make,
  remove and check the pod's veth, and call the network-policy agent through ipamd
  (`ipamd.cni.pod_plugin`, imported only in this mode);
- the IPAM plugin of another interface plugin such as `ptp`:
  `"ipam": {"type": "ipamd-cni", "socket": "/run/ipamd/ipamd.sock"}`, as the tables below say.

The socket is optional; see `ipamd.cni.invocation` for the environment and config read and the codes
of bad input. It accepts configs of cniVersion 0.4.0, 1.0.0 and 1.1.0 and answers in the config's
version (0.4.0's `ips` carry `version`).

| command | request to ipamd (`{one}` = `{cid}/{ifname}?network=`) | success |
|---|---|---|
| ADD | `POST /v1/allocations` | IPAM result: `ips` [{address, gateway}], `routes` |
| DEL | `DELETE /v1/allocations/{one}` | nothing printed; unknown attachments too |
| CHECK | `GET /v1/allocations/{one}` | ipamd holds the attachment with prevResult's addresses |
| GC | `POST /v1/gc` with `cni.dev/valid-attachments` | ipamd released what is not listed (past grace) |
| STATUS | `GET /readyz` | ipamd is ready |
| VERSION | none (stdin is not read) | `{"cniVersion": "1.1.0", "supportedVersions": [...]}` |

How ipamd's answers become CNI errors, and why a DEL succeeds when ipamd cannot act, is
`ipamd.cni.ipam`'s, which holds the commands.
"""

from __future__ import annotations

import os
import sys
import time

from ipamd.cni import ipam
from ipamd.cni.invocation import (
    CniError,
    parse_conf,
    parse_invocation,
    read_command,
)
from ipamd.cni.logfile import STDERR, PluginLog, Tee
from ipamd.wire import (
    CNI_VERSION,
    SUPPORTED_CNI_VERSIONS,
    dumps,
)

# `typing` and `collections.abc` cost milliseconds at every pod's ADD and DEL; the annotations below
# are never evaluated.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import IO

_INTERFACE_COMMANDS = ("ADD", "DEL", "CHECK")


def _emit(out: IO[str], body: Mapping[str, object]) -> None:
    out.write(dumps(body) + "\n")
    out.flush()


_QUIET = ("CHECK", "STATUS")
"""Commands the runtime repeats on its own schedule (STATUS with each of its status checks): their
success is logged at debug, so that plugin.log holds the pods' ADDs and DELs."""


def run(environ: Mapping[str, str], stdin: IO[bytes], stdout: IO[str], stderr: IO[str]) -> int:
    started = time.monotonic()
    version = CNI_VERSION
    log = PluginLog()
    command = ""
    try:
        command = read_command(environ)
        if command == "VERSION":
            # The answer does not depend on stdin: not reading it keeps VERSION from waiting on a
            # stdin that was never closed.
            supported = list(SUPPORTED_CNI_VERSIONS)
            _emit(stdout, {"cniVersion": CNI_VERSION, "supportedVersions": supported})
            return 0
        conf = parse_conf(command, stdin.read(), environ)
        version = conf.cni_version
        log = PluginLog(*conf.log)
        commands = ipam.COMMANDS
        if conf.interface is not None and command in _INTERFACE_COMMANDS:
            # Imported only here: the IPAM plugin's start stays as cheap as it was.
            from ipamd.cni import pod_plugin

            commands = pod_plugin.COMMANDS
        inv = parse_invocation(command, conf, environ)
        if log.enabled("debug"):
            log.event("debug", "cni.request", command=command, **_request(environ))
        # What the commands warn about on stderr (a DEL ipamd did not confirm, a veth left behind)
        # also goes to the log; not twice when the log is stderr itself.
        warnings = stderr if log.path in ("", STDERR) else Tee(stderr, log)
        result = commands[command](inv, warnings)
    except CniError as err:
        version = err.version or version
        error: dict[str, object] = {"cniVersion": version, "code": err.code, "msg": err.msg}
        if err.details:
            error["details"] = err.details
        _emit(stdout, error)
        if not log.path:
            log = PluginLog(*err.log)
        _outcome(log, command, environ, started, None, err)
        return 1
    if result is not None:
        _emit(stdout, result)
    _outcome(log, command, environ, started, result, None)
    return 0


def _request(environ: Mapping[str, str]) -> dict[str, object]:
    """The attachment the runtime names, as it named it (also when it is not valid)."""
    fields: dict[str, object] = {}
    for key, name in (
        ("container_id", "CNI_CONTAINERID"),
        ("ifname", "CNI_IFNAME"),
        ("netns", "CNI_NETNS"),
        ("args", "CNI_ARGS"),
    ):
        if environ.get(name):
            fields[key] = environ[name][:512]
    args = dict(item.partition("=")[::2] for item in environ.get("CNI_ARGS", "").split(";"))
    if args.get("K8S_POD_NAME"):
        fields["pod"] = f"{args.get('K8S_POD_NAMESPACE', '')}/{args['K8S_POD_NAME']}"[:512]
    return fields


def _outcome(
    log: PluginLog,
    command: str,
    environ: Mapping[str, str],
    started: float,
    result: Mapping[str, object] | None,
    error: CniError | None,
) -> None:
    """One line per command: what was asked, what came of it, how long it took."""
    if error is None:
        level = "debug" if command in _QUIET else "info"
    else:
        level = "warn" if command == "STATUS" else "error"
    if not command or not log.enabled(level):
        return
    fields = _request(environ)
    fields.pop("args", None)
    if result is not None:
        ips = result.get("ips")
        if isinstance(ips, list):
            fields["addresses"] = [ip.get("address") for ip in ips if isinstance(ip, dict)]
    if error is not None:
        fields["code"] = error.code
        fields["error"] = error.msg
        if error.details:
            fields["details"] = error.details
    fields["elapsed_ms"] = round((time.monotonic() - started) * 1000, 1)
    name = f"cni.{command.lower()}" + ("_failed" if error is not None else "")
    log.event(level, name, **fields)


def main() -> int:
    return run(os.environ, sys.stdin.buffer, sys.stdout, sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
