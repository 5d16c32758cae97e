"""The datastore's errors. sqlite3 and OSError exceptions never leave this package."""

from __future__ import annotations

from pathlib import Path

REPAIR_COMMAND = "ipamctl repair"


class StoreError(Exception):
    """Base of every datastore error."""


class StateFileError(StoreError):
    """The state file cannot be trusted: unreadable, corrupt, truncated, empty or of an unknown version.

    ipamd refuses to hand out addresses from it, since starting empty would hand out addresses that
    running pods still hold.
    """

    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(
            f"state file {path} is unusable: {reason}. ipamd will not hand out addresses from it; "
            f"inspect and rebuild it with `{REPAIR_COMMAND}` (dry run by default, `--apply` to fix)"
        )


class CommitError(StoreError):
    """A transaction did not commit; nothing it contained was written."""


class OwnershipConflict(CommitError):
    """A write would have given an address a second owner or duplicated a key; the constraint refused it."""
