"""Decisions for ADD and DEL: which addresses a new allocation takes, what a DEL releases.

Pure functions of (node state, now, settings) returning the `Mutation` to commit and the answer to give
once it has committed. They never change the state themselves. ADD is the hot path: these read
`NodeState`'s indexes directly (they are the engine's own), not through its query methods.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, replace
from itertools import islice

from datastore.records import (
    AllocationKey,
    AllocationRecord,
    CooldownRecord,
    IntentRecord,
    Mutation,
)
from ipamd.engine.state import NodeState
from ipamd.errors import DeleteIntentActive, MaxPodsReached, NoAddressAvailable, NodeFull
from ipamd.model import PodRef

Pick = Callable[
    [NodeState, int, float, float, Collection[str], bool],
    "tuple[str, list[tuple[str, str]]] | None",
]
"""(state, count, now, cooldown_s, blocked ENIs, skip the primary) → (ENI, [(address, unit)])."""


@dataclass(frozen=True, slots=True)
class EngineParams:
    """What the allocator works by on this node: the engine group's windows
    (`ipamd.config.groups.EngineSettings`), the limits the node's instance type and targets leave,
    and the family's pick, as `ipamd.node.engine_parts.engine_params` derives them. Tests build
    it with keyword arguments."""

    cooldown_s: float = 30.0
    """IP_COOLDOWN_PERIOD: a released address is not handed out again for this long."""
    intent_ttl_s: float = 600.0
    """How long a DEL keeps refusing ADDs for its container ID."""
    prune_batch: int = 32
    """Expired intents and cooldowns removed per mutation at most: the cost of a DEL stays flat."""
    max_pods: int | None = None
    """Pod allocations the node may hold (the pool never grows past it); None = no cap here."""
    max_addresses: int | None = None
    """Pod addresses the node's ENIs can hold at most (every ENI ipamd may attach, full); when
    all of them are owned, ADD is `NodeFull` rather than "try again". None = unknown."""
    pods_on_primary: bool = True
    """False with custom networking: no address of the primary ENI is handed to a pod, whatever
    units it holds (the pool gives its free ones back)."""
    pick: Pick | None = None
    """How ADD picks its addresses, chosen once for the node's family: None is `pick_addresses`
    over listed units (IPv4); an IPv6 node's is `pick_v6_addresses` (`ipamd/engine/pick_v6.py`)."""

    def picker(self) -> Pick:
        return self.pick or pick_addresses


OTHER_REFUSALS = (DeleteIntentActive, MaxPodsReached, NodeFull)
"""What `plan_assign` raises besides `NoAddressAvailable`."""


def plan_assign(
    state: NodeState,
    key: AllocationKey,
    pod: PodRef,
    count: int,
    now: float,
    settings: EngineParams,
    blocked_enis: Collection[str] = (),
) -> tuple[Mutation, AllocationRecord]:
    first_del = state._intents.get(key.container_id)
    if first_del is not None and now < first_del + settings.intent_ttl_s:
        raise DeleteIntentActive(key.container_id, first_del, first_del + settings.intent_ttl_s)
    existing = state._allocations.get(key)
    if existing is not None:
        return Mutation(), existing
    if settings.max_pods is not None and len(state._allocations) >= settings.max_pods:
        raise MaxPodsReached(f"the node holds {settings.max_pods} pod allocations, its max pods")
    picked = settings.picker()(
        state, count, now, settings.cooldown_s, blocked_enis, not settings.pods_on_primary
    )
    full = settings.max_addresses is not None and len(state._owner) + count > settings.max_addresses
    if picked is None and full:
        raise NodeFull(
            f"pods own {len(state._owner)} of the {settings.max_addresses} addresses this "
            "node's ENIs can hold: none will come until a pod is deleted"
        )
    if picked is None:
        wanted = "no free address" if count == 1 else f"no {count} free addresses on one ENI"
        raise NoAddressAvailable(
            f"{wanted} right now; the pool manager adds more if the node's ENI and address "
            "limits allow"
        )
    eni_id, pairs = picked
    record = AllocationRecord(
        key=key,
        addresses=tuple(a for a, _ in pairs),
        unit_cidrs=tuple(c for _, c in pairs),
        eni_id=eni_id,
        created_at=now,
        pod_namespace=pod.namespace,
        pod_name=pod.name,
        pod_uid=pod.uid,
    )
    # Taking an address ends whatever (expired) cooldown row it still had.
    stale = tuple(a for a, _ in pairs if a in state._cooldowns)
    return Mutation(put_allocations=(record,), delete_cooldowns=stale), record


def pick_addresses(
    state: NodeState,
    count: int,
    now: float,
    cooldown_s: float,
    blocked_enis: Collection[str] = (),
    skip_primary: bool = False,
) -> tuple[str, list[tuple[str, str]]] | None:
    """Pack: the fullest ENI that can serve `count` addresses, and on it the fullest units first.

    "Full" counts assigned and cooling addresses, so freshly emptied units stay empty and can go back
    to EC2 whole. Ties go to the lower device index and the lower CIDR, so the choice is deterministic.
    `skip_primary` (custom networking): never the primary ENI. The pick of a node of listed units
    (IPv4); an IPv6 node's is `pick_v6_addresses` (`ipamd/engine/pick_v6.py`), chosen once in
    `EngineParams.pick`.
    """
    horizon = now - cooldown_s  # an address released after this instant is still cooling
    best: tuple[int, str, list[tuple[int, str]]] | None = None
    for eni_id, cidrs in state._units_by_eni.items():
        if eni_id in blocked_enis:
            continue  # its link is not set up on the host: an address there could not carry traffic
        if skip_primary and (eni := state._enis.get(eni_id)) is not None and eni.is_primary:
            continue  # custom networking: pods live in the ENIConfig's subnet, never the node's
        occupied, available, candidates = _scan_eni(state, cidrs, horizon)
        if available >= count and (best is None or occupied > best[0]):
            best = (occupied, eni_id, candidates)
    if best is None:
        return None
    _, eni_id, candidates = best
    # Fullest unit first (fewest free), then the lower CIDR.
    chosen = [min(candidates)] if count == 1 else sorted(candidates)
    pairs: list[tuple[str, str]] = []
    for _, cidr in chosen:
        addresses = state._spaces[cidr].addresses
        pairs.extend((a, cidr) for a in addresses if _is_free(state, a, horizon))
        if len(pairs) >= count:
            break
    return eni_id, pairs[:count]


