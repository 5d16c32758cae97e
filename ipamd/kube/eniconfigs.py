"""Custom networking at run time: the node's ENIConfig followed while ipamd runs, each change applied
to the next ENI it creates (ENIs already attached keep their subnet and groups, as in VPC CNI).

Two watches, both narrowed to one object: this node's Node (`metadata.name`), whose labels and
annotation choose the ENIConfig (`ipamd.kube.node.eniconfig_name`), and the chosen ENIConfig
(`metadata.name`), watched again under its new name when the node's choice changes.

A chosen ENIConfig that is missing or invalid keeps new ENIs on the last good one: ipamd never guesses
a subnet, and a resource being replaced does not stop the pool. The problem is an error in the log,
a Warning Event `InvalidENIConfig` on the node (once per problem), and a reason under `degraded` in
`/readyz` and `ipamctl status` until a valid one is read.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from typing import Any, Protocol

from ipamd.config.eniconfig import EniConfig
from ipamd.kube.node import ENICONFIGS, NodeObjects, eniconfig_name, parse_eniconfig
from ipamd.kube.watch import ListWatch

logger = logging.getLogger(__name__)

Obj = dict[str, Any]


class EniConfigTarget(Protocol):
    """Where new ENIs are made (`ipamd.pool.subnet_catalogue.SubnetCatalogue`)."""

    def follow_eni_config(self, config: EniConfig, problem: str = "") -> None: ...


class EniConfigFollower:
    def __init__(
        self,
        objects: NodeObjects,
        annotation_def: str,
        label_def: str,
        current: EniConfig,
        target: EniConfigTarget,
        event: Callable[[str], Coroutine[Any, Any, None]],
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        """`current`: the ENIConfig read at start; `event(note)` posts an InvalidENIConfig Event."""
        self._objects = objects
        self._keys = (annotation_def, label_def)
        self.current = current
        self.name = current.name
        """The ENIConfig the node's labels choose now."""
        self.problem = ""
        self._target = target
        self._event = event
        self._sleep = sleep
        self._rng = rng
        self._renamed = asyncio.Event()
        self._posted: set[str] = set()
        self._pending: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        """Follow the node's choice and its ENIConfig forever; never raises but on cancellation."""
        node_watch = self._list_watch(
            "/api/v1/nodes", self._objects.node_name, self._nodes, self._node, "node"
        )
        async with asyncio.TaskGroup() as group:
            group.create_task(node_watch.run())
            while True:
                name = self.name
                watch = self._list_watch(
                    ENICONFIGS,
                    name,
                    partial(self._configs, name),
                    partial(self._config, name),
                    "eniconfig",
                )
                task = group.create_task(watch.run())
                await self._renamed.wait()
                self._renamed.clear()
                task.cancel()

    def _list_watch(
        self,
        collection: str,
        name: str,
        on_list: Callable[[list[Obj]], None],
        on_event: Callable[[str, Obj], None],
        what: str,
    ) -> ListWatch:
        return ListWatch(
            self._objects.api,
            collection,
            f"metadata.name={name}",
            on_list,
            on_event,
            what=what,
            sleep=self._sleep,
            rng=self._rng,
        )

    def _nodes(self, items: list[Obj]) -> None:
        if items:
            self._node("MODIFIED", items[0])

    def _node(self, kind: str, node: Obj) -> None:
        if kind == "DELETED":
            return
        name = eniconfig_name(node, *self._keys)
        if name != self.name:
            logger.info("kube.eniconfig_chosen name=%s was=%s", name, self.name)
            self.name = name
            self._renamed.set()

    def _configs(self, name: str, items: list[Obj]) -> None:
        if items:
            self._config(name, "MODIFIED", items[0])
        else:
            self._unusable(name, f"ENIConfig {name!r} does not exist")

    def _config(self, name: str, kind: str, obj: Obj) -> None:
        if name != self.name:
            return  # an event of the watch being replaced
        if kind == "DELETED":
            self._unusable(name, f"ENIConfig {name!r} was deleted")
            return
        try:
            config = parse_eniconfig(name, obj)
        except ValueError as err:
            self._unusable(name, str(err))
            return
        if config == self.current and not self.problem:
            return
        logger.info(
            "kube.eniconfig_followed name=%s subnet=%s security_groups=%s: new ENIs use it",
            config.name,
            config.subnet_id,
            list(config.security_groups),
        )
        self.current, self.problem = config, ""
        self._target.follow_eni_config(config)

    def _unusable(self, name: str, why: str) -> None:
        problem = (
            f"custom networking: {why} (chosen for node {self._objects.node_name}); new ENIs "
            f"keep ENIConfig {self.current.name!r} (subnet {self.current.subnet_id})"
        )
        if problem == self.problem:
            return
        logger.error("kube.eniconfig_unusable %s", problem)
        self.problem = problem
        self._target.follow_eni_config(self.current, problem)
        if problem not in self._posted:
            self._posted.add(problem)
            task = asyncio.create_task(self._event(problem), name="eniconfig-event")
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
