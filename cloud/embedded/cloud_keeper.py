"""A kept world: the embedded cloud of `ipamd run --embedded`, which outlives the process in a file.

`start_kept_world(path, ...)` rebuilds the world recorded at `path` (same VPC, subnet, instance, ENIs,
MACs, attachments, addresses, prefixes, tags) or, with no file, builds a new one; then `CloudKeeper`
saves it to `path` whenever an EC2 request changed it. It owns that file and the save's timing; it
must not decide anything about the node.

When to save, and why it is kill -9 safe: the daemon's state file records only what EC2 answered, so
the cloud file must hold every change before the answer reaches the daemon. The keeper wraps the
loopback server's WSGI app: after moto handled a request and before its answer is sent, the world is
read and, if it differs from what was last saved, written (temp file, fsync, rename). A kill at any
instant then leaves a cloud file that holds at least what the daemon was told. It may hold more (the
answer was lost): EC2's view is authoritative, so ipamd's drift reconcile adopts the extra address,
and ENI GC collects an ENI that was created but never attached. If the save fails, the answer is
replaced by EC2's InternalError (HTTP 500), which ipamd treats as an outcome it must re-read, and
every later answer is refused the same way until a save succeeds.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from botocore.exceptions import BotoCoreError, ClientError
from moto.ec2.exceptions import EC2ClientError

from cloud.embedded import cloud_file
from cloud.embedded.cloud_file import CloudFacts, CloudFileError
from cloud.embedded.cloud_restore import RebuildError, capture, rebuild
from cloud.embedded.world import EmbeddedEc2, World
from cloud.embedded.world_layout import Layout
from datastore import atomic

logger = logging.getLogger(__name__)

CLOUD_FILE: Final = "embedded-cloud.json"
"""Its name in the state directory."""

_SAVE_FAILED_BODY: Final = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>InternalError</Code>'
    b"<Message>The embedded cloud could not save its state; the change may or may not have been "
    b"made.</Message></Error></Errors><RequestID>embedded-cloud-save</RequestID></Response>"
)

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class CloudKeeper:
    """Saves one world to its file when a request changed it, before the request is answered."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.saves = 0
        """Writes made (a request that changed nothing writes nothing)."""
        self._world: World | None = None
        self._saved: str | None = None
        self._stopped = False
        self._lock = threading.RLock()

    def watch(self, world: World) -> None:
        """Keep `world` from now on; saves it at once. Raises `CloudFileError`."""
        self._world = world
        self.save()

    def save(self) -> None:
        """Write the world if it changed since the last save. Raises `CloudFileError`."""
        world = self._world
        if world is None:
            return
        with self._lock:
            try:
                text = capture(world).to_json()
            except EC2ClientError as err:
                # The world is gone (moto reset behind our back): keep the last good file.
                logger.warning("embedded.cloud_not_saved reason=%s", err)
                return
            if text == self._saved:
                return
            cloud_file.save(self.path, text)
            self._saved = text
            self.saves += 1

    def stop(self) -> None:
        """A last save (a clean stop); from now on every request is refused, since a change could
        no longer be saved (the host wipes moto's state next)."""
        with self._lock:
            try:
                self.save()
            except CloudFileError as err:
                logger.error("embedded.cloud_not_saved reason=%s", err)
            self._world = None
            self._stopped = True

    def wrap(self, app: WsgiApp) -> WsgiApp:
        """The WSGI app that answers as `app` does, once the world it changed is saved."""

        def serve(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
            held: list[Any] = []
            chunks: list[bytes] = []

            def hold(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
                held[:] = [status, headers, exc_info]
                return chunks.append

            # One request at a time: a capture never reads a change another request is still
            # making (not every moto operation takes our extension's lock).
            with self._lock:
                if self._stopped:
                    # A call still in flight when the daemon stopped: answered unsaved, it could
                    # reach a state file the next start's cloud knows nothing of.
                    return _refuse(start_response)
                result = app(environ, hold)
                try:
                    chunks.extend(result)
                finally:
                    close = getattr(result, "close", None)
                    if close is not None:
                        close()
                try:
                    self.save()
                except CloudFileError as err:
                    logger.error("embedded.cloud_save_failed error=%s", err)
                    return _refuse(start_response)
            start_response(*held)
            return chunks

        return serve


def _refuse(start_response: StartResponse) -> list[bytes]:
    headers = [("Content-Type", "text/xml"), ("Content-Length", str(len(_SAVE_FAILED_BODY)))]
    start_response("500 Internal Server Error", headers)
    return [_SAVE_FAILED_BODY]


@dataclass
class KeptWorld:
    host: EmbeddedEc2
    world: World
    keeper: CloudKeeper
    restored: bool
    """True if the world was rebuilt from its file (a restart of the same node)."""
    notes: tuple[str, ...] = ()
    """What the file decided against the caller's wishes (instance type, region)."""

    def close(self) -> None:
        self.keeper.stop()
        self.host.close()


def start_kept_world(
    path: Path,
    instance_type: str,
    region: str,
    *,
    subnet_cidr: str = "10.0.0.0/16",
    layout: Layout | None = None,
) -> KeptWorld:
    """The world recorded at `path`, rebuilt on a loopback server, or a new one saved there (the
    node's subnet `subnet_cidr`, with `layout`'s extras). The file's instance type, region and
    subnets win over the arguments: a node keeps its type and its VPC. Raises `CloudFileError`
    (unreadable file, a record moto would not rebuild, a save that failed); a new world's
    `LayoutError` is raised as it is."""
    atomic.remove_leftovers(path)
    facts = cloud_file.load(path)
    keeper = CloudKeeper(path)
    host = EmbeddedEc2("server", wrap_app=keeper.wrap).start()
    try:
        notes: tuple[str, ...] = ()
        if facts is None:
            world = host.world(instance_type, region, subnet_cidr, layout=layout)
        else:
            try:
                world = rebuild(host, facts)
            except (RebuildError, ClientError, BotoCoreError) as err:
                raise CloudFileError(path, f"cannot be rebuilt ({err})") from err
            notes = tuple(
                f"{name} {wanted} ignored: this node is {had} (remove {path} for a new node)"
                for name, wanted, had in (
                    ("IPAMD_EMBEDDED_INSTANCE_TYPE", instance_type, facts.instance_type),
                    ("AWS_REGION", region, facts.region),
                )
                if wanted != had
            )
            if layout is not None and not _recorded(layout, facts):
                notes += (
                    f"the embedded subnet layout ignored: this node's VPC is as {path} has it",
                )
        keeper.watch(world)
    except BaseException:
        host.close()
        raise
    return KeptWorld(host, world, keeper, facts is not None, notes)


def _recorded(layout: Layout, facts: CloudFacts) -> bool:
    """Whether the file's VPC begins as `layout` would have built it (subnets made since by
    CreateSubnet come after the layout's)."""
    wanted = [
        (
            str(ipaddress.IPv4Network(s.cidr)),
            s.zone_in(facts.region, facts.availability_zone),
            s.tags,
        )
        for s in layout.subnets
    ]
    had = [(s.cidr, s.availability_zone, s.tags) for s in facts.subnets[: len(wanted)]]
    return (
        layout.secondary_cidrs == facts.secondary_cidrs
        and wanted == had
        and dict(layout.node_subnet_tags) == dict(facts.subnet_tags)
    )
