"""Taking a node over from aws-node: the pods its checkpoint records become ipamd's allocations, in
place, with the same keys and addresses, so nothing running is re-addressed.

When (`Takeover.run`, in start-up after the first EC2 read and before ready): the checkpoint exists,
parses as VPC CNI's, and was not written by ipamd (`Checkpoint.foreign`). A file ipamd wrote is its
own copy of the state file, which stays the truth.

What each entry becomes (`plan_adoption`, pure):
- an allocation of its key (network, container ID, ifname) with its address, the pod's namespace and
  name and its allocation time, when the address is on a unit of the inventory EC2 gave and no other
  allocation owns it. Every entry is adopted whatever the runtime says: one whose sandbox is gone is
  released by the runtime leak GC like any other (two listings, past the grace period, with a delete
  intent and a cooldown), so a runtime that cannot be read at this moment releases nothing;
- a quarantined claim that holds its address (`_holds`), logged, when its address is not on this
  node per EC2 (never an allocation EC2 cannot back), when its container has an active delete intent
  (invariant 3), when the entry is no allocation at all (a key ipamd cannot accept), or when two
  entries claim one address, or one attachment two addresses: the one whose sandbox the runtime
  runs wins, else the newest (as restore decides duplicate owners: an address is only handed out
  once free, so the older claim's DEL went missing). The loser may still run, so its address is
  not handed out until its DEL, or until the runtime leak GC sees its sandbox gone;
- when ipamd's state already gives the address to another key (a node rolled back to aws-node and
  then forward again, with ipamd's old state file), the entry replaces that allocation only if the
  runtime runs the entry's sandbox and not the other's; otherwise ipamd's own claim stays.
Free addresses of the ENIs that hold adopted pods start cooling: the checkpoint records no release
times, and an address aws-node freed a moment ago may still be in a peer's conntrack or policy maps.
An IPv6 node's entries are adopted the same way, each /128 found in the primary ENI's /80; of the
/80's free addresses, those the next ADDs could take cool (`NodeState.next_takers`).

A checkpoint that cannot be read is logged and ignored: addresses then come from EC2 and the runtime
alone, as on any start. No path here hands out an address that an allocation owns.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass, field, replace

from datastore.records import (
    AllocationKey,
    AllocationRecord,
    CooldownRecord,
    Mutation,
    QuarantineRecord,
)
from ipamd.awsnode.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointFile,
    Entry,
    Skipped,
    parse,
)
from ipamd.engine.engine import Engine
from ipamd.engine.state import NodeState
from ipamd.runtime.ports import RuntimeApi, RuntimeUnavailable

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Adoption:
    """What a takeover did, for logs and its caller."""

    adopted: tuple[AllocationKey, ...] = ()
    replaced: tuple[AllocationKey, ...] = ()
    """ipamd's own allocations that an adopted entry took the address of."""
    refused: tuple[str, ...] = ()
    """Why each entry left out was left out."""
    cooling: int = 0
    held: tuple[str, ...] = ()
    """The addresses the entries left out name: quarantined claims hold them (`_holds`)."""


@dataclass(slots=True)
class _Claims:
    by_address: dict[str, Entry] = field(default_factory=dict)
    refused: list[Skipped] = field(default_factory=list)


