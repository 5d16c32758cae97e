"""The node's CNI conflist, written by ipamd itself: atomically, only once the daemon is ready, and
removed on a clean stop. The kubelet reads a conflist as "the network is ready", so it must never
appear before ipamd can serve an ADD (VPC CNI's entrypoint does the same).

The file is the template (`IPAMD_CNI_CONFLIST_TEMPLATE`) with every `ipamd-cni` plugin's socket set to
this daemon's, and with VPC CNI's keys for the plugin's log, `pluginLogFile` and `pluginLogLevel`
(`AWS_VPC_K8S_PLUGIN_LOG_FILE`, `AWS_VPC_K8S_PLUGIN_LOG_LEVEL`), as VPC CNI's entrypoint writes
them into `10-aws.conflist`: the runtime runs the plugin on the node, and that is how it learns
where to log. A stop removes the file only if it still holds what this process wrote, so a newer
ipamd's file survives an older one's exit.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from datastore import atomic
from ipamd.config.settings import Config
from ipamd.node.family import family_of
from ipamd.wire.pod import V4_EGRESS_CIDR, V4_EGRESS_IFNAME

logger = logging.getLogger(__name__)


class ConflistError(ValueError):
    """The template cannot be used; names the file and why."""


def render_for(config: Config) -> bytes | None:
    """The conflist ipamd writes once ready, as `config` asks (None: it writes none). Raises
    `ConflistError`."""
    if config.conflist.template is None:
        return None
    return render(
        Path(config.conflist.template),
        config.endpoints.socket_path,
        config.conflist.pod_mtu or config.datapath.eni_mtu,
        family_of(config).egress_dir(Path(config.endpoints.socket_path).parent),
        plugin_log=(config.conflist.plugin_log_file, config.conflist.plugin_log_level),
    )


def render(
    template: Path,
    socket_path: str,
    mtu: int | None = None,
    v4_egress_dir: str | None = None,
    *,
    plugin_log: tuple[str, str] | None = None,
) -> bytes:
    """The template with every `ipamd-cni` plugin's socket set, and with `mtu` (POD_MTU) on each
    plugin that uses it (the interface plugin gives the pod's veth that MTU). `v4_egress_dir`
    (IPv6 mode): the interface plugin also gives each pod IPv4 egress (`v4Egress`: the pod's
    interface, the range and host-local's data directory, this path). `plugin_log`: the plugin's
    log file (a path, made absolute, or `stderr`) and level, as `pluginLogFile` and
    `pluginLogLevel` of each plugin that uses ipamd-cni."""
    try:
        conf = json.loads(template.read_text())
    except (OSError, ValueError) as err:
        raise ConflistError(f"{template}: cannot read a JSON conflist: {err}") from err
    plugins = conf.get("plugins") if isinstance(conf, dict) else None
    ours = [
        p
        for p in plugins or []
        if isinstance(p, dict)
        and isinstance(p.get("ipam"), dict)
        and p["ipam"].get("type") == "ipamd-cni"
    ]
    if not ours:
        raise ConflistError(f"{template}: no plugin in `plugins` has ipam type ipamd-cni")
    for plugin in ours:
        plugin["ipam"]["socket"] = os.path.abspath(socket_path)
        if mtu is not None:
            plugin["mtu"] = mtu
        if plugin_log is not None:
            path, level = plugin_log
            plugin["pluginLogFile"] = path if path == "stderr" else os.path.abspath(path)
            plugin["pluginLogLevel"] = level
        if v4_egress_dir is not None and plugin.get("type") == "ipamd-cni":
            plugin["v4Egress"] = {
                "ifname": V4_EGRESS_IFNAME,
                "subnet": V4_EGRESS_CIDR,
                "dataDir": os.path.abspath(v4_egress_dir),
            }
    return (json.dumps(conf, indent=2) + "\n").encode()


def write(conf_dir: Path, name: str, data: bytes) -> Path:
    """Write `conf_dir/name` atomically (`datastore.atomic`: libcni ignores the hidden temp file)."""
    target = conf_dir / name
    conf_dir.mkdir(parents=True, exist_ok=True)
    atomic.replace(target, data)
    logger.info("cni.conflist_written path=%s", target)
    return target


def remove(target: Path, reason: str, only_if: bytes | None = None) -> None:
    """Remove the conflist; with `only_if`, only while it holds exactly those bytes."""
    try:
        if only_if is not None and target.read_bytes() != only_if:
            return
        target.unlink()
    except FileNotFoundError:
        return
    logger.info("cni.conflist_removed path=%s reason=%s", target, reason)


AWS_NODE_CONFLIST = "10-aws.conflist"
"""aws-node's conflist (VPC CNI's entrypoint writes it into the same conf dir)."""


def remove_aws_node(own: Path) -> Path | None:
    """Remove aws-node's conflist from the directory ipamd just wrote `own` into; the path removed,
    or None (absent, or `own` is that very file).

    Why: the runtime (libcni) takes the first conflist by name, and `10-aws.conflist` sorts before
    ipamd's, so ADDs would keep going to VPC CNI's plugin, whose ipamd no longer answers. Only once
    ipamd's own is written, so the directory never holds no network (the kubelet would call the
    node not ready).

    No copy is kept: aws-node writes its conflist afresh from its own template whenever it starts,
    so a rollback needs none, and a copy in the directory would itself be read as a network unless
    renamed to an extension libcni skips, where it would only go stale. The file's contents are
    logged instead (`cni.aws_node_conflist_removed`), for whoever wants to see what was there."""
    target = own.parent / AWS_NODE_CONFLIST
    if own.name == AWS_NODE_CONFLIST:
        return None
    try:
        data = target.read_bytes()
        target.unlink()
    except FileNotFoundError:
        return None
    except OSError as err:
        logger.warning("cni.aws_node_conflist_unremoved path=%s error=%s", target, err)
        return None
    logger.warning(
        "cni.aws_node_conflist_removed path=%s contents=%s",
        target,
        data.decode(errors="replace").replace("\n", " "),
    )
    return target
