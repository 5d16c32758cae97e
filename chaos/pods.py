"""Pod churn through the real plugin, and the ledger of what the daemon acknowledged.

Every ADD and DEL runs `ipamd-cni` as its own process, the way a container runtime does: the CNI_*
environment, the network config on stdin, the IPAM result or a CNI error on stdout. The runtime double
(`CriServer`) lists a pod's sandbox from just before its ADD until its DEL succeeded, as a real
runtime would, so the daemon's runtime leak GC sees exactly the pods that exist.

The ledger's rules:
- an ADD is acknowledged only when the plugin exited 0 with an address; that pod must then keep that
  address until its DEL. A failed ADD is cleaned up with a DEL, as runtimes do.
- a DEL is acknowledged when the plugin exited 0 without its warning that ipamd could not act: the
  daemon answered and the container must own nothing from then on. A DEL the plugin reports as done
  while ipamd was unreachable (or its state unusable) is *deferred*: the sandbox is gone from the
  runtime's list, and the leak GC must release the address later. A DEL that failed is retried.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from chaos.daemon import BIN
from ipamd.runtime.embedded_cri import CriServer

NETWORK: Final = "k8s-pod-network"
IFNAME: Final = "eth0"
DEFERRED_WARNING: Final = "reported as done"
"""What the plugin says on stderr when a DEL succeeds without ipamd having acted on it."""
PLUGIN_TIMEOUT_S: Final = 30.0

PodState = Literal["adding", "live", "del_pending", "deleting", "deleted", "deferred"]


@dataclass
class Pod:
    container_id: str
    name: str
    state: PodState = "adding"
    address: str | None = None
    """The address of its acknowledged ADD."""


@dataclass(frozen=True, slots=True)
class PluginRun:
    code: int
    out: Any
    err: str


@dataclass
class Ledger:
    pods: dict[str, Pod] = field(default_factory=dict)
    outcomes: Counter[str] = field(default_factory=Counter)
    """`add:ok`, `add:<cni code>`, `del:ok`, `del:deferred`, `del:<cni code>`."""

    def in_state(self, *states: PodState) -> list[Pod]:
        return [pod for pod in self.pods.values() if pod.state in states]

    @property
    def adds_acknowledged(self) -> int:
        return self.outcomes["add:ok"]

    @property
    def dels_acknowledged(self) -> int:
        return self.outcomes["del:ok"]


def _cni_code(run: PluginRun) -> str:
    if isinstance(run.out, dict) and "code" in run.out:
        return str(run.out["code"])
    return f"exit{run.code}"


class Churn:
    """Adds and deletes pods through `ipamd-cni`, keeping between `low` and `high` pods alive."""

    def __init__(
        self,
        cri: CriServer,
        socket_path: Path,
        ledger: Ledger,
        *,
        seed: int,
        low: int = 4,
        high: int = 14,
    ) -> None:
        self._cri = cri
        self.ledger = ledger
        self._seed = seed
        self._rng = random.Random(seed)
        self._low, self._high = low, high
        self._sequence = 0
        self._conf = json.dumps(
            {
                "cniVersion": "1.1.0",
                "name": NETWORK,
                "type": "ptp",
                "ipam": {"type": "ipamd-cni", "socket": str(socket_path)},
            }
        ).encode()

    async def step(self, operations: int) -> None:
        """`operations` ADDs and DELs at once, chosen by the seeded random source."""
        live = self.ledger.in_state("live")
        self._rng.shuffle(live)
        chosen: list[Pod | None] = []
        for _ in range(operations):
            count = len(live) + chosen.count(None)
            want_add = count < self._low or (count < self._high and self._rng.random() < 0.5)
            chosen.append(None if want_add or not live else live.pop())
        async with asyncio.TaskGroup() as tasks:
            for pod in chosen:
                tasks.create_task(self.add() if pod is None else self.delete(pod))

    async def add(self) -> Pod:
        """A new pod: its sandbox, then its ADD (cleaned up with a DEL if it failed)."""
        pod = self._new_pod()
        self._cri.add(pod.container_id, "chaos", pod.name, uid=f"uid-{pod.container_id[:12]}")
        run = await self._plugin("ADD", pod)
        address = _address(run)
        if address is None:
            self.ledger.outcomes[f"add:{_cni_code(run)}"] += 1
            await self.delete(pod)
        else:
            self.ledger.outcomes["add:ok"] += 1
            pod.state, pod.address = "live", address
        return pod

    async def add_until_served(self, deadline_s: float) -> bool:
        """ADDs until one is acknowledged (the pool may be refilling), within `deadline_s`."""
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline_s
        while loop.time() < end:
            if (await self.add()).state == "live":
                return True
            await asyncio.sleep(0.2)
        return False

    async def delete(self, pod: Pod) -> None:
        pod.state = "deleting"
        run = await self._plugin("DEL", pod)
        if run.code != 0:
            self.ledger.outcomes[f"del:{_cni_code(run)}"] += 1
            pod.state = "del_pending"
            return
        deferred = DEFERRED_WARNING in run.err
        self.ledger.outcomes["del:deferred" if deferred else "del:ok"] += 1
        pod.state = "deferred" if deferred else "deleted"
        self._cri.remove(pod.container_id)

    async def retry_deletes(self, deadline_s: float) -> bool:
        """DEL again every pod whose DEL failed, until none is left or `deadline_s` passed."""
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline_s
        while pending := self.ledger.in_state("del_pending"):
            if loop.time() >= end:
                return False
            async with asyncio.TaskGroup() as tasks:
                for pod in pending:
                    tasks.create_task(self.delete(pod))
            if self.ledger.in_state("del_pending"):
                await asyncio.sleep(0.2)
        return True

    def _new_pod(self) -> Pod:
        self._sequence += 1
        digest = hashlib.sha256(f"chaos/{self._seed}/{self._sequence}".encode()).hexdigest()
        pod = Pod(container_id=digest, name=f"chaos-{self._sequence}")
        self.ledger.pods[pod.container_id] = pod
        return pod

    async def _plugin(self, command: str, pod: Pod) -> PluginRun:
        environ = {
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": pod.container_id,
            "CNI_NETNS": f"/var/run/netns/cni-{pod.container_id[:12]}",
            "CNI_IFNAME": IFNAME,
            "CNI_PATH": "/opt/cni/bin",
            "CNI_ARGS": (
                f"IgnoreUnknown=1;K8S_POD_NAMESPACE=chaos;K8S_POD_NAME={pod.name};"
                f"K8S_POD_INFRA_CONTAINER_ID={pod.container_id};K8S_POD_UID=uid-{pod.name}"
            ),
        }
        process = await asyncio.create_subprocess_exec(
            str(BIN / "ipamd-cni"),
            env=environ,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(self._conf), PLUGIN_TIMEOUT_S)
        code = process.returncode if process.returncode is not None else -1
        try:
            parsed = json.loads(out) if out.strip() else None
        except ValueError:
            parsed = None
        return PluginRun(code, parsed, err.decode(errors="replace"))


def _address(run: PluginRun) -> str | None:
    """The pod's address from an ADD's IPAM result (without its prefix length), if it succeeded."""
    if run.code != 0 or not isinstance(run.out, dict):
        return None
    ips: Sequence[Any] = run.out.get("ips") or []
    if not ips or not isinstance(ips[0], dict):
        return None
    return str(ips[0].get("address", "")).partition("/")[0] or None
