"""ENI GC: delete ENIs ipamd created that are detached and old enough to be sure they are leftovers
(a crash between create and attach, a failed detach-then-delete).

With a cluster name, the sweep covers the cluster's ENIs, as VPC CNI's does: an instance that
terminated between create and attach (or between detach and delete) never sweeps its own again, so
its leftovers are deleted by whichever node sweeps next. Without one, it covers this instance's.
The query is scoped by tags (created by ipamd; the cluster or this instance) and status
`available`, never a VPC-wide scan. An ENI is spared while it is fresh (the grace window covers
create → attach, which can take seconds), while the pool manager is attaching it, and whenever it
is in ipamd's inventory, and always when it is tagged `node.k8s.amazonaws.com/no_manage=true`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from datetime import datetime

from cloud.errors import CloudError, InUse, NotFound
from cloud.models import NetworkInterface
from cloud.ports import (
    MANAGED_BY,
    TAG_CLUSTER_NAME,
    TAG_CREATED_AT,
    TAG_INSTANCE_ID,
    TAG_MANAGED_BY,
    Ec2Api,
)
from ipamd.clock import Clock
from ipamd.sizing.subnets import left_alone

logger = logging.getLogger(__name__)


class EniGc:
    def __init__(
        self,
        ec2: Ec2Api,
        instance_id: str,
        grace_s: float,
        clock: Clock,
        spared: Callable[[], Collection[str]],
        cluster_name: str = "",
    ) -> None:
        self._ec2 = ec2
        self._instance_id = instance_id
        self._grace_s = grace_s
        self._clock = clock
        self._spared = spared
        self._scope = (
            {TAG_CLUSTER_NAME: cluster_name, TAG_MANAGED_BY: MANAGED_BY}
            if cluster_name
            else {TAG_INSTANCE_ID: instance_id, TAG_MANAGED_BY: MANAGED_BY}
        )
        self.deleted = 0

    async def run_once(self) -> tuple[str, ...]:
        """Delete what qualifies; returns the ENI IDs deleted."""
        enis = await self._ec2.find_enis(self._scope, available_only=True)
        spared = set(self._spared())
        deleted: list[str] = []
        for eni in enis:
            if eni.status != "available" or eni.eni_id in spared or not self._old_enough(eni):
                continue
            if left_alone(eni.tags, eni.interface_type, is_primary=False):
                continue  # someone else's now
            try:
                await self._ec2.delete_eni(eni.eni_id)
            except (NotFound, InUse):
                continue  # gone already, or attached again since the listing
            except CloudError as err:
                logger.warning("eni_gc.failed eni_id=%s error=%s", eni.eni_id, err)
                continue
            deleted.append(eni.eni_id)
            logger.info("eni_gc.deleted eni_id=%s", eni.eni_id)
        self.deleted += len(deleted)
        return tuple(deleted)

    def _old_enough(self, eni: NetworkInterface) -> bool:
        created = eni.tags.get(TAG_CREATED_AT)
        if created is None:
            return False  # no birth date: never judged old
        try:
            born = datetime.strptime(created, "%Y-%m-%dT%H:%M:%S%z").timestamp()
        except ValueError:
            return False
        return self._clock.now() - born >= self._grace_s
