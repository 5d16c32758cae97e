"""`ipamd-cni`: the CNI IPAM plugin the runtime executes for each pod (CNI spec 1.1).

VERSION is answered here. ADD, DEL, CHECK, GC and STATUS talk to the daemon's local API, which this
build does not include yet: they answer with a CNI error saying so, and a non-zero exit.
"""

from __future__ import annotations

import json
import os
import sys

from ipamd.wire import CNI_VERSION, SUPPORTED_CNI_VERSIONS

ERROR_UNSUPPORTED = 100  # plugin-specific code (CNI reserves 0-99 for the spec)
ERROR_INVALID_ENV = 4


def _error(code: int, msg: str, details: str = "") -> int:
    body = {"cniVersion": CNI_VERSION, "code": code, "msg": msg}
    if details:
        body["details"] = details
    print(json.dumps(body))
    return 1


def main() -> int:
    command = os.environ.get("CNI_COMMAND", "")
    if command == "VERSION":
        print(
            json.dumps(
                {"cniVersion": CNI_VERSION, "supportedVersions": list(SUPPORTED_CNI_VERSIONS)}
            )
        )
        return 0
    if command in {"ADD", "DEL", "CHECK", "GC", "STATUS"}:
        return _error(
            ERROR_UNSUPPORTED,
            f"{command} is not available in this build",
            "the local API of the ipamd daemon is not included yet",
        )
    return _error(ERROR_INVALID_ENV, f"unknown or missing CNI_COMMAND {command!r}")


if __name__ == "__main__":
    sys.exit(main())
