"""The daemon as pods see it: ADD+DEL pairs over the real unix socket, one client and 32 at once, with
250 pods held, and the memory the daemon process takes doing it.

The daemon is `ipamd run` as a child process, on an embedded EC2 and IMDS served from this process
(so its resident memory is the daemon's alone, moto's is not in it). An m5.large in prefix mode (three
ENIs of nine /28s: 432 addresses, with max pods raised past EKS's 110 to match) is filled by
`MINIMUM_IP_TARGET` before anything is timed, so no ADD waits for EC2: what is measured is the API,
the engine and the durable commit behind each answer.
`IP_COOLDOWN_PERIOD=0` lets a released address be taken by the next pair; with VPC CNI's 30 s, a
thousand pairs a second would cool 30,000 addresses. Every pair uses a fresh container ID (a DEL
leaves a delete intent for its ID), as the runtime does. Host networking is off: the socket, the
engine and the state file are what this family measures (`bench.hostnet` prices the rules).

aws-node's checkpoint, which every ADD waits for (`ipamd.awsnode.keeper`), is kept on a tmpfs, as
on an EKS node, where `/var/run/aws-node` is one (`/dev/shm` here; the state directory's disk when
there is none, said on stderr).

Each request is one HTTP/1.1 exchange on its own connection, as `ipamd-cni` makes it. The one-client
figures follow 200 untimed pairs: the first writes of a fresh state file also grow its write-ahead
log (each fsync then commits file metadata too), which a daemon that has run a while no longer pays.
They are made from this process, alternated with round trips to `bench.socket_floor`, a trivial
server in a process of its own, made the same way: `api_add_del_over_socket_floor` is the pair's p50
over that round trip's, what the pair costs in units of what this machine, at that moment, charges for
the least exchange over a unix socket. Its target, 25, holds the pair (two exchanges, so 2 at the very
least) to the daemon's work on top of the socket: about 16 here, where the pair's p50 is 2 ms and
the round trip's 0.12 ms; a slower machine slows both, so the ratio stays, while a regression in
the daemon moves it.

The 32 clients are 32 processes of `bench.api_client`, as 32 pods starting at once on a node are 32
plugins: each uses the plugin's own client, each is started and has imported it before a go signal
that all receive at once (their start is not timed), and each reports every pair's start and end.
`api_pairs_per_s` counts their pairs from the first start to the last end. With 32 clients always
waiting, a pair's time is mostly the queue ahead of it (32 over the rate a second is about 26 ms),
and the slowest are those in flight when the daemon stops. Measured (client marks against the
daemon's own timestamps): a full garbage collection, which walked start-up's objects with the loop
stopped for about 50 ms (now frozen out of collections at start, `ipamd.node.compose.freeze_start_up`), and
the clients' own interpreter exits at the end of the run (a client now exits only once all have
reported). What is left is the daemon's share of two cores with the 32 clients and whatever else
runs: it is on the CPU for about 80% of the clients' run and waits for it, runnable, another 5-30%.
The slowest requests spent their time inside their handlers, waiting for the engine's turn, not
in the accept queue or the connection's set-up; and neither aws-node's checkpoint (0.13 ms a write,
at most 0.3) nor the commit itself (0.43 ms at p50 for about 25 changes, 1.3 at p99) is the tail.

Memory with the Kubernetes API (issue 39): `daemon_rss_mib_250_pods` is the daemon above, with the
API off (`IPAMD_KUBERNETES=off`), once its clients are done. `daemon_rss_mib_250_pods_with_api` is
a second daemon in the same run, the same settings and the same requests (the pool filled, the
250 pods held, the untimed pairs, the one-client pairs and the 32 clients' pairs; no floor, which
is another process), with the API on: KUBECONFIG names the test API server (`bench.kube_api`, on a
thread of this process) holding this node, its 250 pods, 100,000 pods bound to 1,000 other nodes
and 5,000 ENIConfigs (`add_bulk`), and the pod-aware pool on (its default with the API), so the
daemon lists and watches its node's pods. Both daemons' 250 held ADDs name their pods. Target: the
second within 15 MiB of the first (`daemon_rss_mib_api_delta`, the difference). An ipamd that read
the cluster's pods would hold the 100,000 (aws-node once grew to 400-450 MiB that way).
`api_requests_node_scoped` is 1 when the server's request log holds at least one pod list and one
pod watch, and every one of them selects `spec.nodeName=<this node>`; else 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path
from typing import Any

from bench.kube_api.recorded import RecordedRequest
from bench.kube_api.server import KubeApiServer
from bench.timing import p50, p99
from bench.vpc.processes import free_port
from chaos.daemon import BIN, Endpoints, daemon_environment
from cloud.embedded.imds_sim import ImdsSimulator
from cloud.embedded.world import EmbeddedEc2
from ipamd.wire import PATH_ALLOCATIONS, PATH_POOL, PATH_READYZ

HELD = 250
PAIRS_ONE_CLIENT = 1000
WARMUP_PAIRS = 200
CLIENTS = 32
PAIRS_PER_CLIENT = 150
NETWORK = "k8s-pod-network"
NODE = "ip-10-0-0-10.us-west-2.compute.internal"
NAMESPACE = "bench"
OTHER_PODS = 100_000
ENICONFIGS = 5_000
ROOT = Path(__file__).resolve().parent.parent
REPORT_LIMIT = 1 << 20
"""A client's report is one line of about 60 bytes a pair; the stream's default limit is 64 KiB."""
"""Where `python -m bench.api_client` finds the `bench` package."""
SETTINGS = {
    "ENABLE_PREFIX_DELEGATION": "true",
    "WARM_PREFIX_TARGET": "1",
    "WARM_IP_TARGET": "",
    # The whole node (3 ENIs x 9 /28s): the pool is full before anything is timed, and then has
    # nothing left to do, so no EC2 call competes with the requests being timed.
    "MINIMUM_IP_TARGET": "432",
    # EKS would cap an m5.large (2 vCPUs) at 110 pods; 250 held pods plus 32 clients need more, so
    # the node runs with kubelet's max pods raised, as an operator who raises it sets this too.
    "IPAMD_MAX_PODS": "434",
    "IP_COOLDOWN_PERIOD": "0",
    "IPAMD_HOST_NETWORK": "off",
    "IPAMD_POOL_INTERVAL": "0.5",
    "AWS_VPC_K8S_CNI_LOGLEVEL": "warn",
    # The introspection server's fixed port may be taken by another daemon on this machine.
    "DISABLE_INTROSPECTION": "true",
}


async def run(workdir: Path) -> dict[str, float]:
    async with _daemon(workdir, {"IPAMD_KUBERNETES": "off"}) as (socket_path, pid):
        await _hold(socket_path)
        async with _floor_server(workdir / "floor.sock") as floor_path:
            one: list[float] = []
            floor: list[float] = []
            for n in range(PAIRS_ONE_CLIENT):  # alternated: both see the same machine at once
                one.append(await _pair(socket_path, f"one-{n}"))
                floor.append(await _round_trip(floor_path))
        marks = await _client_processes(socket_path)
        rss = _rss_mib(pid)
    with_api, node_scoped = await _with_api(workdir / "with-api")
    pairs = [(end - start) / 1e6 for client in marks for start, _, end in client]
    first = min(start for client in marks for start, _, _ in client)
    last = max(end for client in marks for _, _, end in client)
    return {
        "api_add_del_p50_ms": p50(one),
        "api_add_del_p99_ms": p99(one),
        "api_socket_round_trip_p50_ms": p50(floor),
        "api_add_del_over_socket_floor": p50(one) / p50(floor),
        "api_pairs_per_s": len(pairs) / ((last - first) / 1e9),
        "api_add_del_p50_ms_32_clients": p50(pairs),
        "api_add_del_p99_ms_32_clients": p99(pairs),
        "daemon_rss_mib_250_pods": rss,
        "daemon_rss_mib_250_pods_with_api": with_api,
        "daemon_rss_mib_api_delta": with_api - rss,
        "api_requests_node_scoped": 1.0 if node_scoped else 0.0,
    }


async def _hold(socket_path: Path) -> None:
    """The pool filled, the 250 pods held (each ADD naming its pod), the untimed pairs made."""
    await _warm(socket_path, 432)
    for n in range(HELD):
        await _add(socket_path, f"held-{n}", {"namespace": NAMESPACE, "name": f"held-{n}"})
    for n in range(WARMUP_PAIRS):  # untimed: the first pairs of a run pay for warming caches
        await _pair(socket_path, f"warm-{n}")


async def _with_api(workdir: Path) -> tuple[float, bool]:
    """The daemon again, with the Kubernetes API and a large cluster behind it, through the same
    requests: its RSS once the clients are done, and whether every pod list and watch it made
    named its node."""
    await asyncio.to_thread(workdir.mkdir)
    with KubeApiServer(workdir / "kube") as api:
        api.add_node(NODE, max_pods=int(SETTINGS["IPAMD_MAX_PODS"]))
        for n in range(HELD):
            api.add_pod(f"held-{n}", NODE, namespace=NAMESPACE, phase="Running")
        api.add_bulk(pods=OTHER_PODS, eniconfigs=ENICONFIGS)
        env = {"IPAMD_KUBERNETES": "on", "KUBECONFIG": str(api.kubeconfig), "MY_NODE_NAME": NODE}
        async with _daemon(workdir, env) as (socket_path, pid):
            await _hold(socket_path)
            for n in range(PAIRS_ONE_CLIENT):
                await _pair(socket_path, f"one-{n}")
            await _client_processes(socket_path)
            if not api.watch_count():
                raise RuntimeError("the daemon with the API has no watch of its pods open")
            rss = _rss_mib(pid)
        return rss, node_scoped(api.requests_for("pods", "GET"), NODE)


def node_scoped(requests: Iterable[RecordedRequest], node: str) -> bool:
    """Whether the requests hold at least one list and one watch of pods, and every pod list and
    watch among them selects `spec.nodeName=<node>` (a GET of one pod by name is neither)."""
    listed = [r for r in requests if r.kind_plural == "pods" and r.path.endswith("/pods")]
    return (
        any(r.is_watch for r in listed)
        and any(not r.is_watch for r in listed)
        and all(r.field_selector == f"spec.nodeName={node}" for r in listed)
    )


Marks = list[list[tuple[int, int, int]]]
"""Per client process, per pair: start, ADD answered, DEL answered (monotonic ns)."""


async def _client_processes(socket_path: Path) -> Marks:
    """`CLIENTS` processes of `bench.api_client`, each started, then all told to go at once."""
    procs: list[asyncio.subprocess.Process] = []
    try:
        for client in range(CLIENTS):
            procs.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "bench.api_client",
                    str(socket_path),
                    f"c{client}",
                    str(PAIRS_PER_CLIENT),
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    cwd=ROOT,
                    limit=REPORT_LIMIT,
                )
            )
        for proc in procs:  # the barrier: every interpreter is up and has imported the client
            assert proc.stdout is not None
            if (await proc.stdout.readline()).strip() != b"ready":
                raise RuntimeError(f"client process {proc.pid} did not start")
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
        outputs = await asyncio.gather(*(_answer(proc) for proc in procs))
        for proc in procs:  # every client has reported: now they may exit
            assert proc.stdin is not None
            proc.stdin.close()
        for proc in procs:
            if await proc.wait() != 0:
                raise RuntimeError(f"client process {proc.pid} exited {proc.returncode}")
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    return [[(int(a), int(b), int(c)) for a, b, c in json.loads(out)] for out in outputs]


async def _answer(proc: asyncio.subprocess.Process) -> bytes:
    """A client's report: one line, written once its pairs are done (it exits only later)."""
    assert proc.stdin is not None and proc.stdout is not None
    await proc.stdin.drain()
    out = await proc.stdout.readline()
    if not out:
        raise RuntimeError(f"client process {proc.pid} exited {await proc.wait()} without a report")
    return out


