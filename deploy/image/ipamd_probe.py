"""Kubelet's exec probe of ipamd: `GET` one path of ipamd's local API on its unix socket.

ipamd serves its API only on a unix socket (`IPAMD_SOCKET`), and kubelet's HTTP probes speak TCP,
so the DaemonSet's probes exec this script in the ipamd container:

    python -I /opt/ipamd/bin/ipamd_probe.py /readyz    readiness: restored and first EC2 reconcile done
    python -I /opt/ipamd/bin/ipamd_probe.py /healthz   liveness: the process answers on its socket

Exit 0 on HTTP 200; otherwise exit 1 with one line saying why, which kubelet puts in the pod's
events. Stdlib only, one request, bounded by `TIMEOUT_S` (below the probe's timeoutSeconds, so the
script's own message reaches kubelet rather than a timeout). The socket path is the container's
`IPAMD_SOCKET`, ipamd's default when unset.
"""

from __future__ import annotations

import http.client
import os
import socket
import sys

DEFAULT_SOCKET = "/run/ipamd/ipamd.sock"
TIMEOUT_S = 4.0
PATHS = ("/healthz", "/readyz")


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def probe(socket_path: str, path: str, timeout_s: float = TIMEOUT_S) -> tuple[bool, str]:
    """Whether ipamd answered `GET path` with 200, and a line saying what happened."""
    connection = UnixConnection(socket_path, timeout_s)
    try:
        connection.request("GET", path, headers={"Connection": "close"})
        response = connection.getresponse()
        body = response.read(512).decode("utf-8", "replace").strip()
    except (OSError, http.client.HTTPException) as err:
        return False, f"ipamd at {socket_path}: {type(err).__name__}: {err}"
    finally:
        connection.close()
    if response.status == 200:
        return True, f"GET {path}: 200"
    return False, f"GET {path}: {response.status} {body}"


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1] not in PATHS:
        print(f"usage: ipamd_probe.py {'|'.join(PATHS)}", file=sys.stderr)
        return 2
    ok, line = probe(os.environ.get("IPAMD_SOCKET") or DEFAULT_SOCKET, argv[1])
    print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
