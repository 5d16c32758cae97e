"""The CNI network configurations that put pods on ipamd.

- `conflist`: the shipped one's interface plugin (`deploy/cni/10-ipamd.conflist`): `ipamd-cni` as the
  interface plugin (its own conf `type` is `ipamd-cni`), which makes the pod's veth, VPC CNI's way.
  The shipped file also chains `portmap` (hostPort) after it; on a node ipamd itself writes it,
  once ready, from the deployed file (the containerd and emulated-VPC tests run exactly that, with
  portmap in their CNI bin dirs); this module gives the interface plugin's network to the tests
  that exec plugins directly.
- `ptp_conflist`: Debian's (upstream's) `ptp` interface plugin with `ipamd-cni` as its IPAM, which
  ipamd-cni still serves.

The runtime's loopback is part of neither: containerd and CRI-O bring up `lo` themselves with the
`loopback` plugin from the CNI bin dir, which must hold `loopback` and `ipamd-cni` (and `ptp` for
the second).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

CONFLIST_NAME = "10-ipamd.conflist"
"""The file name: conf dirs are read in lexical order and the first network is the pod network."""
NETWORK = "aws-cni"
"""The network name: CNI's `name`, and the `network` of every allocation ipamd holds for it. VPC
CNI's, so that the runtime's cached results of pods adopted from aws-node match."""
CNI_VERSION = "1.0.0"
"""The newest version that Debian bookworm's plugins (1.1.1) and containerd 1.6 speak."""


def _checked(socket: str) -> str:
    if not socket.startswith("/"):
        raise ValueError(f"ipamd's socket must be an absolute path, got {socket!r}")
    return socket


def conflist(socket: str, *, network: str = NETWORK) -> dict[str, object]:
    """The shipped configuration list as a JSON object; `socket` is ipamd's API socket, an
    absolute path."""
    return {
        "cniVersion": CNI_VERSION,
        "name": network,
        "plugins": [
            {
                "type": "ipamd-cni",
                "vethPrefix": "eni",
                "ipam": {"type": "ipamd-cni", "socket": _checked(socket)},
            }
        ],
    }


def ptp_conflist(socket: str, *, network: str = NETWORK) -> dict[str, object]:
    """`ptp` with `ipamd-cni` as its IPAM, as a JSON object."""
    return {
        "cniVersion": CNI_VERSION,
        "name": network,
        "plugins": [{"type": "ptp", "ipam": {"type": "ipamd-cni", "socket": _checked(socket)}}],
    }


def write_conflist(path: Path, socket: str, *, network: str = NETWORK) -> Path:
    """Writes the shipped configuration list to `path` (a file, or a conf dir to write
    `CONFLIST_NAME` in) atomically: a runtime reading the dir never sees half a file. Returns the
    file written."""
    if path.is_dir():
        path = path / CONFLIST_NAME
    staged = path.with_name(f".{path.name}.tmp")
    staged.write_text(json.dumps(conflist(socket, network=network), indent=2) + "\n")
    os.replace(staged, path)
    return path
