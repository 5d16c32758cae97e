"""ipamd's part in its own Node's life in Kubernetes, built once at start (`connect`):

- whether the API is used at all (IPAMD_KUBERNETES: `auto` uses it when a kubeconfig or the pod's
  service-account token is there; `--embedded` only with KUBECONFIG), waiting a bounded time for
  the node's object at start (VPC CNI waits 30 s, then starts without the API);
- custom networking's ENIConfig, chosen by VPC CNI's rules from the node's labels and annotation
  (`ipamd.kube.node.eniconfig_name`) and read from the API;
- the startup taint (IPAMD_STARTUP_TAINT), removed from this node once ipamd serves ADDs, retried
  until it is gone;
- pod IPs (ANNOTATE_POD_IP): `Annotating` wraps ADD and DEL and writes the annotation after each;
  a write that fails is logged and never fails the pod's ADD or DEL.

A missing or invalid ENIConfig is a start-up refusal (`SettingUnusable`) naming the resource, as the
file's absence is; the API unreachable at start falls back to IPAMD_ENI_CONFIG_FILE when there is
one. One read from the API is then followed (`ipamd.kube.eniconfigs`): a change applies to the next
ENI.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from functools import partial
from typing import Any, Protocol

from cloud.errors import CloudError
from datastore.records import AllocationKey, AllocationRecord
from ipamd.config.eniconfig import EniConfig
from ipamd.config.groups import CustomNetworkingSettings, KubeSettings
from ipamd.config.kinds import Taint
from ipamd.config.kubelet import KubeletConfig
from ipamd.engine.engine import PodAddresses
from ipamd.engine.state import NodeState
from ipamd.errors import SettingUnusable
from ipamd.kube.client import KubeApi, KubeError, KubeRefused, KubeUnavailable
from ipamd.kube.credentials import CredentialsError, find
from ipamd.kube.eniconfigs import EniConfigFollower, EniConfigTarget
from ipamd.kube.node import NodeObjects, capacity_pods, eniconfig_name
from ipamd.kube.pods import PodWatch
from ipamd.model import PodRef

logger = logging.getLogger(__name__)

START_WAIT_S = 30.0
"""How long start-up waits for the API server before going on without it (VPC CNI's wait)."""
TAINT_RETRY_CAP_S = 30.0
EVENT_SPACING_S = 600.0
"""Least time between two Events of one reason and EC2 call."""


class KubeNode:
    """This node's objects in the API, and what ipamd does with them."""

    def __init__(
        self,
        objects: NodeObjects,
        settings: KubeSettings,
        custom: CustomNetworkingSettings | None = None,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.objects = objects
        self.settings = settings
        self.custom = custom or CustomNetworkingSettings()
        """Custom networking's settings: which of the node's labels names its ENIConfig."""
        self._sleep = sleep
        self._rng = rng or random.Random()
        self.reachable = False
        self.node_at_start: dict[str, Any] = {}
        """The node's object as start-up read it ({} when it could not)."""
        self.eni_config_read: EniConfig | None = None
        """Custom networking's ENIConfig as start-up read it from the API (None: not read)."""
        self._events: set[asyncio.Task[None]] = set()

    async def close(self) -> None:
        await self.objects.api.close()

    async def wait_for_node(self, deadline_s: float = START_WAIT_S) -> bool:
        """Read the node's object, retrying until `deadline_s`; whether the API answered."""
        loop = asyncio.get_running_loop()
        end, attempt = loop.time() + deadline_s, 0
        while True:
            attempt += 1
            try:
                self.node_at_start = await self.objects.node()
                self.reachable = True
                return True
            except KubeError as err:
                left = end - loop.time()
                if left <= 0 or (isinstance(err, KubeRefused) and err.status in (401, 403, 404)):
                    logger.warning(
                        "kube.unreachable node=%s error=%s: ipamd goes on without the API",
                        self.objects.node_name,
                        err,
                    )
                    return False
                await self._sleep(min(left, self._rng.uniform(0.5, min(5.0, 0.5 * 2**attempt))))

    async def node_max_pods(self, kubelet: KubeletConfig | None) -> KubeletConfig | None:
        """`kubelet` (the kubelet config file's reading), or the Node's `status.capacity.pods` as
        the kubelet's max pods when that file gives none (VPC CNI's order: the file first, then
        the Node)."""
        if not self.reachable or (kubelet is not None and kubelet.max_pods is not None):
            return kubelet
        try:
            pods = capacity_pods(await self.objects.node())
        except KubeError as err:
            logger.warning("kube.node_unread error=%s", err)
            return kubelet
        if pods is None:
            return kubelet
        node = f"Node {self.objects.node_name} status.capacity.pods"
        path = kubelet.path if kubelet is not None else ""
        return KubeletConfig(path, max_pods=pods, source=node, read=True)

    async def eni_config(self) -> EniConfig:
        """Custom networking: the ENIConfig this node uses, by VPC CNI's rules. Raises
        `SettingUnusable` when it is missing or invalid, `KubeUnavailable` when the API did not
        answer."""
        node = await self.objects.node()
        c = self.custom
        name = eniconfig_name(node, c.eni_config_annotation, c.eni_config_label)
        try:
            spec = await self.objects.eniconfig(name)
        except KubeRefused as err:
            await self._event(
                "Warning", "InvalidENIConfig", "ReadENIConfig", f"ENIConfig {name!r}: {err}"
            )
            raise SettingUnusable(
                f"AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG=true: ENIConfig {name!r} of node "
                f"{self.objects.node_name} cannot be read ({err}); it is chosen by the node's label "
                f"vpc.amazonaws.com/externalEniConfig, annotation {c.eni_config_annotation}, "
                f"label {c.eni_config_label}, else 'default'"
            ) from None
        except ValueError as err:
            await self._event("Warning", "InvalidENIConfig", "ReadENIConfig", f"{err}")
            raise SettingUnusable(f"ENIConfig {name!r}: {err}") from None
        logger.info(
            "kube.eniconfig name=%s subnet=%s security_groups=%s",
            spec.name,
            spec.subnet_id,
            list(spec.security_groups),
        )
        self.eni_config_read = spec
        return spec

    def follow_eni_config(self, target: EniConfigTarget) -> EniConfigFollower | None:
        """The watch that applies the node's ENIConfig, as it changes, to the next ENI (None
        when none was read from the API at start). Run it with `EniConfigFollower.run`."""
        if self.eni_config_read is None:
            return None
        c = self.custom
        return EniConfigFollower(
            self.objects,
            c.eni_config_annotation,
            c.eni_config_label,
            self.eni_config_read,
            target,
            partial(self._event, "Warning", "InvalidENIConfig", "ReadENIConfig"),
            sleep=self._sleep,
            rng=self._rng,
        )

    async def remove_startup_taint(self) -> None:
        """Remove IPAMD_STARTUP_TAINT from this node, retrying with backoff until it is gone (or
        was never there); call once ipamd serves ADDs."""
        if not self.settings.startup_taint:
            return
        taint = Taint.parse(self.settings.startup_taint)
        attempt = 0
        while True:
            attempt += 1
            try:
                removed = await self.objects.remove_taint(taint)
                logger.info(
                    "kube.startup_taint_removed node=%s taint=%s was_there=%s",
                    self.objects.node_name,
                    taint,
                    removed,
                )
                return
            except KubeError as err:
                wait = self._rng.uniform(0.5, min(TAINT_RETRY_CAP_S, 2.0**attempt))
                logger.warning(
                    "kube.startup_taint_failed node=%s taint=%s error=%s retry_in_s=%.1f",
                    self.objects.node_name,
                    taint,
                    err,
                    wait,
                )
                await self._sleep(wait)

    async def watch_schedulable(self, pool: PoolLike, every_s: float = 30.0) -> None:
        """AWS_MANAGE_ENIS_NON_SCHEDULABLE=false: hold the pool while the node carries
        `node.kubernetes.io/unschedulable:NoSchedule`, read again every `every_s` (VPC CNI reads
        it before each pool change). An unreadable node holds nothing."""
        if self.settings.manage_enis_non_schedulable:
            return
        reason = _unschedulable(self.node_at_start)
        pool.hold_while(lambda: reason)
        if reason:
            logger.info("kube.pool_held reason=%r", reason)
        while True:
            await self._sleep(every_s)
            try:
                now = _unschedulable(await self.objects.node())
            except KubeError as err:
                logger.warning("kube.node_unread error=%s", err)
                continue
            if now != reason:
                logger.info("kube.pool_held reason=%r", now or "none")
            reason = now

    def report_missing_permissions(self, pool: PoolLike) -> None:
        """An Event `MissingIAMPermissions` (Warning, its action the EC2 call) each time the pool
        is refused for want of a permission, as VPC CNI posts it; at most one per call and
        `EVENT_SPACING_S`, so a backing-off pool does not flood the API."""
        last: dict[str, float] = {}
        loop = asyncio.get_running_loop()

        def failed(err: object) -> None:
            if not isinstance(err, CloudError) or err.code != "UnauthorizedOperation":
                return
            if loop.time() - last.get(err.operation, -EVENT_SPACING_S) < EVENT_SPACING_S:
                return
            last[err.operation] = loop.time()
            note = (
                f"Unauthorized operation: failed to call {err.operation} due to missing "
                "permissions: attach deploy/iam/ipamd-policy.json to ipamd's IAM role"
            )
            task = loop.create_task(
                self._event("Warning", "MissingIAMPermissions", err.operation, note)
            )
            self._events.add(task)
            task.add_done_callback(self._events.discard)

        pool.on_failure(failed)

    async def drain_events(self) -> None:
        """Wait for the Events being posted (a clean stop, tests)."""
        await asyncio.gather(*self._events, return_exceptions=True)

    async def _event(self, kind: str, reason: str, action: str, note: str) -> None:
        try:
            await self.objects.event(kind, reason, action, note)
        except KubeError as err:
            logger.warning("kube.event_failed reason=%s error=%s", reason, err)

    def watch_pods(self, pool: PoolLike, engine: EngineLike) -> PodWatch | None:
        """IPAMD_POD_AWARE_POOL: the watch of this node's pods, feeding the pool the ones on their
        way (None when off). Run it with `PodWatch.run`."""
        if self.settings.pod_aware_pool == "off":
            return None
        watch = PodWatch(self.objects.api, self.objects.node_name, engine.want_pool)

        def coming() -> int:
            held = {(a.pod_namespace, a.pod_name) for a in engine.state.allocations().values()}
            return watch.waiting(held)

        pool.expect_pods(coming)
        return watch

    def annotating(self, pods: PodAddresses) -> PodAddresses:
        """`pods` with ANNOTATE_POD_IP's writes after each ADD and DEL (`pods` itself when off)."""
        return Annotating(pods, self.objects) if self.settings.annotate_pod_ip else pods


class PoolLike(Protocol):
    """The pool manager's way in for the pods on their way (`ipamd.pool.manager.PoolManager`)."""

    def expect_pods(self, pods_to_come: Callable[[], int]) -> None: ...

    def hold_while(self, reason: Callable[[], str]) -> None: ...

    def on_failure(self, listener: Callable[[Any], None]) -> None: ...

    @property
    def subnets(self) -> EniConfigTarget: ...


class EngineLike(Protocol):
    """What the pod watch reads of the engine and how it wakes the pool."""

    @property
    def state(self) -> NodeState: ...

    def want_pool(self) -> None: ...


class Annotating:
    """ADD and DEL, each followed by the pod's `vpc.amazonaws.com/pod-ips` write, in the
    background: the pod's answer never waits on the API server (whose retries can take seconds),
    and the writes of one pod happen in the order of its ADD and DEL. A failed write is logged
    (`kube.annotate_failed`) and the pod's answer stands."""

    def __init__(self, inner: PodAddresses, objects: NodeObjects) -> None:
        self._inner = inner
        self._objects = objects
        self._last: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.failures = 0

    async def add(self, key: AllocationKey, pod: PodRef | None) -> AllocationRecord:
        record = await self._inner.add(key, pod)
        if pod is not None and pod.name and pod.namespace and record.addresses:
            self._then(pod, partial(self._objects.annotate_pod, *_where(pod, record)))
        return record

    async def release(self, key: AllocationKey) -> tuple[AllocationRecord, ...]:
        released = await self._inner.release(key)
        for record in released:
            if record.pod_name and record.pod_namespace and record.addresses:
                pod = PodRef(record.pod_namespace, record.pod_name, record.pod_uid)
                self._then(pod, partial(self._objects.clear_pod_ips, *_where(pod, record)))
        return released

    async def drain(self) -> None:
        """Wait for every write queued so far (for a clean stop and for tests)."""
        await asyncio.gather(*self._last.values(), return_exceptions=True)

    def _then(self, pod: PodRef, write: Callable[[], Awaitable[None]]) -> None:
        slot = (pod.namespace, pod.name)
        before = self._last.get(slot)
        task = asyncio.create_task(self._write(before, write, pod), name=f"pod-ips {slot}")
        self._last[slot] = task
        task.add_done_callback(
            lambda t: self._last.pop(slot, None) if self._last.get(slot) is t else None
        )

    async def _write(
        self, before: asyncio.Task[None] | None, write: Callable[[], Awaitable[None]], pod: PodRef
    ) -> None:
        if before is not None:
            await asyncio.gather(before, return_exceptions=True)
        try:
            await write()
        except KubeError as err:
            self.failures += 1
            logger.warning(
                "kube.annotate_failed namespace=%s name=%s error=%s", pod.namespace, pod.name, err
            )


def _unschedulable(node: dict[str, Any]) -> str:
    """Why the pool holds on `node`: its `node.kubernetes.io/unschedulable:NoSchedule` taint."""
    cordoned = Taint("node.kubernetes.io/unschedulable", "", "NoSchedule")
    taints = (node.get("spec") or {}).get("taints") or []
    return "the node is unschedulable" if any(cordoned.matches(t) for t in taints) else ""


def _where(pod: PodRef, record: AllocationRecord) -> tuple[str, str, str]:
    return pod.namespace, pod.name, record.addresses[0]


async def connect(
    config: KubeSettings,
    environ: Mapping[str, str],
    *,
    embedded: bool = False,
    custom: CustomNetworkingSettings | None = None,
) -> KubeNode | None:
    """This node's link to the API server, or None when it is not to be used. Raises
    `SettingUnusable` when IPAMD_KUBERNETES=on cannot be honoured."""
    mode = config.mode
    if mode == "off" or (mode == "auto" and embedded and not environ.get("KUBECONFIG")):
        return None
    try:
        credentials = find(environ)
    except CredentialsError as err:
        raise SettingUnusable(f"IPAMD_KUBERNETES={mode}: {err}") from None
    if credentials is None:
        if config.pod_aware_pool == "on":
            raise SettingUnusable(
                "IPAMD_POD_AWARE_POOL=on: needs the Kubernetes API (no kubeconfig and no "
                "service-account token)"
            )
        if mode == "on":
            raise SettingUnusable(
                "IPAMD_KUBERNETES=on: no kubeconfig (KUBECONFIG) and no service-account token"
            )
        return None
    if not config.node_name:
        raise SettingUnusable(
            f"IPAMD_KUBERNETES={mode} ({credentials.source}): needs MY_NODE_NAME, this node's "
            "name (the DaemonSet sets it from spec.nodeName)"
        )
    logger.info(
        "kube.connect server=%s source=%s node=%s",
        credentials.server,
        credentials.source,
        config.node_name,
    )
    return KubeNode(NodeObjects(KubeApi(credentials), config.node_name), config, custom)


__all__ = ["KubeNode", "KubeUnavailable", "connect"]


async def open_for(
    config: KubeSettings,
    custom: CustomNetworkingSettings,
    environ: Mapping[str, str],
    embedded: bool,
    stack: AsyncExitStack,
) -> KubeNode | None:
    """Start-up's step: this node's link to the API (None: not used), closed with `stack`, its
    node read within the start-up wait. Raises `SettingUnusable` (`connect`)."""
    kube = await connect(config, environ, embedded=embedded, custom=custom)
    if kube is None:
        return None
    stack.push_async_callback(kube.close)
    await kube.wait_for_node()
    return kube


async def eni_config_for(kube: KubeNode | None) -> EniConfig | None:
    """Custom networking's ENIConfig from the API (None: the file's, or none is used). Raises
    `SettingUnusable` when the node's ENIConfig is missing or invalid."""
    if kube is None or not kube.reachable or not kube.custom.enabled:
        return None
    try:
        return await kube.eni_config()
    except KubeUnavailable as err:
        logger.warning("kube.eniconfig_unread error=%s: IPAMD_ENI_CONFIG_FILE's is used", err)
        return None


def start_when_ready(
    kube: KubeNode | None, ready: bool, pool: PoolLike, engine: EngineLike, stack: AsyncExitStack
) -> None:
    """Once ADDs are served the node may take pods: IPAMD_STARTUP_TAINT goes, in the background,
    retried until it is gone; the pool holds while the node is cordoned, reports missing
    permissions as Events, is fed the pods bound here (IPAMD_POD_AWARE_POOL), and new ENIs follow
    the node's ENIConfig as it changes. Every task stops with `stack`."""
    if kube is None or not ready:
        return
    tasks = [
        asyncio.create_task(kube.remove_startup_taint(), name="startup-taint"),
        asyncio.create_task(kube.watch_schedulable(pool), name="node-schedulable"),
    ]
    kube.report_missing_permissions(pool)
    watch = kube.watch_pods(pool, engine)
    if watch is not None:
        tasks.append(asyncio.create_task(watch.run(), name="pod-watch"))
    follower = kube.follow_eni_config(pool.subnets)
    if follower is not None:
        tasks.append(asyncio.create_task(follower.run(), name="eniconfig-watch"))
    for task in tasks:
        stack.callback(task.cancel)
