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
from collections.abc import Iterable, Mapping
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


BACKFILL_NETWORK = "_migrated-from-cri"
BACKFILL_IFNAME = "unknown"
"""The key aws-node gave the pods it found through CRI when it first wrote a checkpoint (v1.7 and
v1.8's migration phase 1; VPC CNI `pkg/ipamd/datastore/data_store.go`). Pods that lived through
that migration keep it; their DEL arrives with the real key, and ipamd's DEL releases every
allocation of the container ID, whatever its network and interface, as aws-node's falls back to it."""

UNREADABLE = "?"
"""The key field of an entry that cannot be one, in the held claim it becomes: no network name,
container ID or interface name ipamd accepts contains it, so it matches no DEL or sandbox."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One pod's address as the checkpoint records it."""

    key: AllocationKey
    address: str
    stamp_ns: int | None = None
    """`allocationTimestamp` exactly as the file has it (Go int64 nanoseconds); None when it has
    none (files before v1.12) or one that is not an int64."""
    namespace: str = ""
    name: str = ""

    @property
    def allocated_at(self) -> float:
        """Unix seconds, for ordering and ages; 0 when the file gave no time."""
        return self.stamp_ns / 1e9 if self.stamp_ns is not None and self.stamp_ns > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Skipped:
    """An entry that cannot be an allocation, and what of it can still be read: the address it
    names (held by the takeover while the pod may run) and its key, with `UNREADABLE` for a field
    that is not one."""

    reason: str
    key: AllocationKey
    address: str | None


@dataclass(frozen=True, slots=True)
class Checkpoint:
    entries: tuple[Entry, ...]
    skipped: tuple[Skipped, ...]
    """The entries that cannot be allocations, each with why."""
    writer: str
    """`ipamd` for a file ipamd wrote; "" for aws-node's."""

    @property
    def foreign(self) -> bool:
        return self.writer != WRITER


class _Object(list[tuple[str, object]]):
    """A JSON object as its members in file order, so names resolve as Go's decoder resolves them."""


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _field(obj: _Object, name: str) -> object:
    """The value Go's `encoding/json` decodes into the struct field tagged `name`: every member
    whose name equals it, case-insensitively, sets the field, so the last in the file wins."""
    fold = name.casefold()
    value: object = None
    for member, v in obj:
        if member.casefold() == fold:
            value = v
    return value


def parse(raw: bytes) -> Checkpoint:
    """The checkpoint in `raw`; raises `CheckpointError` for a file that is not one. Total: any
    bytes either parse or raise `CheckpointError`."""
    try:
        doc = json.loads(raw, object_pairs_hook=_Object, parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError) as err:
        raise CheckpointError(f"not JSON: {err}") from None
    except RecursionError:
        # Arrays or objects nested deeper than the interpreter recurses: no checkpoint is (Go's
        # decoder refuses them too, past 10,000 levels), and a traceback here is a crash loop.
        raise CheckpointError("not JSON ipamd reads: nested too deeply") from None
    if not isinstance(doc, _Object):
        raise CheckpointError("not a JSON object")
    version = _field(doc, "version")
    if version != FORMAT_VERSION:
        raise CheckpointError(f"version {_shown(version)}, not {FORMAT_VERSION!r}")
    items = _field(doc, "allocations")
    if items is None:
        items = []  # aws-node writes `null` for a node without pods
    if not isinstance(items, list) or isinstance(items, _Object):
        raise CheckpointError("`allocations` is not a list")
    entries: list[Entry] = []
    skipped: list[Skipped] = []
    for index, item in enumerate(items):
        try:
            entries.append(_entry(item))
        except (CheckpointError, WireError) as err:
            skipped.append(_skipped(f"allocations[{index}]: {err}", item))
    writer = _field(doc, "writer")
    return Checkpoint(tuple(entries), tuple(skipped), writer if isinstance(writer, str) else "")


