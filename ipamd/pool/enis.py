"""The pool manager's new ENIs: created in the subnet the catalogue names holding the units the plan
asked for (one assign fewer), attached at the lowest free device index, recorded with those units,
and only later given DeleteOnTermination, which no pod waits for.

An ENI being created or attached is in `pending`, so ENI GC leaves it alone. The device index is
the lowest one no attached ENI holds as of now: the inventory's ENIs hold theirs (ipamd's own
attaches and releases keep it current), and the others of EC2's latest listing hold theirs (another
user's, one attached by an answer lost). A listing asked for before a doubt arose (at start, after
an attach refused other than by a throttle, or unanswered) or before ipamd released an ENI is stale
and serves nothing. While in doubt a new ENI lists the instance's ENIs first, unless the drift's
listing, asked for since, settled it (at start, the drift's first read); otherwise it needs no
describe (a throttled attach was refused before EC2 acted). An attach whose outcome is unknown is
checked against EC2; an ENI whose attach failed in a way worth retrying is kept and attached on the
next round instead of creating another (under an account's exhausted API budget, creating anew
every round would only add calls), and deleted once the plan no longer wants it.

DeleteOnTermination is background work that waits (`unbound`, which the drift leaves alone): at
least `BIND_SETTLE_S`, and while the pool still grows up to `BIND_WAIT_CAP_S`, and while background
work is held. In a burst the account's tokens go to the ENIs pods wait for; an instance terminated
meanwhile leaves the ENI detached, for ENI GC. Left unset (refused, throttled, the answer lost), it
is set by the drift (`ipamd.reconcile.ec2_drift`).

A new ENI's calls go through the view of the adapter the pool manager hands `make`, under the urgency
of its round; DeleteOnTermination is always background work (`CallUrgency.BACKGROUND`).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from cloud.errors import CloudError, InUse, NotFound, Throttled
from cloud.models import Ipv4UnitKind, NetworkInterface
from cloud.ports import (
    MANAGED_BY,
    TAG_CLUSTER_NAME,
    TAG_CREATED_AT,
    TAG_INSTANCE_ID,
    TAG_MANAGED_BY,
    CallUrgency,
    Ec2Api,
    Instance,
)
from ipamd.clock import Clock
from ipamd.engine.engine import Engine
from ipamd.engine.inventory import eni_record
from ipamd.pool.pace import Pace
from ipamd.pool.params import PoolParams
from ipamd.pool.release import attached_here
from ipamd.pool.subnet_catalogue import SubnetCatalogue

logger = logging.getLogger(__name__)

BIND_SETTLE_S = 60.0
"""Least a new ENI's DeleteOnTermination waits: a burst's first minute of tokens goes to ENIs."""
BIND_WAIT_CAP_S = 300.0
"""Longest a new ENI's DeleteOnTermination waits for the pool to stop growing."""


