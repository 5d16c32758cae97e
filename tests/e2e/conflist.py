"""The CNI network configuration that puts pods on ipamd: Debian's (upstream's) `ptp` interface plugin
with `ipamd-cni` as its IPAM.

On a node ipamd itself writes it, once ready, from `deploy/cni/10-ipamd.conflist` (the containerd test
runs exactly that); this module gives the same network to the tests that exec `ptp` directly. The
runtime's loopback is not part of it: containerd and CRI-O bring up `lo` themselves with the
`loopback` plugin from the CNI bin dir, which must hold `loopback`, `ptp` and `ipamd-cni`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

CONFLIST_NAME = "10-ipamd.conflist"
"""The file name: conf dirs are read in lexical order and the first network is the pod network."""
NETWORK = "ipamd"
"""The network name: CNI's `name`, and the `network` of every allocation ipamd holds for it."""
CNI_VERSION = "1.0.0"
"""The newest version that Debian bookworm's plugins (1.1.1) and containerd 1.6 speak."""


def conflist(socket: str, *, network: str = NETWORK) -> dict[str, object]:
    """The configuration list as a JSON object; `socket` is ipamd's API socket, an absolute path."""
    if not socket.startswith("/"):
        raise ValueError(f"ipamd's socket must be an absolute path, got {socket!r}")
    return {
        "cniVersion": CNI_VERSION,
        "name": network,
        "plugins": [
            {
                "type": "ptp",
                "ipam": {"type": "ipamd-cni", "socket": socket},
            }
        ],
    }


def write_conflist(path: Path, socket: str, *, network: str = NETWORK) -> Path:
    """Writes the configuration list to `path` (a file, or a conf dir to write `CONFLIST_NAME` in)
    atomically: a runtime reading the dir never sees half a file. Returns the file written."""
    if path.is_dir():
        path = path / CONFLIST_NAME
    staged = path.with_name(f".{path.name}.tmp")
    staged.write_text(json.dumps(conflist(socket, network=network), indent=2) + "\n")
    os.replace(staged, path)
    return path
