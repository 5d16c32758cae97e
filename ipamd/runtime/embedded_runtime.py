"""The container runtime of `ipamd run --embedded` (`EmbeddedCri`): a `CriServer` whose sandboxes are
the pods the embedded node's ADDs started, kept in a file of its own as a real runtime keeps its
metadata, so that they outlive the process and ipamd's state file alike.

A sandbox is recorded when an ADD is answered, with the addresses the answer gave the pod (what a
runtime reports as the pod's IPs: PodSandboxStatus's network, which repair rebuilds a lost state file
from), and forgotten at its DEL; `ipamd.node.embedded` tells it both. A sandbox ID written in the
*gone file* (one ID a line, e.g. `echo demo-1a2b >> .run/state/embedded-cri-gone`) is a pod that
disappeared behind ipamd's back, whose DEL never came: the runtime forgets it at its next answer.
Two listings later, and once older than IPAMD_LEAK_GRACE, leak GC releases its address; `ipamctl
repair` shows that at once. The runtime never reads ipamd's state, never writes the gone file, and
answers the lifecycle calls UNIMPLEMENTED: its pods are started by ADD, not by RunPodSandbox.

The record (`sandboxes.json`, in the runtime's directory beside its socket) is read once, by `load`
once the socket is bound (every call answers UNAVAILABLE until then), and replaced whole on each
change (`datastore.atomic`: temp file, fsync, rename), so a kill at any instant leaves the old record
or the new. A record that cannot be read stops the start (`SandboxRecordError`) rather than losing
its pods; a change that cannot be saved is logged and kept in memory, listed until the runtime stops.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Final

from datastore import atomic
from ipamd.model import PodRef
from ipamd.runtime.embedded_cri import CriSandbox, CriServer, to_ns

logger = logging.getLogger(__name__)

RECORD_FILE: Final = "sandboxes.json"
"""The record's name in the runtime's directory."""
RECORD_VERSION: Final = 1


class SandboxRecordError(Exception):
    """The runtime's record cannot be read: the message names the file and why."""


class EmbeddedCri(CriServer):
    """The runtime of `ipamd run --embedded`: the sandboxes of its record, less the gone file."""

    lifecycle = False

    def __init__(self, socket_path: Path, record_file: Path, gone_file: Path) -> None:
        super().__init__(socket_path)
        self.record_file = record_file
        self.gone_file = gone_file
        self.kept = False
        """Whether `load` found a record; False for a new node, or for one made before the runtime
        kept a record."""
        self._loaded = False

    def load(self) -> None:
        """Read the record, once, before anything is told; raises `SandboxRecordError`."""
        kept = load_record(self.record_file)
        self.kept = kept is not None
        self.sandboxes.update(kept or {})
        self._loaded = True

    # -- what the embedded node tells it ----------------------------------------------------------

    def started(
        self, sandbox_id: str, addresses: Sequence[str], created_at: float, pod: PodRef | None
    ) -> None:
        """An ADD gave the sandbox `addresses` (another interface's ADD adds to them); a sandbox
        not yet recorded is made, created at `created_at` (seconds since the epoch)."""
        self._loaded_first()
        had = self.sandboxes.get(sandbox_id)
        if had is None:
            pod = pod or PodRef()
            self.sandboxes[sandbox_id] = CriSandbox(
                sandbox_id=sandbox_id,
                created_at_ns=to_ns(created_at),
                namespace=pod.namespace,
                name=pod.name,
                uid=pod.uid,
                addresses=tuple(addresses),
            )
        else:
            more = tuple(a for a in addresses if a not in had.addresses)
            if not more:
                return  # a repeated ADD: nothing new
            had.addresses = (*had.addresses, *more)
        self._save()

    def adopt(self, sandboxes: Iterable[CriSandbox]) -> None:
        """Record the sandboxes not recorded yet, in one save."""
        self._loaded_first()
        new = [s for s in sandboxes if s.sandbox_id not in self.sandboxes]
        if new:
            self.sandboxes.update((s.sandbox_id, s) for s in new)
            self._save()

    def remove(self, sandbox_id: str) -> None:
        """The sandbox is gone (its DEL came). Idempotent."""
        self._loaded_first()
        if self.sandboxes.pop(sandbox_id, None) is not None:
            self._save()

    # -- what the calls are answered from ---------------------------------------------------------

    def gone(self) -> frozenset[str]:
        """The sandbox IDs in the gone file (none if it is missing or unreadable)."""
        try:
            text = self.gone_file.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return frozenset()
        return frozenset(line.strip() for line in text.splitlines() if line.strip())

    def listing(self) -> list[CriSandbox] | None:
        if not self._loaded:
            return None
        vanished = self.gone() & self.sandboxes.keys()
        if vanished:
            for sandbox_id in vanished:
                del self.sandboxes[sandbox_id]
            logger.info("cri.sandboxes_gone ids=%s", sorted(vanished))
            self._save()
        return list(self.sandboxes.values())

    def status_of(self, sandbox_id: str) -> CriSandbox | None:
        if self.listing() is None:
            return None
        return self.sandboxes.get(sandbox_id)

    def _loaded_first(self) -> None:
        """A change before `load` would be saved over the record: refused."""
        if not self._loaded:
            raise RuntimeError("the runtime's record is changed only once it was loaded")

    def _save(self) -> None:
        data = record_bytes(self.sandboxes.values())
        try:
            try:
                atomic.replace(self.record_file, data, 0o600)
            except FileNotFoundError:
                self.record_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                atomic.replace(self.record_file, data, 0o600)
        except OSError as err:
            logger.warning(
                "cri.record_unsaved path=%s error=%s (kept in memory until the runtime stops)",
                self.record_file,
                err,
            )


