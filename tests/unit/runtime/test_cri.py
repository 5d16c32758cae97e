"""`GrpcCriRuntime` against a real gRPC CRI server (`FakeCriServer`): sandboxes and version come back as
our own values, and every way the runtime can fail to answer is `RuntimeUnavailable`."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from ipamd.runtime.cri import GrpcCriRuntime, grpc_target
from ipamd.runtime.ports import RuntimeApi, RuntimeUnavailable, Sandbox
from tests.support.cri_server import FakeCriServer
from tests.unit.runtime.conftest import TIMEOUT_S

ID_A = "a" * 64
ID_B = "b" * 64
ID_C = "c" * 64


def test_is_a_runtime_api() -> None:
    runtime: RuntimeApi = GrpcCriRuntime("/run/containerd/containerd.sock")
    assert isinstance(runtime, GrpcCriRuntime)


async def test_lists_every_sandbox_with_its_fields(
    fake_cri: FakeCriServer, runtime: GrpcCriRuntime
) -> None:
    fake_cri.add(ID_A, "kube-system", "coredns-1", "uid-a", created_at=1_700_000_000.25)
    fake_cri.add(ID_B, "default", "web-0", "uid-b", created_at=1_700_000_100.5, state="notready")

    assert await runtime.list_sandboxes() == (
        Sandbox(ID_A, "ready", 1_700_000_000.25, "kube-system", "coredns-1", "uid-a"),
        Sandbox(ID_B, "notready", 1_700_000_100.5, "default", "web-0", "uid-b"),
    )


async def test_created_at_keeps_sub_second_precision(
    fake_cri: FakeCriServer, runtime: GrpcCriRuntime
) -> None:
    now = time.time()
    fake_cri.add(ID_A, created_at=now)
    [sandbox] = await runtime.list_sandboxes()
    assert sandbox.created_at == now


async def test_round_trip_add_stop_remove(fake_cri: FakeCriServer, runtime: GrpcCriRuntime) -> None:
    assert await runtime.list_sandboxes() == ()

    fake_cri.add(ID_A, "ns", "pod-a", "uid-a", created_at=10.0)
    fake_cri.add(ID_B, "ns", "pod-b", "uid-b", created_at=20.0)
    assert [(s.sandbox_id, s.state) for s in await runtime.list_sandboxes()] == [
        (ID_A, "ready"),
        (ID_B, "ready"),
    ]

    fake_cri.stop(ID_A)
    assert [(s.sandbox_id, s.state) for s in await runtime.list_sandboxes()] == [
        (ID_A, "notready"),
        (ID_B, "ready"),
    ]

    fake_cri.remove(ID_A)
    assert await runtime.list_sandboxes() == (Sandbox(ID_B, "ready", 20.0, "ns", "pod-b", "uid-b"),)


async def test_a_state_newer_than_ours_reads_as_notready(
    fake_cri: FakeCriServer, runtime: GrpcCriRuntime
) -> None:
    fake_cri.add(ID_A).state = 7
    [sandbox] = await runtime.list_sandboxes()
    assert (sandbox.sandbox_id, sandbox.state) == (ID_A, "notready")


async def test_version(runtime: GrpcCriRuntime) -> None:
    assert await runtime.version() == "fakecri 1.2.3"


async def test_a_socket_path_and_a_unix_url_reach_the_same_runtime(
    fake_cri: FakeCriServer,
) -> None:
    fake_cri.add(ID_A)
    for endpoint in (str(fake_cri.socket_path), fake_cri.endpoint):
        async with GrpcCriRuntime(endpoint, timeout_s=TIMEOUT_S) as runtime:
            assert [s.sandbox_id for s in await runtime.list_sandboxes()] == [ID_A]


@pytest.mark.parametrize(
    ("endpoint", "target"),
    [
        ("/run/containerd/containerd.sock", "unix:/run/containerd/containerd.sock"),
        ("unix:///run/containerd/containerd.sock", "unix:///run/containerd/containerd.sock"),
        ("run/cri.sock", "unix:run/cri.sock"),
    ],
)
def test_grpc_target(endpoint: str, target: str) -> None:
    assert grpc_target(endpoint) == target


@pytest.mark.parametrize("endpoint", ["", "unix://", "unix:", "tcp://127.0.0.1:10010", "http://x"])
def test_rejects_endpoints_that_are_not_unix_sockets(endpoint: str) -> None:
    with pytest.raises(ValueError, match="CRI endpoint"):
        GrpcCriRuntime(endpoint)


@pytest.mark.parametrize("timeout_s", [0.0, -1.0])
def test_rejects_a_deadline_that_is_not_positive(timeout_s: float) -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        GrpcCriRuntime("/run/containerd/containerd.sock", timeout_s=timeout_s)


async def test_unavailable_runtime_is_runtime_unavailable(
    fake_cri: FakeCriServer, runtime: GrpcCriRuntime
) -> None:
    fake_cri.add(ID_A)
    fake_cri.unavailable = True
    with pytest.raises(RuntimeUnavailable, match="UNAVAILABLE"):
        await runtime.list_sandboxes()
    with pytest.raises(RuntimeUnavailable, match="UNAVAILABLE"):
        await runtime.version()
    assert fake_cri.calls == {"ListPodSandbox": 1, "Version": 1}

    fake_cri.unavailable = False
    assert [s.sandbox_id for s in await runtime.list_sandboxes()] == [ID_A]


async def test_a_slow_runtime_hits_the_deadline(
    fake_cri: FakeCriServer, runtime: GrpcCriRuntime
) -> None:
    fake_cri.delay_s = 10 * TIMEOUT_S
    started = time.monotonic()
    with pytest.raises(RuntimeUnavailable, match="DEADLINE_EXCEEDED"):
        await runtime.list_sandboxes()
    assert time.monotonic() - started < 3 * TIMEOUT_S

    fake_cri.delay_s = 0.0
    assert await runtime.version() == "fakecri 1.2.3"


async def test_missing_socket_is_runtime_unavailable_at_once(tmp_path: Path) -> None:
    async with GrpcCriRuntime(str(tmp_path / "absent.sock"), timeout_s=5.0) as runtime:
        started = time.monotonic()
        with pytest.raises(RuntimeUnavailable, match="UNAVAILABLE"):
            await runtime.list_sandboxes()
        with pytest.raises(RuntimeUnavailable, match="UNAVAILABLE"):
            await runtime.version()
        assert time.monotonic() - started < 1.0, "a missing socket must not wait for the deadline"


async def test_reconnects_as_soon_as_the_runtime_is_back(
    fake_cri: FakeCriServer, runtime: GrpcCriRuntime
) -> None:
    fake_cri.add(ID_A)
    assert len(await runtime.list_sandboxes()) == 1

    await fake_cri.close()
    for _ in range(3):  # several failed dials: a reused channel would now sit in reconnect backoff
        with pytest.raises(RuntimeUnavailable):
            await runtime.list_sandboxes()

    await fake_cri.start()  # same socket path, sandboxes kept, like a containerd restart
    fake_cri.add(ID_B)
    assert [s.sandbox_id for s in await runtime.list_sandboxes()] == [ID_A, ID_B]


async def test_survives_a_restart_between_two_calls(
    fake_cri: FakeCriServer, runtime: GrpcCriRuntime
) -> None:
    assert await runtime.version() == "fakecri 1.2.3"
    await fake_cri.close()
    await fake_cri.start()
    try:
        assert await runtime.version() == "fakecri 1.2.3"
    except RuntimeUnavailable:
        # The old connection's loss may surface on this one call; the next one dials afresh.
        assert await runtime.version() == "fakecri 1.2.3"


async def test_concurrent_calls_fail_and_recover_together(
    fake_cri: FakeCriServer, runtime: GrpcCriRuntime
) -> None:
    fake_cri.add(ID_A)
    fake_cri.unavailable = True
    failures = await asyncio.gather(
        *(runtime.list_sandboxes() for _ in range(5)), return_exceptions=True
    )
    assert all(isinstance(failure, RuntimeUnavailable) for failure in failures)

    fake_cri.unavailable = False
    listings = await asyncio.gather(*(runtime.list_sandboxes() for _ in range(5)))
    assert all([s.sandbox_id for s in listing] == [ID_A] for listing in listings)


async def test_calls_after_close_are_runtime_unavailable(fake_cri: FakeCriServer) -> None:
    runtime = GrpcCriRuntime(fake_cri.endpoint, timeout_s=TIMEOUT_S)
    assert await runtime.version() == "fakecri 1.2.3"
    await runtime.close()
    await runtime.close()
    with pytest.raises(RuntimeUnavailable, match="closed"):
        await runtime.list_sandboxes()
    assert fake_cri.calls == {"Version": 1}


async def test_close_without_a_call_opens_nothing() -> None:
    runtime = GrpcCriRuntime("/nonexistent/cri.sock")
    await runtime.close()


async def test_leaves_no_threads_behind() -> None:
    before = set(threading.enumerate())
    async with FakeCriServer() as fake_cri:
        fake_cri.add(ID_C)
        async with GrpcCriRuntime(fake_cri.endpoint, timeout_s=TIMEOUT_S) as runtime:
            assert len(await runtime.list_sandboxes()) == 1
    assert set(threading.enumerate()) - before == set()
