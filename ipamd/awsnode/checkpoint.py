"""VPC CNI's checkpoint file (`/var/run/aws-node/ipam.json`, format `vpc-cni-ipam/1`): parsed
strictly, written atomically.

The format, as aws-node writes and reads it:

    {"version": "vpc-cni-ipam/1",
     "allocations": [{"networkName": "aws-cni", "containerID": "<sandbox ID>", "ifName": "eth0",
                      "ipv4": "10.0.1.23", "allocationTimestamp": <unix ns>,
                      "metadata": {"k8sPodNamespace": "...", "k8sPodName": "...",
                                   "interfacesCount": 1}}]}

Only owned addresses are recorded (no ENIs, free addresses or release times). ipamd's own file adds
one top-level key, `"writer": "ipamd"`: aws-node's decoder ignores keys it does not know, and aws-node
rewriting the file drops it, which is how ipamd tells a file it wrote from one aws-node left.

A file that is not this format (unreadable JSON, another version, the wrong shapes) is refused as a
whole with `CheckpointError`; a single entry that cannot be an allocation (a bad address or
identifier, no address) is skipped and reported, never guessed at. An IPv6 node's entries carry
their /128 in `ipv6` instead of `ipv4`. Nothing here touches the
engine; `ipamd.awsnode.takeover` decides what the entries become.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from datastore import atomic
from datastore.records import AllocationKey, AllocationRecord
from ipamd.wire import WireError, check_container_id, check_ifname, check_network

FORMAT_VERSION = "vpc-cni-ipam/1"
WRITER = "ipamd"
MAX_BYTES = 64 * 1024 * 1024
"""A checkpoint larger than this is not aws-node's (a node holds at most a few hundred pods)."""
INT64_MAX = 2**63 - 1
"""`allocationTimestamp` is a Go int64 of nanoseconds: aws-node's decoder refuses the whole file
when one is beyond it."""


class CheckpointError(ValueError):
    """The file is not a VPC CNI checkpoint ipamd can read; says why."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One pod's address as the checkpoint records it."""

    key: AllocationKey
    address: str
    allocated_at: float
    """Unix seconds (the file's nanoseconds); 0 when the file gave none."""
    namespace: str = ""
    name: str = ""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    entries: tuple[Entry, ...]
    skipped: tuple[str, ...]
    """Why each entry that cannot be an allocation was left out."""
    writer: str
    """`ipamd` for a file ipamd wrote; "" for aws-node's."""

    @property
    def foreign(self) -> bool:
        return self.writer != WRITER


def parse(raw: bytes) -> Checkpoint:
    """The checkpoint in `raw`; raises `CheckpointError` for a file that is not one."""
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as err:
        raise CheckpointError(f"not JSON: {err}") from None
    except RecursionError:
        # Arrays or objects nested deeper than the interpreter recurses: no checkpoint is (Go's
        # decoder refuses them too, past 10,000 levels), and a traceback here is a crash loop.
        raise CheckpointError("not JSON ipamd reads: nested too deeply") from None
    if not isinstance(doc, dict):
        raise CheckpointError("not a JSON object")
    if doc.get("version") != FORMAT_VERSION:
        raise CheckpointError(f"version {doc.get('version')!r}, not {FORMAT_VERSION!r}")
    items = doc.get("allocations")
    if items is None:
        items = []  # aws-node writes `null` for a node without pods
    if not isinstance(items, list):
        raise CheckpointError("`allocations` is not a list")
    entries: list[Entry] = []
    skipped: list[str] = []
    for index, item in enumerate(items):
        try:
            entries.append(_entry(item))
        except (CheckpointError, WireError) as err:
            skipped.append(f"allocations[{index}]: {err}")
    writer = doc.get("writer")
    return Checkpoint(tuple(entries), tuple(skipped), writer if isinstance(writer, str) else "")


