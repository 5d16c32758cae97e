"""Addresses before the ADD (issue 39): on an emulated node with every warm target at 0, the share of
pods whose address EC2 had already assigned to the node when their sandbox's ADD arrived.

The node is `ipamd run --embedded` as a process (an m5.xlarge: 4 ENIs of 14 secondary IPs, so that
the pods fill two ENIs and start a third) with the Kubernetes API on: KUBECONFIG names the test API
server (`bench.kube_api`), on a thread of this process, holding the Node and `PODS` pods not yet
bound to any node. `WARM_ENI_TARGET`, `WARM_IP_TARGET` and `MINIMUM_IP_TARGET` are 0. Once the
daemon is ready, its pool has settled (its free count unchanged for a second) and, with the
pod-aware pool, its watch of the node's pods is open, the bench binds the pods to the node one
after another, `BIND_EVERY_S` apart, as the scheduler's bindings set
`spec.nodeName`; each pod's ADD (`POST /v1/allocations` with the pod's namespace and name, as the
plugin sends it) comes `PULL_S` after its binding, the image pull's time. A refused ADD (503
`no_address`) is tried again every `RETRY_S`, as the runtime tries a failed sandbox again, so that
one pod's wait does not leave the next ones without an address.

A pod counts as ready before its ADD when its first ADD was answered and the address it was given
was, just before that ADD was sent, assigned in EC2 to one of the instance's ENIs. EC2's view is the
embedded cloud's own file (`embedded-cloud.json` in the state directory): the embedded EC2 writes it
after each change and before answering the request that made it, so it holds every address EC2 has
assigned by the time ipamd could know of it. The two conditions agree by construction (an ADD never
calls EC2: it takes a free address of the pool, which holds only what EC2 answered, or is refused),
and an ADD answered with an address EC2 does not hold stops the bench. The pool's free count read
before each ADD would say the same (a free address is one EC2 assigned and no pod holds); EC2's
own view is read because it is what the question is about. An address EC2 assigned between that
read and the ADD counts as not ready: the figure errs low, never high.

- `pool_ready_before_add`: with `IPAMD_POD_AWARE_POOL=on`, the pool grows on each binding. Target:
  at least 0.95.
- `pool_ready_before_add_without_watch`: the same node, pods and pace with
  `IPAMD_POD_AWARE_POOL=off` (the API still on), in the same run: the pool learns of a pod at its
  ADD, as VPC CNI's does. The floor the watch is measured against.

Without the watch, every warm target at 0 is VPC CNI's `WARM_ENI_TARGET=0`: the pool fills each
ENI it attaches (the primary ENI's 14 addresses are free before the first binding) and attaches the
next one only once nothing is free. The ADD that takes an ENI's last address leaves nothing free,
which the pool sees at its next round (every `IPAMD_POOL_INTERVAL`, 5 s) or at once when an ADD
finds nothing: the next pod's ADD is refused and waits for the new ENI, one pod late per ENI
boundary (2 of 30 here). With the watch the pool holds nothing before the first binding (the goal
`pods`, `ipamd.sizing.goals.pods_goal`) and grows on the bindings, filling the ENI it touches: the
next ENI is attached while the pods bound ahead of it are on their way. The embedded EC2 attaches an
ENI in about 2 s; real EC2's latency would leave more pods waiting behind each new ENI without
the watch.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.kube_api.server import KubeApiServer
from bench.node import container_id
from bench.vpc.processes import Ipamd, bare, unix_call, wait_until
from cloud.embedded.cloud_file import CloudFacts
from cloud.embedded.cloud_keeper import CLOUD_FILE
from ipamd.wire import PATH_ALLOCATIONS, PATH_POOL

NODE = "ip-10-0-0-10.us-west-2.compute.internal"
INSTANCE_TYPE = "m5.xlarge"
MAX_PODS = 58
"""EKS's max pods of an m5.xlarge: 4 ENIs x (15 - 1) + 2."""
PODS = 30
BIND_EVERY_S = 0.25
PULL_S = 2.0
RETRY_S = 0.1
NAMESPACE = "bench"
NETWORK = "k8s-pod-network"
SETTINGS = {
    "IPAMD_KUBERNETES": "on",
    "MY_NODE_NAME": NODE,
    "IPAMD_EMBEDDED_INSTANCE_TYPE": INSTANCE_TYPE,
    "WARM_ENI_TARGET": "0",
    "WARM_IP_TARGET": "0",
    "MINIMUM_IP_TARGET": "0",
    "ENABLE_PREFIX_DELEGATION": "false",
    "AWS_VPC_K8S_CNI_LOGLEVEL": "info",
}


async def run(workdir: Path) -> dict[str, float]:
    with_watch = await asyncio.to_thread(_node_run, workdir / "watch", "on")
    without = await asyncio.to_thread(_node_run, workdir / "no-watch", "off")
    return {
        "pool_ready_before_add": with_watch,
        "pool_ready_before_add_without_watch": without,
    }


@dataclass
class Pod:
    index: int
    name: str
    tries: int = 0
    """ADDs sent so far."""
    ready: bool | None = None
    """Whether its first ADD was answered with an address EC2 held before it (None: not yet)."""


