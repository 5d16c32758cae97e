"""The engine's group commit, its parts: a queued change, a sealed batch, and what a failed write
becomes for the callers of its batch. The queue and its leader live in `ipamd.engine.engine`; this
module holds no state."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from datastore.errors import CommitError, OwnershipConflict
from datastore.records import Mutation
from ipamd.engine.state import NodeState
from ipamd.errors import StoreWriteFailed

logger = logging.getLogger("ipamd.engine.engine")


@dataclass(slots=True)
class Change:
    """One queued change: how to decide it, and where its caller waits for the answer."""

    decide: Callable[[NodeState, float], tuple[Mutation, Any]]
    future: asyncio.Future[Any]
    prune: bool = True
    sealed: bool = False


def retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # its caller was cancelled: the outcome is known to have been seen


@dataclass(slots=True)
class Batch:
    changes: list[Change] = field(default_factory=list)
    mutations: list[Mutation] = field(default_factory=list)
    answers: list[Any] = field(default_factory=list)


def as_write_failure(error: BaseException) -> BaseException:
    """What the callers of a batch whose write failed are told: `StoreWriteFailed` for a refused
    transaction (logged here, once), anything else as it is."""
    if isinstance(error, OwnershipConflict):
        logger.error("store.conflict error=%s", error)
    if isinstance(error, CommitError):
        logger.warning("store.commit_failed error=%s", error)
        failure = StoreWriteFailed(str(error))
        failure.__cause__ = error
        return failure
    return error