def plan_adoption(
    state: NodeState,
    checkpoint: Checkpoint,
    live: Collection[str] | None,
    now: float,
    intent_ttl_s: float,
    max_pods: int = 0,
) -> tuple[Mutation, Adoption]:
    """The mutation that adopts `checkpoint`'s entries into `state`; `live` is the runtime's sandbox
    IDs (None when it could not be listed); `max_pods` bounds the cooling of a /80
    (`NodeState.next_takers`)."""
    claims = _claims(state, checkpoint, live, now, intent_ttl_s)
    unit_of = {
        a: cidr
        for cidr, unit in state.units().items()
        if unit.state == "active"
        for a in state.addresses_of(cidr)
    }
    records: list[AllocationRecord] = []
    replaced: list[AllocationKey] = []
    refused = claims.refused
    for address, entry in claims.by_address.items():
        # A /80's addresses are not listed: one found in no listed unit is looked for in each.
        cidr = unit_of.get(address) or state.active_unit_of(address)
        if cidr is None:
            refused.append(_refusal(entry, f"{address} is on no ENI of this node per EC2"))
            continue
        owner = state.owner_of(address)
        if owner == entry.key:
            continue  # already ipamd's, as the checkpoint says
        if state.allocation(entry.key) is not None:
            refused.append(_refusal(entry, "ipamd holds another address for this attachment"))
            continue
        if owner is not None:
            if not _entry_wins(owner, entry, live):
                refused.append(_refusal(entry, f"{address} is owned by {owner.container_id}"))
                continue
            replaced.append(owner)
        records.append(_record(state, entry, cidr, now))
    mutation, cooling = _with_cooling(state, records, replaced, now, max_pods)
    holds = _holds(state, refused, now)
    adoption = Adoption(
        tuple(r.key for r in records),
        tuple(replaced),
        tuple(r.reason for r in refused),
        cooling,
        tuple(sorted({a for q in holds for a in q.addresses})),
    )
    return replace(mutation, put_quarantine=holds), adoption


def _refusal(entry: Entry, why: str) -> Skipped:
    return Skipped(f"{_who(entry)}: {why}", entry.key, entry.address)


def _holds(state: NodeState, refused: list[Skipped], now: float) -> tuple[QuarantineRecord, ...]:
    """The entries left out, as quarantined claims that hold the addresses they name: aws-node
    gave each to a pod that may still run, and the seeds' rule is to never hand out an address a
    live owner may hold. A claim goes with its container's DEL, or when the runtime leak GC sees
    its sandbox gone (then its addresses cool); one per key, merged with a claim already held."""
    claims: dict[AllocationKey, tuple[list[str], list[str], float]] = {}
    for r in refused:
        if r.address is None:
            continue  # nothing to hold: the entry names no address
        if r.key not in claims:
            held = state.quarantine().get(r.key)
            claims[r.key] = (
                list(held.addresses) if held else [],
                [held.reason] if held else [],
                held.quarantined_at if held else now,
            )
        addresses, reasons, _ = claims[r.key]
        if r.address not in addresses:
            addresses.append(r.address)
        reasons.append(f"not adopted from aws-node's checkpoint: {r.reason}")
    return tuple(
        QuarantineRecord(key, tuple(addresses), "; ".join(dict.fromkeys(reasons)), at)
        for key, (addresses, reasons, at) in claims.items()
    )


def _claims(
    state: NodeState,
    checkpoint: Checkpoint,
    live: Collection[str] | None,
    now: float,
    intent_ttl_s: float,
) -> _Claims:
    """One entry per address (duplicates decided), entries of deleted containers refused."""
    claims = _Claims(refused=list(checkpoint.skipped))
    for entry in checkpoint.entries:
        first_del = state.intents().get(entry.key.container_id)
        if first_del is not None and now < first_del + intent_ttl_s:
            claims.refused.append(_refusal(entry, "its container was deleted (delete intent)"))
            continue
        other = claims.by_address.get(entry.address)
        if other is None or _rank(entry, live) > _rank(other, live):
            if other is not None:
                claims.refused.append(
                    _refusal(other, f"{entry.address} also claimed, newer or live")
                )
            claims.by_address[entry.address] = entry
        else:
            claims.refused.append(_refusal(entry, f"{entry.address} also claimed, newer or live"))
    # One address per attachment too: an attachment listed twice keeps its newer or live entry.
    best: dict[AllocationKey, Entry] = {}
    for entry in claims.by_address.values():
        other = best.get(entry.key)
        if other is None or _rank(entry, live) > _rank(other, live):
            best[entry.key] = entry
    for address, entry in list(claims.by_address.items()):
        if best[entry.key] is not entry:
            del claims.by_address[address]
            claims.refused.append(_refusal(entry, f"the attachment is listed twice ({address})"))
    return claims