def _entry(item: object) -> Entry:
    if not isinstance(item, dict):
        raise CheckpointError("not an object")
    key = AllocationKey(
        check_network(item.get("networkName"), "networkName"),
        check_container_id(item.get("containerID"), "containerID"),
        check_ifname(item.get("ifName"), "ifName"),
    )
    parsed = _address(item)
    stamp = item.get("allocationTimestamp")
    allocated = stamp / 1e9 if isinstance(stamp, int) and not isinstance(stamp, bool) else 0.0
    meta = item.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    return Entry(
        key,
        str(parsed),
        max(allocated, 0.0),
        _text(meta.get("k8sPodNamespace")),
        _text(meta.get("k8sPodName")),
    )


def _address(item: dict[str, object]) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """The entry's one address: `ipv4`, or `ipv6` as aws-node in IPv6 mode writes it."""
    for field, family in (("ipv4", ipaddress.IPv4Address), ("ipv6", ipaddress.IPv6Address)):
        address = item.get(field)
        if isinstance(address, str) and address:
            try:
                return family(address)
            except ValueError:
                what = f"{field} {address!r} is not an IPv{field[-1]} address"
                raise CheckpointError(what) from None
    raise CheckpointError("no ipv4 or ipv6 address")


def _text(value: object) -> str:
    return value if isinstance(value, str) and value.isprintable() and len(value) <= 253 else ""


def render(allocations: Iterable[AllocationRecord]) -> bytes:
    """The checkpoint aws-node would read back for `allocations` (one entry per address)."""
    ordered = sorted(allocations, key=lambda a: (a.created_at, a.key.container_id))
    return document(entries_of(a) for a in ordered)


def entries_of(alloc: AllocationRecord) -> str:
    """The allocation's entries (one per address) as JSON text, comma-separated: the part of the
    file that changes only with the allocation, so a writer can keep it between writes. An IPv6
    address goes in `ipv6`, where aws-node in IPv6 mode reads it, an IPv4 one in `ipv4`."""
    return ",".join(
        json.dumps(
            {
                "networkName": alloc.key.network,
                "containerID": alloc.key.container_id,
                "ifName": alloc.key.ifname,
                ("ipv6" if ":" in address else "ipv4"): address,
                "allocationTimestamp": min(max(int(alloc.created_at * 1e9), 0), INT64_MAX),
                "metadata": {
                    "k8sPodNamespace": alloc.pod_namespace,
                    "k8sPodName": alloc.pod_name,
                    "interfacesCount": 1,
                },
            },
            separators=(",", ":"),
        )
        for address in alloc.addresses
    )


def document(entries: Iterable[str]) -> bytes:
    """The whole file around allocations' entries (`entries_of`)."""
    listed = ",".join(e for e in entries if e)
    return f'{{"version":"{FORMAT_VERSION}","allocations":[{listed}],"writer":"{WRITER}"}}'.encode()


@dataclass(frozen=True, slots=True)
class CheckpointFile:
    """The file at `path`: read whole; written by temp file and rename, so a reader, or a crash of
    either daemon, sees the old file or the new one, never half.

    Not fsynced (aws-node fsyncs its writes): the file only matters while the pods it names run,
    and none survives the machine's crash. `/var/run` is a tmpfs on EKS's AMIs, so the file is gone
    with a reboot; where it is not, aws-node drops the entries whose veth is gone. An fsync and the
    directory's would instead put a disk flush on every pod's ADD, which waits for this file."""

    path: Path

    def read(self) -> bytes | None:
        """The file's bytes; None when there is none. Raises `CheckpointError` when it cannot be
        read (a directory, no permission, too large)."""
        try:
            with self.path.open("rb") as f:
                raw = f.read(MAX_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as err:
            raise CheckpointError(f"cannot read it: {err.strerror or err}") from None
        if len(raw) > MAX_BYTES:
            raise CheckpointError(f"larger than {MAX_BYTES} bytes")
        return raw

    def write(self, data: bytes) -> None:
        """Replace the file with `data`, whole but not durably (`datastore.atomic`, and why not
        above); raises OSError. Every pod's ADD waits for this: it is a temp file's open, write and
        close and a rename, the directory made only when it is missing."""
        try:
            atomic.replace(self.path, data, durable=False)
        except FileNotFoundError:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic.replace(self.path, data, durable=False)