class EniMaker:
    def __init__(
        self,
        engine: Engine,
        ec2: Ec2Api,
        instance: Instance,
        settings: PoolParams,
        subnets: SubnetCatalogue,
        clock: Clock,
        pace: Pace,
    ) -> None:
        self._engine = engine
        self._ec2 = ec2
        self._instance = instance
        self._settings = settings
        self._subnets = subnets
        self._clock = clock
        self._pace = pace
        self.pending: set[str] = set()
        """ENIs created but not yet in the inventory: ENI GC must not touch them."""
        self._unattached: dict[str, NetworkInterface] = {}
        """ENIs created whose attach failed in a way worth retrying (throttled, a 5xx, no answer)."""
        self._unbound: dict[str, tuple[str, float]] = {}
        """ENI → its attachment and since when its DeleteOnTermination waits for its turn."""
        self._doubt = True
        """Whether the device indexes in use may differ from the inventory's: at start, and after
        an attach failed other than by a throttle. Otherwise a new ENI needs no describe first."""
        self._changes = 0
        """Doubts raised and ENIs released so far: a listing asked for before the last of them
        is stale."""
        self._listed: dict[str, int] = {}
        """ENI → device index, attached as EC2's latest listing showed them (less those ipamd
        released since): the ones the inventory does not hold keep their indexes."""

    async def make(self, count: int, kind: Ipv4UnitKind, ec2: Ec2Api) -> tuple[str, int]:
        """A new ENI in the inventory, made through `ec2`: its ID and how many units it came with
        (they are recorded too). Its DeleteOnTermination is left to `bind_waiting` (to the drift
        if EC2 attached it but the answer, with its attachment ID, was lost)."""
        # EC2's view, not only the inventory, whenever it may differ: an ENI attached by a call
        # whose answer was lost (or before a restart, or by another user of the instance) holds
        # its device index until reconcile adopts it.
        if self._doubt:
            ticket = self._changes
            attached = await ec2.describe_enis(self._instance.instance_id)
            self.listed(ticket, attached)
        index = self._free_device_index()
        if self._unattached:
            eni = self._unattached.pop(next(iter(self._unattached)))
        else:
            eni = await self._create(count, kind, ec2)
        held = eni.units(kind)
        self.pending.add(eni.eni_id)
        try:
            attachment_id = await self._attach(eni, index, ec2)
            await self._engine.add_eni(eni_record(eni, index, self._clock.now()))
            if held:
                await self._engine.add_units(eni.eni_id, held, kind)
        except BaseException:
            if eni.eni_id not in self._unattached:
                self.pending.discard(eni.eni_id)
            raise
        self.bind_later(eni.eni_id, attachment_id)
        self.pending.discard(eni.eni_id)
        logger.info(
            "pool.eni_attached eni_id=%s device_index=%d units=%d", eni.eni_id, index, len(held)
        )
        return eni.eni_id, len(held)

    def listing_ticket(self) -> int:
        """Taken just before EC2's listing of the instance's ENIs is asked for (`listed`)."""
        return self._changes

    def listed(self, ticket: int, enis: tuple[NetworkInterface, ...]) -> None:
        """EC2's listing of the instance's ENIs, asked for when `ticket` was taken: unless a doubt
        arose or ipamd released an ENI since, new ENIs take their device indexes from it (with the
        inventory), and it settles the doubt as the describe of `make` would, so the drift's read
        at start (or any later one) spares the next new ENI a describe of its own."""
        if ticket != self._changes:
            return
        self._doubt = False
        self._listed = {e.eni_id: e.device_index for e in enis if e.device_index is not None}
        for eni_id in self._listed.keys() & self._unattached.keys():
            # Attached after all (an answer lost): the drift adopts it into the inventory.
            del self._unattached[eni_id]
            self.pending.discard(eni_id)

    def released(self, eni_id: str) -> None:
        """ipamd detached the ENI (or found it no longer attached), and it left the inventory: its
        device index is free, whatever a listing asked for before says."""
        self._listed.pop(eni_id, None)
        self._changes += 1

    @property
    def unbound(self) -> set[str]:
        """ENIs whose DeleteOnTermination waits for `bind_waiting`: the drift leaves it to us."""
        return set(self._unbound)

    def bind_later(self, eni_id: str, attachment_id: str | None) -> None:
        """DeleteOnTermination for a new ENI, as background work once the pool has nothing more to
        grow (`bind_waiting`): a burst's tokens go to the ENIs pods wait for first. If no attachment
        ID came back, the drift sets it."""
        if attachment_id is not None:
            self._unbound[eni_id] = (attachment_id, self._clock.now())

    async def bind(self, eni_id: str, attachment_id: str) -> None:
        """DeleteOnTermination, as background work: while background work is held it waits for
        `bind_waiting`; if it fails, the drift sets it."""
        if self._pace.held():  # a throttle on an earlier call of this sweep holds the rest
            return
        try:
            background = self._ec2.with_urgency(CallUrgency.BACKGROUND)
            await background.set_delete_on_termination(eni_id, attachment_id)
        except CloudError as err:
            if isinstance(err, Throttled):
                self._pace.throttle_seen()
            logger.warning("pool.delete_on_termination_left eni_id=%s error=%s", eni_id, err)
        finally:
            # Only now: while the call is out, the drift must not make it a second time.
            self._unbound.pop(eni_id, None)

    def abandon(self, eni_id: str) -> None:
        """A new ENI whose round failed after it was recorded: the drift sets DeleteOnTermination."""
        self._unbound.pop(eni_id, None)
        self.pending.discard(eni_id)

    async def bind_waiting(self, growing: bool) -> None:
        """The DeleteOnTermination calls that have waited `BIND_SETTLE_S` while the pool is not
        `growing`, or `BIND_WAIT_CAP_S` while it is."""
        now = self._clock.now()
        for eni_id, (attachment_id, since) in list(self._unbound.items()):
            if eni_id not in self._engine.state.enis():
                self.abandon(eni_id)
            elif now - since >= (BIND_WAIT_CAP_S if growing else BIND_SETTLE_S):
                await self.bind(eni_id, attachment_id)

    async def drop_unattached(self) -> None:
        """The plan no longer wants an ENI: delete the ones kept for another attach."""
        for eni_id in list(self._unattached):
            try:
                await self._ec2.delete_eni(eni_id)
            except (NotFound, InUse):
                pass  # gone, or attached after all (the drift adopts it)
            except CloudError as err:
                logger.warning("pool.unattached_kept eni_id=%s error=%s", eni_id, err)
                continue  # tried again on a later tick
            del self._unattached[eni_id]
            self.pending.discard(eni_id)

    async def _create(self, count: int, kind: Ipv4UnitKind, ec2: Ec2Api) -> NetworkInterface:
        now = self._clock.now()
        tags = {
            TAG_INSTANCE_ID: self._instance.instance_id,
            TAG_CREATED_AT: datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            TAG_MANAGED_BY: MANAGED_BY,
            **dict(self._settings.enis.additional_eni_tags),
        }
        if self._settings.enis.cluster_name:
            tags[TAG_CLUSTER_NAME] = self._settings.enis.cluster_name
        description = f"ipamd: pod addresses for {self._instance.instance_id}"
        return await self._subnets.create_eni(ec2, description, tags, kind=kind, count=count)

    async def _attach(self, eni: NetworkInterface, index: int, ec2: Ec2Api) -> str | None:
        """The attachment ID, or None when EC2 did attach it but the answer was lost."""
        try:
            return await ec2.attach_eni(eni.eni_id, self._instance.instance_id, index)
        except Throttled:
            # EC2 refused it before acting: attach this one on the next round, no need to look.
            self._unattached[eni.eni_id] = eni
            raise
        except CloudError as err:
            self._doubt = True
            self._changes += 1
            # The outcome may be unknown (a timeout, a 500 after EC2 acted): EC2's view decides.
            attached = await attached_here(ec2, self._instance.instance_id, eni.eni_id)
            if attached:
                return None  # EC2 did attach it
            if attached is None or err.retryable:
                # Cannot tell, or worth another try: the next ENI the plan wants is this one (if
                # it was attached after all, the drift adopts it; if ipamd dies, ENI GC deletes it).
                self._unattached[eni.eni_id] = eni
                raise
            # Refused, and not attached, so nothing can use it: delete it now.
            try:
                await ec2.delete_eni(eni.eni_id)
            except CloudError as cleanup:
                logger.warning("pool.orphan_eni eni_id=%s error=%s", eni.eni_id, cleanup)
            raise

    def _free_device_index(self) -> int:
        """The lowest device index no attached ENI holds: the inventory's by its record, the
        others by EC2's latest listing."""
        enis = self._engine.state.enis()
        used = {e.device_index for e in enis.values()}
        used.update(index for eni_id, index in self._listed.items() if eni_id not in enis)
        return next(i for i in range(1, len(used) + 2) if i not in used)
