"""The node's reverse-path filter, as the replies of inbound connections to pods need it.

Why it matters: a connection to a NodePort or hostPort arrives on the primary ENI's link and is
DNATed to a pod. When the pod's address is on a secondary ENI, the kernel's reverse-path check of
that packet looks up the route back to the client from the pod's address, finds the pod's
`from <pod> lookup <ENI table>` rule and so the secondary ENI's link, not the one the packet came in
by: with strict filtering (`rp_filter` 1) the packet is dropped before it reaches the pod. Loose
filtering (2), which VPC CNI's init container and ipamd's `host-sysctls` set on the primary
interface, or none (0), lets it through. The kernel applies the higher of `all` and the interface's
value, so either being 1 with the other 0 is strict.

Reads `/proc/sys/net/ipv4/conf`, which shows the reading process's own network namespace: ipamd runs
in the node's. Every error is a `HostNetError`.
"""

from __future__ import annotations

from pathlib import Path

from ipamd.hostnet.ports import HostNetError

CONF_DIR = Path("/proc/sys/net/ipv4/conf")
STRICT = 1
LOOSE = 2


def _read(path: Path) -> int:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError) as err:
        raise HostNetError(f"cannot read {path}: {err}") from err


def read_rp_filter(ifname: str, conf_dir: Path = CONF_DIR) -> int:
    """The reverse-path filtering the kernel applies to packets arriving on `ifname`: the higher
    of `conf/all/rp_filter` and `conf/<ifname>/rp_filter` (0 off, 1 strict, 2 loose)."""
    if not ifname or "/" in ifname or ifname in (".", ".."):
        raise HostNetError(f"not a link name: {ifname!r}")
    return max(_read(conf_dir / "all" / "rp_filter"), _read(conf_dir / ifname / "rp_filter"))
