"""The records the datastore keeps, and the change set one transaction applies.

Records are plain frozen values shared by the datastore and the daemon's in-memory view, so the same
`Mutation` object is written to disk and, only once that commit succeeded, applied to memory.
Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from operator import attrgetter
from typing import Literal

UnitKind = Literal["ip", "prefix", "ipv6_prefix"]
"""The one kind of unit, everywhere: a secondary IPv4 address (/32), a /28 IPv4 prefix, or an IPv6
/80 prefix (IPv6 mode's one unit). EC2's listings show all three (`cloud.models.NetworkInterface`);
the pool assigns the first two by count (`cloud.models.Ipv4UnitKind`)."""
UnitState = Literal["active", "releasing", "lost"]
"""active: EC2 lists it; releasing: chosen to go back to EC2, unassign in flight;
lost: EC2 no longer lists it but an allocation still owns an address in it."""


@dataclass(frozen=True, slots=True)
class AllocationKey:
    """The CNI attachment key: (network name, container ID, ifname)."""

    network: str
    container_id: str
    ifname: str


@dataclass(frozen=True, slots=True)
class EniRecord:
    eni_id: str
    device_index: int
    subnet_id: str
    is_primary: bool
    added_at: float
    mac: str = ""
    """As EC2 gives it (lower-case); "" until EC2 has been read for it (a version-1 state file)."""
    primary_ip: str = ""
    """The ENI's primary private address; "" as for `mac`."""


@dataclass(frozen=True, slots=True)
class UnitRecord:
    """A secondary IPv4 address (/32), a /28 prefix or an IPv6 /80 prefix on an ENI."""

    cidr: str
    eni_id: str
    kind: UnitKind
    state: UnitState
    changed_at: float
    """When ipamd last changed this unit (added, began releasing, lost); drift reconcile's grace window."""


@dataclass(frozen=True, slots=True)
class ReleasedUnitRecord:
    """A unit ipamd returned to EC2, remembered so a stale cloud view does not bring it back at once."""

    cidr: str
    eni_id: str
    released_at: float


@dataclass(frozen=True, slots=True)
class AllocationRecord:
    key: AllocationKey
    addresses: tuple[str, ...]
    """Host addresses (no prefix length), one per owned address, in the order they were handed out."""
    unit_cidrs: tuple[str, ...]
    """The unit each address came from, parallel to `addresses`."""
    eni_id: str
    created_at: float
    pod_namespace: str = ""
    pod_name: str = ""
    pod_uid: str = ""
    stamp_ns: int | None = None
    """The allocation time aws-node's checkpoint gave an adopted pod, exactly (Go int64
    nanoseconds), written back as it came; None for ipamd's own, whose file time is `created_at`."""


@dataclass(frozen=True, slots=True)
class IntentRecord:
    """A delete intent: a DEL for this container ID arrived first at `first_del_at`."""

    container_id: str
    first_del_at: float


@dataclass(frozen=True, slots=True)
class CooldownRecord:
    """An address released by a pod at `released_at`; not handed out again until the cooldown ends."""

    address: str
    released_at: float


@dataclass(frozen=True, slots=True)
class QuarantineRecord:
    """An allocation set aside at load because its claim could not be trusted (duplicate or unexplained
    owner). It owns nothing; `ipamctl repair` decides its fate."""

    key: AllocationKey
    addresses: tuple[str, ...]
    reason: str
    quarantined_at: float


@dataclass(frozen=True, slots=True)
class Mutation:
    """Everything one state change writes, applied in one transaction.

    Deletions are applied before insertions, so a mutation may replace a record by deleting and
    putting it under the same key.
    """

    put_enis: tuple[EniRecord, ...] = ()
    delete_enis: tuple[str, ...] = ()
    put_units: tuple[UnitRecord, ...] = ()
    delete_units: tuple[str, ...] = ()
    put_released: tuple[ReleasedUnitRecord, ...] = ()
    delete_released: tuple[str, ...] = ()
    put_allocations: tuple[AllocationRecord, ...] = ()
    delete_allocations: tuple[AllocationKey, ...] = ()
    put_intents: tuple[IntentRecord, ...] = ()
    delete_intents: tuple[str, ...] = ()
    put_cooldowns: tuple[CooldownRecord, ...] = ()
    delete_cooldowns: tuple[str, ...] = ()
    put_quarantine: tuple[QuarantineRecord, ...] = ()
    delete_quarantine: tuple[AllocationKey, ...] = ()
    instance_id: str | None = None
    """When set, the instance this state belongs to from now on."""

    def is_empty(self) -> bool:
        # On every change's path: one tuple of the fields, not a generator of getattr calls.
        return not any(_fields_of(self))


_fields_of = attrgetter(*Mutation.__slots__)


@dataclass(frozen=True, slots=True)
class StateImage:
    """Everything on disk, as loaded at start."""

    instance_id: str | None
    enis: tuple[EniRecord, ...]
    units: tuple[UnitRecord, ...]
    released: tuple[ReleasedUnitRecord, ...]
    allocations: tuple[AllocationRecord, ...]
    intents: Mapping[str, float]
    """container ID → first DEL time, oldest first. A plain mapping, not records: a node can hold a
    hundred thousand intents, and start-up should not build an object for each."""
    cooldowns: tuple[CooldownRecord, ...]
    quarantine: tuple[QuarantineRecord, ...]
