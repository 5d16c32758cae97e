"""Domain errors of ipamd. Each carries a stable `code` (one of `ipamd.wire`'s) and the HTTP status the
API maps it to; callers match on the type, never on the message."""

from __future__ import annotations

import time
from typing import ClassVar

from ipamd.wire import (
    CODE_BAD_REQUEST,
    CODE_DATAPATH_UNAVAILABLE,
    CODE_DELETE_INTENT,
    CODE_INTERNAL,
    CODE_INVENTORY_CONFLICT,
    CODE_MAX_PODS,
    CODE_NO_ADDRESS,
    CODE_NODE_FULL,
    CODE_STATE_UNAVAILABLE,
    CODE_STORE_WRITE_FAILED,
)


class IpamdError(Exception):
    code: ClassVar[str] = CODE_INTERNAL
    status: ClassVar[int] = 500
    retryable: ClassVar[bool] = False


class BadRequest(IpamdError):
    code = CODE_BAD_REQUEST
    status = 400


class DeleteIntentActive(IpamdError):
    """ADD for a container ID whose DEL already arrived: the runtime has given up on that sandbox."""

    code = CODE_DELETE_INTENT
    status = 409

    def __init__(self, container_id: str, first_del_at: float, expires_at: float) -> None:
        self.container_id = container_id
        self.first_del_at = first_del_at
        self.expires_at = expires_at
        super().__init__(
            f"container {container_id} was deleted at {utc_text(first_del_at)}; "
            f"ADD for it is refused until {utc_text(expires_at)}"
        )


def utc_text(unix_time: float) -> str:
    """A Unix time as people read it in a message: ISO 8601, UTC, to the second
    (`2026-12-06T21:56:58Z`). The API's JSON fields stay numbers."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix_time))


class NoAddressAvailable(IpamdError):
    """The warm pool has no free address right now; the pool grows and the runtime retries."""

    code = CODE_NO_ADDRESS
    status = 503
    retryable = True


class MaxPodsReached(IpamdError):
    """The node holds as many pod addresses as its max pods allows; more will not come."""

    code = CODE_MAX_PODS
    status = 503


class DatapathUnavailable(IpamdError):
    """The pod's routing could not be set up on the host; the ADD was undone and can be retried."""

    code = CODE_DATAPATH_UNAVAILABLE
    status = 503
    retryable = True


class NodeFull(IpamdError):
    """Every address the node can ever hold (all its ENIs attached and full) is owned by a pod: no
    amount of waiting brings another, only a pod's DEL does. Not retryable, like `MaxPodsReached`."""

    code = CODE_NODE_FULL
    status = 503


class StateUnavailable(IpamdError):
    """The state file is unusable; ipamd fails closed instead of starting empty."""

    code = CODE_STATE_UNAVAILABLE
    status = 503


class StoreWriteFailed(IpamdError):
    """The change could not be made durable, so it was not made at all."""

    code = CODE_STORE_WRITE_FAILED
    status = 503
    retryable = True


class InventoryError(IpamdError):
    """An inventory change that contradicts the current view (unknown ENI, unit already present)."""

    code = CODE_INVENTORY_CONFLICT
    status = 409


# -- start-up refusals: one line each, printed by `ipamd.main` with its exit code ----------------


class StartupError(Exception):
    """A start-up step the machine refused; `str()` is the one line to print."""


class SettingUnusable(StartupError):
    """A setting names a path or address this machine refuses (a directory under a file, no
    permission, a socket another process serves on)."""


class StateUnusable(StartupError):
    """The state directory is held by another ipamd, or holds something this one cannot use."""


def os_reason(err: OSError) -> str:
    """The OS's words without the path, which the caller's message already names."""
    if isinstance(err, FileExistsError):
        return "a file is in the way (not a directory)"  # mkdir found a file of that name
    return err.strerror or str(err)
