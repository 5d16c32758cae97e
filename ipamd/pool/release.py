"""The shrinking half of the pool manager: give units and whole ENIs back to EC2.

Units are marked `releasing` (a committed change) before EC2 is called, so no ADD can take them; if
they became needed meanwhile the release is aborted. A failure whose outcome EC2 did not tell (a
timeout, a 5xx, throttling after a retried attempt) is never settled on a Describe taken at once,
which may lag the change: what EC2 no longer lists is released, what it still lists stays
`releasing` (never handed out) until the drift reconcile settles it with a listing taken past the
grace window. A refusal means EC2 did nothing: the units are free again.

Every EC2 call here runs under the adapter's one deadline (`cloud.ec2.Boto3Ec2`): no answer in
time is a `CallTimeout`, whose outcome is unknown. The calls go through the view of the adapter the
pool manager hands each release, under the urgency of its round (`ipamd.pool.pace.Pace.urgency`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import cast

from cloud.errors import CloudError, NotFound, Throttled
from cloud.models import Ipv4UnitKind
from cloud.ports import Ec2Api
from ipamd.engine.engine import Engine

logger = logging.getLogger(__name__)


async def attached_here(ec2: Ec2Api, instance_id: str, eni_id: str) -> bool | None:
    """Whether EC2 lists the ENI as attached to the instance; None when EC2 cannot say."""
    try:
        enis = await ec2.describe_enis(instance_id)
    except CloudError:
        return None
    return any(e.eni_id == eni_id for e in enis)


class NeverReleased(ValueError):
    """Asked to give back an IPv6 node's /80, which holds every pod the node can run."""


def _never_ipv6(engine: Engine, cidrs: tuple[str, ...]) -> None:
    """Refuse, before anything is marked, a release that would take an IPv6 /80."""
    kept = [c for c in cidrs if not engine.state.releasable(c)]
    if kept:
        raise NeverReleased(f"an IPv6 /80 is never released ({', '.join(kept)})")


class Releaser:
    def __init__(
        self,
        engine: Engine,
        instance_id: str,
        still_needed: Callable[[tuple[str, ...]], set[str]],
    ) -> None:
        self._engine = engine
        self._instance_id = instance_id
        self._still_needed = still_needed
        self.in_flight: set[str] = set()
        """Units whose unassign (or whose ENI's detach) is being called right now: reconcile
        leaves them to this call instead of judging a half-done release."""

    async def release_units(self, cidrs: tuple[str, ...], ec2: Ec2Api) -> None:
        _never_ipv6(self._engine, cidrs)
        marked = await self._engine.begin_release(cidrs)
        keep = self._still_needed(marked)
        if keep:
            logger.info("pool.release_aborted units=%d reason=needed", len(keep))
            await self._engine.abort_release(keep)
        by_eni: dict[str, list[str]] = {}
        for cidr in (c for c in marked if c not in keep):
            by_eni.setdefault(self._engine.state.units()[cidr].eni_id, []).append(cidr)
        first_error: CloudError | None = None
        for eni_id, eni_cidrs in by_eni.items():
            try:
                await self._unassign(eni_id, eni_cidrs, ec2)
            except CloudError as err:
                first_error = first_error or err
        if first_error is not None:
            raise first_error

    async def release_eni(self, eni_id: str, ec2: Ec2Api) -> None:
        state = self._engine.state
        cidrs = tuple(state.units_on(eni_id))
        marked = await self._engine.begin_release(cidrs)
        if len(marked) != len(cidrs):
            await self._engine.abort_release(marked)  # something on it is in use now: keep it
            return
        self.in_flight.update((eni_id, *cidrs))
        try:
            await self._detach_and_delete(eni_id, marked, ec2)
        finally:
            self.in_flight.difference_update((eni_id, *cidrs))
        await self._engine.remove_eni(eni_id)
        logger.info("pool.eni_released eni_id=%s", eni_id)

    async def _unassign(self, eni_id: str, cidrs: list[str], ec2: Ec2Api) -> None:
        state = self._engine.state
        if not state.releasable(cidrs[0]):
            raise NeverReleased(f"{eni_id}: an IPv6 /80 is never released ({', '.join(cidrs)})")
        # Releasable: an IPv4 unit, a secondary IP or a /28, the kinds EC2 takes back.
        kind = cast(Ipv4UnitKind, state.units()[cidrs[0]].kind)
        self.in_flight.update(cidrs)
        try:
            await ec2.unassign_units(eni_id, kind, cidrs)
        except NotFound:
            pass  # already gone from the ENI: the release is complete
        except CloudError as err:
            await self._settle_release(eni_id, cidrs, err, ec2)
            raise
        finally:
            self.in_flight.difference_update(cidrs)
        await self._engine.finish_release(cidrs)
        logger.info("pool.release eni_id=%s units=%d", eni_id, len(cidrs))

    async def _settle_release(
        self, eni_id: str, cidrs: list[str], err: CloudError, ec2: Ec2Api
    ) -> None:
        """After a failed unassign: a refusal (a throttle too: EC2 refuses before acting) frees
        the units again; after an unknown outcome the units EC2 no longer lists were released and
        the others stay `releasing`."""
        if not err.retryable or isinstance(err, Throttled):
            await self._engine.abort_release(cidrs)
            return
        try:
            enis = await ec2.describe_enis(self._instance_id)
        except CloudError:
            return
        listed = {
            c for e in enis if e.eni_id == eni_id for c in (*e.units("ip"), *e.units("prefix"))
        }
        gone = [c for c in cidrs if c not in listed]
        if gone:
            await self._engine.finish_release(gone)

    async def _detach_and_delete(self, eni_id: str, marked: tuple[str, ...], ec2: Ec2Api) -> None:
        try:
            enis = await ec2.describe_enis(self._instance_id)
        except CloudError:
            await self._engine.abort_release(marked)  # nothing was asked of EC2 yet
            raise
        attachment = next((e.attachment_id for e in enis if e.eni_id == eni_id), None)
        if attachment is not None:
            try:
                await ec2.detach_eni(attachment)
            except NotFound:
                pass
            except CloudError as err:
                await self._settle_detach(eni_id, marked, err, ec2)
                raise
        try:
            await ec2.delete_eni(eni_id)
        except NotFound:
            pass
        except CloudError:
            # Detached, deleted or not: no longer ours to use. It leaves the inventory; ENI GC
            # deletes it if it is still there.
            await self._engine.remove_eni(eni_id)
            raise

    async def _settle_detach(
        self, eni_id: str, marked: tuple[str, ...], err: CloudError, ec2: Ec2Api
    ) -> None:
        """After a failed detach: a refusal (or a throttle) frees the units again; after an unknown
        outcome the ENI leaves the inventory if EC2 no longer lists it attached, else its units stay
        `releasing` until the drift sees, past the grace window, what EC2 did."""
        if not err.retryable or isinstance(err, Throttled):
            await self._engine.abort_release(marked)
            return
        attached = await attached_here(ec2, self._instance_id, eni_id)
        if attached is False:
            await self._engine.remove_eni(eni_id)