def record_bytes(sandboxes: Iterable[CriSandbox]) -> bytes:
    """The record's contents: its version and each sandbox, in creation order."""
    items = [
        {
            "id": s.sandbox_id,
            "created_at_ns": s.created_at_ns,
            "namespace": s.namespace,
            "name": s.name,
            "uid": s.uid,
            "addresses": list(s.addresses),
        }
        for s in sandboxes
    ]
    return (json.dumps({"version": RECORD_VERSION, "sandboxes": items}, indent=1) + "\n").encode()


def load_record(path: Path) -> dict[str, CriSandbox] | None:
    """The sandboxes recorded at `path` by ID, in creation order; None when there is no record yet.
    Raises `SandboxRecordError`."""
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise SandboxRecordError(f"the embedded runtime's record {path}: {err}") from err
    try:
        return _parse(json.loads(text))
    except (ValueError, TypeError, KeyError) as err:
        raise SandboxRecordError(
            f"the embedded runtime's record {path} is unusable: {err}"
        ) from err


def _parse(document: object) -> dict[str, CriSandbox]:
    if not isinstance(document, dict) or document.get("version") != RECORD_VERSION:
        raise ValueError(f"not a record of version {RECORD_VERSION}")
    found: dict[str, CriSandbox] = {}
    for item in document["sandboxes"]:
        sandbox = CriSandbox(
            sandbox_id=_text(item, "id"),
            created_at_ns=_integer(item, "created_at_ns"),
            namespace=_text(item, "namespace"),
            name=_text(item, "name"),
            uid=_text(item, "uid"),
            addresses=tuple(_texts(item, "addresses")),
        )
        if not sandbox.sandbox_id or sandbox.sandbox_id in found:
            raise ValueError(f"a sandbox ID empty or twice: {sandbox.sandbox_id!r}")
        found[sandbox.sandbox_id] = sandbox
    return found


def _text(item: dict[str, object], name: str) -> str:
    value = item[name]
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, not {value!r}")
    return value


def _integer(item: dict[str, object], name: str) -> int:
    value = item[name]
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, not {value!r}")
    return value


def _texts(item: dict[str, object], name: str) -> list[str]:
    value = item[name]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"{name} must be a list of strings, not {value!r}")
    return value