def _node_run(workdir: Path, pod_aware: str) -> float:
    """One node from a fresh start: the pods bound and ADDed; the share ready before their ADD."""
    workdir.mkdir(parents=True)
    with KubeApiServer(workdir / "kube") as api:
        api.add_node(NODE, max_pods=MAX_PODS, instance_type=INSTANCE_TYPE)
        pods = [Pod(n, f"web-{n:02d}") for n in range(PODS)]
        for pod in pods:
            api.add_pod(pod.name, namespace=NAMESPACE)  # created, not yet scheduled
        env = SETTINGS | {"KUBECONFIG": str(api.kubeconfig), "IPAMD_POD_AWARE_POOL": pod_aware}
        with _ipamd(workdir, env) as node:
            if pod_aware == "on":
                wait_until(lambda: api.watch_count() or None, "the pod watch open", 30.0)
            spare = _settled_free(node)
            schedule(
                pods,
                bind=lambda pod: api.bind_pod(NAMESPACE, pod.name, NODE),
                add=lambda pod: _add(node, pod),
            )
    ready = sum(1 for pod in pods if pod.ready)
    late = [f"{pod.name} ({pod.tries} tries)" for pod in pods if not pod.ready]
    print(
        f"bench: pod_aware: IPAMD_POD_AWARE_POOL={pod_aware}: {spare} free before the first "
        f"binding; {ready} of {PODS} pods ready before their ADD; not: {', '.join(late) or 'none'}",
        file=sys.stderr,
        flush=True,
    )
    return ready / PODS


@contextmanager
def _ipamd(workdir: Path, env: dict[str, str]) -> Iterator[Ipamd]:
    node = Ipamd.start(workdir, env)
    try:
        node.wait_ready()
        yield node
    finally:
        node.stop()


def schedule(
    pods: Sequence[Pod],
    bind: Callable[[Pod], object],
    add: Callable[[Pod], bool],
    *,
    every_s: float = BIND_EVERY_S,
    pull_s: float = PULL_S,
    retry_s: float = RETRY_S,
    limit_s: float = 120.0,
) -> None:
    """Bindings `every_s` apart in the pods' order, each pod's ADD `pull_s` after its binding and
    again every `retry_s` while `add` says it was refused, in time order from this one thread."""
    start = time.monotonic()
    events = [(start + n * every_s, n, "bind", pod) for n, pod in enumerate(pods)]
    events += [(at + pull_s, n, "add", pod) for at, n, _, pod in events]
    while events:
        events.sort(key=lambda e: (e[0], e[1]))
        at, n, what, pod = events.pop(0)
        time.sleep(max(0.0, at - time.monotonic()))
        if what == "bind":
            bind(pod)
        elif not add(pod):
            events.append((time.monotonic() + retry_s, n, "add", pod))
        if time.monotonic() - start > limit_s:
            waiting = sorted({p.name for _, _, _, p in events})
            raise RuntimeError(f"pods still without an address after {limit_s} s: {waiting}")


def _add(node: Ipamd, pod: Pod) -> bool:
    """One ADD of `pod`, as the plugin sends it; whether it was answered."""
    cloud_file = node.workdir / "state" / CLOUD_FILE
    before = ec2_addresses(cloud_file)
    body = {
        "container_id": container_id("pod-aware", pod.index),
        "ifname": "eth0",
        "network": NETWORK,
        "pod": {"namespace": NAMESPACE, "name": pod.name, "uid": f"uid-{pod.name}"},
    }
    status, answer = unix_call(node.socket_path, "POST", PATH_ALLOCATIONS, body)
    return answered(pod, status, answer, before, lambda: ec2_addresses(cloud_file))


def answered(
    pod: Pod,
    status: int,
    answer: Mapping[str, Any],
    before: Set[str],
    ec2_now: Callable[[], Set[str]],
) -> bool:
    """Counts one ADD of `pod`, answered `status` and `answer` (`before`: the addresses EC2 held
    just before it was sent): whether it was answered. The pod is ready when its first ADD was
    answered with one of `before`. An address EC2 does not hold even after the answer (`ec2_now`),
    or an answer other than 200 or 503 `no_address`, is a fault of the bench or the daemon and
    raises. (An address EC2 assigned between the read and the ADD counts as not ready: the count
    errs low, never high.)"""
    pod.tries += 1
    if status == 503 and answer.get("code") == "no_address":
        pod.ready = False
        return False
    if status != 200:
        raise RuntimeError(f"ADD of {pod.name}: {status} {answer}")
    address = bare(str(answer["ips"][0]["address"]))
    if address not in before and address not in ec2_now():
        raise RuntimeError(f"{pod.name} was given {address}, which EC2 does not hold")
    if pod.tries == 1:
        pod.ready = address in before
    return True


def _settled_free(node: Ipamd, steady_s: float = 1.0, deadline_s: float = 30.0) -> int:
    """The pool's free addresses once the count has stayed the same for `steady_s` (the pool is
    done with what start-up asked of it), so that every run's first binding meets the same pool."""
    end = time.monotonic() + deadline_s
    last, since = -1, time.monotonic()
    while time.monotonic() < end:
        counts = node.get(PATH_POOL)["counts"]
        assert isinstance(counts, dict)
        free = int(counts["free"])
        if free != last:
            last, since = free, time.monotonic()
        elif time.monotonic() - since >= steady_s:
            return free
        time.sleep(0.1)
    raise RuntimeError(f"the pool did not settle within {deadline_s} s")


def ec2_addresses(cloud_file: Path) -> set[str]:
    """The secondary IPs EC2 holds now on the ENIs attached to the instance, from the embedded
    cloud's file."""
    facts = CloudFacts.from_json(cloud_file.read_text(), cloud_file)
    return {
        ip
        for eni in facts.enis
        if eni.attachment is not None and eni.attachment.instance_id == facts.instance_id
        for ip in eni.secondary_ips
    }


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="ipamd-bench-pod-aware-") as tmp:
        for name, value in asyncio.run(run(Path(tmp))).items():
            print(f"{name}: {value:.3f}", file=sys.stdout)