def _shown(value: object) -> str:
    return repr(value)[:80] if isinstance(value, str | int | float | None) else type(value).__name__


def _entry(item: object) -> Entry:
    if not isinstance(item, _Object):
        raise CheckpointError("not an object")
    key = _key(item)
    parsed = _address(item)
    stamp = _field(item, "allocationTimestamp")
    meta = _field(item, "metadata")
    meta = meta if isinstance(meta, _Object) else _Object()
    return Entry(
        key,
        str(parsed),
        _int64(stamp),
        _text(_field(meta, "k8sPodNamespace")),
        _text(_field(meta, "k8sPodName")),
    )


def _key(item: _Object) -> AllocationKey:
    network, ifname = _field(item, "networkName"), _field(item, "ifName")
    container_id = check_container_id(_field(item, "containerID"), "containerID")
    if network == BACKFILL_NETWORK and ifname == BACKFILL_IFNAME:
        return AllocationKey(BACKFILL_NETWORK, container_id, BACKFILL_IFNAME)
    return AllocationKey(
        check_network(network, "networkName"), container_id, check_ifname(ifname, "ifName")
    )


def _skipped(reason: str, item: object) -> Skipped:
    """What an entry that is not an allocation still says: its address and key, where readable."""
    if not isinstance(item, _Object):
        return Skipped(reason, AllocationKey(UNREADABLE, UNREADABLE, UNREADABLE), None)
    try:
        address: str | None = str(_address(item))
    except CheckpointError:
        address = None
    fields = (
        ("networkName", check_network),
        ("containerID", check_container_id),
        ("ifName", check_ifname),
    )
    parts: list[str] = []
    for name, check in fields:
        value = _field(item, name)
        try:
            parts.append(check(value, name))
        except WireError:
            backfill = (BACKFILL_NETWORK, BACKFILL_IFNAME)
            parts.append(value if isinstance(value, str) and value in backfill else UNREADABLE)
    return Skipped(reason, AllocationKey(*parts), address)


def _int64(value: object) -> int | None:
    """`value` as Go decodes an int64: an integer in range, else nothing."""
    if (
        isinstance(value, int)
        and not isinstance(value, bool)
        and -INT64_MAX - 1 <= value <= INT64_MAX
    ):
        return value
    return None


def _address(item: _Object) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """The entry's one address: `ipv4`, or `ipv6` as aws-node in IPv6 mode writes it."""
    for field, family in (("ipv4", ipaddress.IPv4Address), ("ipv6", ipaddress.IPv6Address)):
        address = _field(item, field)
        if isinstance(address, str) and address:
            try:
                return family(address)
            except ValueError:
                what = f"{field} {_shown(address)} is not an IPv{field[-1]} address"
                raise CheckpointError(what) from None
    raise CheckpointError("no ipv4 or ipv6 address")


def _text(value: object) -> str:
    return value if isinstance(value, str) and value.isprintable() and len(value) <= 253 else ""


def render(allocations: Iterable[AllocationRecord]) -> bytes:
    """The checkpoint aws-node would read back for `allocations` (one entry per address)."""
    ordered = sorted(allocations, key=lambda a: (a.created_at, a.key.container_id))
    return document(entries_of(a) for a in ordered)


ENTRY_FIELD: Mapping[int, str] = {4: "ipv4", 6: "ipv6"}
"""The entry's field for an address of each IP version: aws-node in IPv6 mode reads `ipv6`."""


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
                ENTRY_FIELD[ipaddress.ip_address(address).version]: address,
                "allocationTimestamp": stamp_ns(alloc),
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


def stamp_ns(alloc: AllocationRecord) -> int:
    """The allocation's time in the file: the one aws-node gave an adopted pod, exactly; else
    ipamd's own, in nanoseconds within Go's int64."""
    if alloc.stamp_ns is not None:
        return alloc.stamp_ns
    return min(max(int(alloc.created_at * 1e9), 0), INT64_MAX)


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
