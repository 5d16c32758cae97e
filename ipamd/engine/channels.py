"""The engine's channels with the rest of the daemon: each is a method or a read-only view, so
that no other part writes on the engine's attributes and every change of what the engine does comes
through a call that can be found.

- Commit listeners (`subscribe`): told of each commit once it is applied (the host-network owner,
  the aws-node checkpoint keeper, metrics).
- ENIs held back from new pods: blocked by the host-network owner until their link is set up
  (`block_eni`, `unblock_eni`, read as `blocked_enis`), and those in subnets the pool manager's
  subnet catalogue closes (`close_subnets`, read as `closed_subnets`, `closed_enis`).
- ADDs' demand (`starved_at`, `pool_wanted`): an ADD that finds no free address wakes the pool
  manager at once, which waits for it with `wait_for_demand` and takes it with `take_demand`.
- Why the pool cannot grow (`explain_starvation`): the pool manager names a final failure, and an
  ADD that finds no free address says it rather than "try again".

`ipamd.engine.engine.Engine` is a `Channels`; the group commit there sets the demand and calls the
listeners, here is only the state of the channels and their methods.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Iterable, Mapping
from types import MappingProxyType

from datastore.records import AllocationRecord, Mutation
from ipamd.engine.state import NodeState

CommitListener = Callable[[Mutation, tuple[AllocationRecord, ...]], None]


class Channels:
    """The channels' state; `Engine.__init__` sets it up."""

    state: NodeState

    def __init__(self) -> None:
        self._listeners: list[CommitListener] = []
        self._blocked: dict[str, str] = {}
        self._blocked_view = MappingProxyType(self._blocked)
        self._closed_subnets: frozenset[str] = frozenset()
        self._demand = asyncio.Event()
        self._starved_at = float("-inf")
        self._starvation_cause: Callable[[], str] = str

    def subscribe(self, listener: CommitListener) -> Callable[[], None]:
        """Call `listener` after each commit is applied (the mutation, the allocations it removed),
        in the order subscribed; it must not raise. Returns what unsubscribes it."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def want_pool(self) -> None:
        """Wake the pool manager as an ADD that found no address would: pods are on their way
        (the pods the scheduler bound to this node, `ipamd.kube.pods`)."""
        self._demand.set()

    def explain_starvation(self, cause: Callable[[], str]) -> None:
        """`cause()` says why the pool cannot grow now ("" when it can); an ADD that finds no
        free address adds it to its error (the pool manager's, set once)."""
        self._starvation_cause = cause

    # -- what ADDs may not take, and what they lack ---------------------------------------------

    @property
    def blocked_enis(self) -> Mapping[str, str]:
        """ENI ID → why none of its addresses may be handed out yet (its link is not set up on the
        host): the host-network owner's, from the ENI's first commit on (read-only)."""
        return self._blocked_view

    def block_eni(self, eni_id: str, reason: str) -> None:
        """Hand out none of `eni_id`'s addresses until `unblock_eni`; `reason` says why."""
        self._blocked[eni_id] = reason

    def unblock_eni(self, eni_id: str) -> bool:
        """Its addresses may go to pods again; True if it was blocked."""
        return self._blocked.pop(eni_id, None) is not None

    @property
    def closed_subnets(self) -> frozenset[str]:
        """Subnets whose ENIs take no new pods (the pool manager's subnet catalogue says which)."""
        return self._closed_subnets

    def close_subnets(self, subnets: Iterable[str]) -> None:
        """From now on exactly `subnets` are closed to new pods; any other subnet is open again."""
        self._closed_subnets = frozenset(subnets)

    def closed_enis(self, state: NodeState | None = None) -> set[str]:
        """The ENIs (of `state`, default the committed one) in a closed subnet."""
        if not self._closed_subnets:
            return set()
        enis = (state or self.state).enis()
        return {e for e, r in enis.items() if r.subnet_id in self._closed_subnets}

    def held_back(self, state: NodeState | None = None) -> Collection[str]:
        """ENIs none of whose addresses may go to a new pod: blocked ones, and closed ones."""
        if not self._closed_subnets:
            return self._blocked
        return self.closed_enis(state) | self._blocked.keys()

    @property
    def starved_at(self) -> float:
        """When an ADD last found no free address (the pool manager's demand, `ipamd.pool.pace`)."""
        return self._starved_at

    @property
    def pool_wanted(self) -> bool:
        """Whether the pool manager is wanted now: an ADD found no free address (or its tick came,
        `wait_for_demand`) since it last took the demand (`take_demand`)."""
        return self._demand.is_set()

    def take_demand(self) -> bool:
        """The pool manager takes the demand as it starts a round; returns `pool_wanted` as it was."""
        wanted = self._demand.is_set()
        self._demand.clear()
        return wanted

    async def wait_for_demand(self, timeout_s: float) -> None:
        """Until an ADD finds no free address, or `timeout_s` passes (the pool manager's tick), or at
        once if one did since `take_demand`. The tick is a timer that sets the demand, not a timeout:
        no task is cancelled to end each wait."""
        tick = asyncio.get_running_loop().call_later(timeout_s, self._demand.set)
        try:
            await self._demand.wait()
        finally:
            tick.cancel()