def _rank(entry: Entry, live: Collection[str] | None) -> tuple[bool, float, str]:
    running = live is not None and entry.key.container_id in live
    return (running, entry.allocated_at, entry.key.container_id)


def _entry_wins(owner: AllocationKey, entry: Entry, live: Collection[str] | None) -> bool:
    return live is not None and entry.key.container_id in live and owner.container_id not in live


def _who(entry: Entry) -> str:
    pod = f" ({entry.namespace}/{entry.name})" if entry.name else ""
    return f"{entry.key.container_id}{pod}"


def _record(state: NodeState, entry: Entry, cidr: str, now: float) -> AllocationRecord:
    unit = state.units()[cidr]
    return AllocationRecord(
        key=entry.key,
        addresses=(entry.address,),
        unit_cidrs=(cidr,),
        eni_id=unit.eni_id,
        # ipamd's clock orders and ages it (a time in the future would keep the leak GC from ever
        # judging it); the file's own number is kept exactly for the checkpoint ipamd writes back.
        created_at=min(entry.allocated_at, now) or now,
        stamp_ns=entry.stamp_ns,
        pod_namespace=entry.namespace,
        pod_name=entry.name,
    )


def _with_cooling(
    state: NodeState,
    records: list[AllocationRecord],
    replaced: list[AllocationKey],
    now: float,
    max_pods: int,
) -> tuple[Mutation, int]:
    """The adoption's mutation, with every free address of the adopting ENIs put in cooldown (of a
    /80, those `NodeState.next_takers` names)."""
    adopted = {r.addresses[0] for r in records}
    cooling = [
        CooldownRecord(address, now)
        for eni_id in sorted({r.eni_id for r in records})
        for cidr in state.units_on(eni_id)
        for address in state.next_takers(cidr, adopted, max_pods)
        if address not in adopted and state.owner_of(address) is None
    ]
    stale = tuple(a for a in adopted if a in state.cooldowns())
    mutation = Mutation(
        delete_allocations=tuple(replaced),
        put_allocations=tuple(records),
        delete_cooldowns=stale,
        put_cooldowns=tuple(cooling),
    )
    return mutation, len(cooling)


@dataclass
class Takeover:
    """Start-up's takeover step on the engine, the checkpoint file and the runtime."""

    engine: Engine
    file: CheckpointFile
    runtime: RuntimeApi

    async def run(self) -> Adoption | None:
        """Adopt what aws-node's checkpoint records; None when there is nothing to take over."""
        checkpoint = self._read()
        if checkpoint is None:
            return None
        live = await self._live()
        ttl, max_pods = self.engine.settings.intent_ttl_s, self.engine.settings.max_pods or 0
        adoption = await self.engine.commit_planned(
            lambda state, now: plan_adoption(state, checkpoint, live, now, ttl, max_pods)
        )
        for reason in adoption.refused:
            logger.warning("takeover.entry_refused path=%s reason=%s", self.file.path, reason)
        logger.info(
            "takeover.adopted path=%s adopted=%d replaced=%d refused=%d held=%d cooling=%d",
            self.file.path,
            len(adoption.adopted),
            len(adoption.replaced),
            len(adoption.refused),
            len(adoption.held),
            adoption.cooling,
        )
        return adoption

    def _read(self) -> Checkpoint | None:
        try:
            raw = self.file.read()
            checkpoint = None if raw is None else parse(raw)
        except CheckpointError as err:
            logger.warning("takeover.checkpoint_ignored path=%s reason=%s", self.file.path, err)
            return None
        if checkpoint is None or not checkpoint.foreign:
            return None
        return checkpoint

    async def _live(self) -> frozenset[str] | None:
        try:
            return frozenset(s.sandbox_id for s in await self.runtime.list_sandboxes())
        except RuntimeUnavailable as err:
            logger.warning("takeover.runtime_unreachable error=%s", err)
            return None