def _is_free(state: NodeState, address: str, horizon: float) -> bool:
    return (
        address not in state._owner
        and address not in state._held
        and state._cooldowns.get(address, horizon) <= horizon
    )


def _scan_eni(
    state: NodeState, cidrs: Iterable[str], horizon: float
) -> tuple[int, int, list[tuple[int, str]]]:
    """(occupied, available, [(-used, cidr) for units with a free address]) for one ENI.

    The hot loop of ADD: locals and an inlined test for single-address units keep it to a few
    dictionary lookups per unit."""
    owner, cooldowns, units, held = state._owner, state._cooldowns, state._units, state._held
    spaces, owned_in_unit = state._spaces, state._owned_in_unit
    occupied = available = 0
    candidates: list[tuple[int, str]] = []
    for cidr in cidrs:
        if units[cidr].state != "active":
            continue
        addresses = spaces[cidr].addresses  # none listed for a /80: never picked here
        size = len(addresses)
        if owned_in_unit[cidr] == size:
            occupied += size
            continue
        if size == 1:
            a = addresses[0]
            free = 0 if a in owner or a in held or cooldowns.get(a, horizon) > horizon else 1
        else:
            free = 0
            for a in addresses:  # the `_is_free` test, inlined: 16 per prefix on every ADD
                if a not in owner and a not in held and cooldowns.get(a, horizon) <= horizon:
                    free += 1
        occupied += size - free
        if free:
            available += free
            candidates.append((free - size, cidr))
    return occupied, available, candidates


def plan_retract(state: NodeState, record: AllocationRecord) -> tuple[Mutation, bool]:
    """Remove `record` if it is still the allocation of its key: no intent, no cooldown."""
    if state._allocations.get(record.key) != record:
        return Mutation(), False
    return Mutation(delete_allocations=(record.key,)), True


def plan_release(
    state: NodeState, container_id: str, now: float, settings: EngineParams
) -> tuple[Mutation, tuple[AllocationRecord, ...]]:
    """DEL: release every allocation of the container ID (any network, any ifname) and record the
    delete intent. The intent keeps the time of the first DEL; only an expired one is replaced."""
    released = state.allocations_of(container_id)
    keys = tuple(alloc.key for alloc in released)
    first_del = state._intents.get(container_id)
    intent_active = first_del is not None and now < first_del + settings.intent_ttl_s
    # A quarantined claim of the container goes with its DEL: the runtime says it is gone, so there
    # is nothing left for repair to decide.
    quarantined = tuple(k for k in state._quarantine if k.container_id == container_id)
    if not released and not quarantined and intent_active:
        return Mutation(), ()
    cooling: list[CooldownRecord] = []
    released_from: Counter[str] = Counter()
    for alloc in released:
        released_from.update(alloc.unit_cidrs)
        if settings.cooldown_s > 0:
            cooling.extend(CooldownRecord(address, now) for address in alloc.addresses)
    if settings.cooldown_s > 0:
        # A held address freed with its claim cools like a released one: the usual grace.
        cooling.extend(
            CooldownRecord(address, now)
            for key in quarantined
            for address in state._quarantine[key].addresses
            if address not in state._owner
        )
    # A lost unit leaves the inventory with its last owner.
    gone = tuple(
        cidr
        for cidr, n in released_from.items()
        if (unit := state._units.get(cidr)) is not None
        and unit.state == "lost"
        and state._owned_in_unit.get(cidr, 0) == n
    )
    return (
        Mutation(
            delete_allocations=keys,
            delete_intents=(container_id,) if first_del is not None and not intent_active else (),
            put_intents=() if intent_active else (IntentRecord(container_id, now),),
            put_cooldowns=tuple(cooling),
            delete_units=gone,
            delete_quarantine=quarantined,
        ),
        released,
    )


def plan_pruning(state: NodeState, m: Mutation, now: float, settings: EngineParams) -> Mutation:
    """Add to `m` the removal of up to `prune_batch` expired intents and cooldowns, oldest first.

    Both maps are insertion-ordered by time, so this looks at O(batch) entries whatever their number.
    """
    intents: list[str] = []
    horizon = now - settings.intent_ttl_s
    # Entries replaced since they were queued are skipped; at most one batch of them is looked at.
    for cid, first_del in islice(state._intent_order, 2 * settings.prune_batch):
        if len(intents) >= settings.prune_batch or first_del > horizon:
            break
        if state._intents.get(cid) == first_del:
            intents.append(cid)
    cooldowns: list[str] = []
    for address, released_at in state._cooldowns.items():
        if len(cooldowns) >= settings.prune_batch or released_at + settings.cooldown_s > now:
            break
        cooldowns.append(address)
    if not intents and not cooldowns:
        return m
    return replace(
        m,
        delete_intents=(*m.delete_intents, *intents),
        delete_cooldowns=(*m.delete_cooldowns, *cooldowns),
    )