@contextlib.asynccontextmanager
async def _floor_server(path: Path) -> AsyncIterator[Path]:
    """`bench.socket_floor` serving on `path` in a process of its own; stopped afterwards."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.socket_floor",
        str(path),
        stdout=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        if (await proc.stdout.readline()).strip() != b"ready":
            raise RuntimeError("the floor's server did not start")
        yield path
    finally:
        proc.kill()
        await proc.wait()


async def _round_trip(path: Path) -> float:
    """One request to the floor's server, made as `_request` makes the pairs' (ADD's body)."""
    body = {"container_id": "floor", "ifname": "eth0", "network": NETWORK}
    started = time.perf_counter()
    status, _ = await _request(path, "POST", PATH_ALLOCATIONS, body)
    if status != 200:
        raise RuntimeError(f"the floor's server answered {status}")
    return (time.perf_counter() - started) * 1000.0


async def _pair(socket_path: Path, container_id: str) -> float:
    started = time.perf_counter()
    await _add(socket_path, container_id)
    status, _ = await _request(
        socket_path, "DELETE", f"{PATH_ALLOCATIONS}/{container_id}/eth0?network={NETWORK}"
    )
    if status != 200:
        raise RuntimeError(f"DEL of {container_id}: {status}")
    return (time.perf_counter() - started) * 1000.0


async def _add(socket_path: Path, container_id: str, pod: dict[str, str] | None = None) -> None:
    body: dict[str, Any] = {"container_id": container_id, "ifname": "eth0", "network": NETWORK}
    if pod is not None:
        body["pod"] = pod
    status, answer = await _request(socket_path, "POST", PATH_ALLOCATIONS, body)
    if status != 200:
        raise RuntimeError(f"ADD of {container_id}: {status} {answer}")


async def _request(
    socket_path: Path, method: str, path: str, body: object = None
) -> tuple[int, Any]:
    """One exchange on a connection of its own, as lean as the plugin's (a raw socket, no stream
    objects): what is timed is the daemon, not the client's machinery."""
    payload = b"" if body is None else json.dumps(body).encode()
    head = f"{method} {path} HTTP/1.1\r\nHost: ipamd\r\nConnection: close\r\n"
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
    loop = asyncio.get_running_loop()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.setblocking(False)
        await loop.sock_connect(sock, str(socket_path))
        await loop.sock_sendall(sock, head.encode() + b"\r\n" + payload)
        chunks = []
        while chunk := await loop.sock_recv(sock, 65536):
            chunks.append(chunk)
    answer = b"".join(chunks)
    status_line, _, rest = answer.partition(b"\r\n")
    _, _, content = rest.partition(b"\r\n\r\n")
    return int(status_line.split()[1]), json.loads(content or b"{}")


async def _warm(socket_path: Path, addresses: int, deadline_s: float = 120.0) -> None:
    """Until the pool holds `addresses` free ones (the pool manager grows it on its own)."""
    assert addresses > HELD + CLIENTS
    end = time.monotonic() + deadline_s
    while True:
        status, pool = await _request(socket_path, "GET", PATH_POOL)
        if status == 200 and pool["counts"]["free"] >= addresses:
            return
        if time.monotonic() > end:
            raise RuntimeError(f"the pool did not reach {addresses} free addresses: {pool}")
        await asyncio.sleep(0.2)


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    raise RuntimeError(f"no VmRSS for process {pid}")


@contextlib.contextmanager
def _tmpfs_dir() -> Iterator[Path]:
    """A directory on a tmpfs, where a node keeps aws-node's checkpoint; removed afterwards."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        print("bench: no /dev/shm: the checkpoint goes on the state's disk", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="ipamd-bench-", dir=shm if shm.is_dir() else None) as d:
        yield Path(d)


@contextlib.asynccontextmanager
async def _daemon(workdir: Path, extra: dict[str, str]) -> AsyncIterator[tuple[Path, int]]:
    stack = contextlib.ExitStack()
    with stack:
        async with _daemon_in(workdir, stack, extra) as daemon:
            yield daemon


@contextlib.asynccontextmanager
async def _daemon_in(
    workdir: Path, stack: contextlib.ExitStack, extra: dict[str, str]
) -> AsyncIterator[tuple[Path, int]]:
    host = EmbeddedEc2("server").start()
    imds: ImdsSimulator | None = None
    process: asyncio.subprocess.Process | None = None
    try:
        world = host.world("m5.large", region="us-west-2")
        imds = ImdsSimulator(world)
        imds_url = await imds.start()
        assert world.endpoint_url is not None
        ends = Endpoints(
            ec2_url=world.endpoint_url,
            imds_url=imds_url,
            region=world.region,
            cri_socket=workdir / "no-runtime.sock",
            state_dir=workdir / "state",
            socket_path=workdir / "ipamd.sock",
            metrics_port=free_port(),
        )
        base = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        env = daemon_environment(ends, base) | SETTINGS | extra
        env["AWS_VPC_K8S_CNI_BACKING_STORE"] = str(stack.enter_context(_tmpfs_dir()) / "ipam.json")
        env = {k: v for k, v in env.items() if v}
        with (workdir / "ipamd.log").open("ab") as log:
            process = await asyncio.create_subprocess_exec(
                str(BIN / "ipamd"),
                "run",
                env=env,
                cwd=str(workdir),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=log,
            )
        await _ready(ends.socket_path, process, workdir)
        yield ends.socket_path, process.pid
    finally:
        if process is not None and process.returncode is None:
            process.terminate()
            await process.wait()
        if imds is not None:
            await imds.close()
        host.close()


async def _ready(socket_path: Path, process: asyncio.subprocess.Process, workdir: Path) -> None:
    end = time.monotonic() + 60.0
    while time.monotonic() < end:
        if process.returncode is not None:
            log = (workdir / "ipamd.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"ipamd exited {process.returncode}:\n{log}")
        with contextlib.suppress(OSError):
            if (await _request(socket_path, "GET", PATH_READYZ))[0] == 200:
                return
        await asyncio.sleep(0.1)
    raise RuntimeError("ipamd did not become ready within 60 s")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="ipamd-bench-api-") as tmp:
        for name, value in asyncio.run(run(Path(tmp))).items():
            print(f"{name}: {value:.3f}", file=sys.stdout)
