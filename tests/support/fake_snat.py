"""`FakeSnatTable`: the `SnatTable` port with state, for unit tests of the code that drives it.

It holds the plan the "kernel" table was last made from (None: no table), compares plans the way
`NftSnatTable` does (by their rendered script, so order and duplicates do not matter, and an invalid
plan raises `ValueError` like the real one), and misbehaves on demand: `unreadable` makes every call
raise `KernelUnreadable` (the listing fails), `fail_apply` makes `apply` raise `HostNetError` with
the table left as it was, and `tamper()` stands for someone editing the table by hand. It never
touches a kernel.
"""

from __future__ import annotations

from ipamd.hostnet.ports import HostNetError, KernelUnreadable
from ipamd.hostnet.snat import SnatPlan, render_ruleset


class FakeSnatTable:
    def __init__(self, plan: SnatPlan | None = None) -> None:
        self.plan = plan
        """The plan the table was made from; None when there is no table."""
        self.unreadable = False
        self.fail_apply = False
        self.applies = 0
        """`apply` calls that succeeded, whether or not they changed the table."""
        self.changes = 0
        """`apply` calls that changed the table."""
        self.removes = 0
        """`remove` calls that removed a table."""
        self._tampered = False

    def tamper(self) -> None:
        """Someone edited the table by hand: it no longer matches any plan until the next apply."""
        if self.plan is None:
            raise AssertionError("there is no table to tamper with")
        self._tampered = True

    async def apply(self, plan: SnatPlan) -> bool:
        script = render_ruleset(plan)
        self._check_readable()
        if self.fail_apply:
            raise HostNetError("injected: nft refused ipamd's table")
        changed = self._tampered or self.plan is None or render_ruleset(self.plan) != script
        self.plan = plan
        self._tampered = False
        self.applies += 1
        self.changes += changed
        return changed

    async def remove(self) -> bool:
        self._check_readable()
        was_there = self.plan is not None
        self.plan = None
        self._tampered = False
        self.removes += was_there
        return was_there

    async def matches(self, plan: SnatPlan) -> bool:
        script = render_ruleset(plan)
        self._check_readable()
        return self.plan is not None and not self._tampered and render_ruleset(self.plan) == script

    def _check_readable(self) -> None:
        if self.unreadable:
            raise KernelUnreadable("injected: nft could not list table ip ipamd")
