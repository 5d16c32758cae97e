"""The CRI double itself, spoken to over gRPC with the generated stub the way kubelet or crictl would:
filters, the sandbox lifecycle calls, `hide`, and the call counter."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import pytest

from ipamd.runtime._generated import cri_v1_pb2 as cri
from ipamd.runtime.cri import GrpcCriRuntime
from ipamd.runtime.ports import RuntimeUnavailable
from tests.support.cri_server import FakeCriServer, runtime_stub

CALL_TIMEOUT_S = 5.0
"""The deadline of these calls to the double: no test here is about deadlines (tests/unit/runtime/
test_cri.py's are), so a loaded machine must not fail a call a second to connect."""

ID_A = "a" * 64
ID_B = "b" * 64
ID_C = "c" * 64


@pytest.fixture
async def stub(fake_cri: FakeCriServer) -> AsyncIterator[Any]:
    async with grpc.aio.insecure_channel(fake_cri.endpoint) as channel:
        yield runtime_stub(channel)


async def listed_ids(stub: Any, wanted: cri.PodSandboxFilter | None = None) -> list[str]:
    request = cri.ListPodSandboxRequest(filter=wanted)
    response: cri.ListPodSandboxResponse = await stub.ListPodSandbox(
        request, timeout=CALL_TIMEOUT_S
    )
    return [item.id for item in response.items]


@pytest.fixture
def three(fake_cri: FakeCriServer) -> None:
    fake_cri.add(ID_A, labels={"app": "web", "tier": "front"})
    fake_cri.add(ID_B, labels={"app": "web", "tier": "back"}, state="notready")
    fake_cri.add(ID_C, labels={"app": "db"})


@pytest.mark.usefixtures("three")
@pytest.mark.parametrize(
    ("wanted", "expected"),
    [
        (None, [ID_A, ID_B, ID_C]),
        (cri.PodSandboxFilter(), [ID_A, ID_B, ID_C]),
        (cri.PodSandboxFilter(id=ID_B), [ID_B]),
        (cri.PodSandboxFilter(id="missing"), []),
        (
            cri.PodSandboxFilter(state=cri.PodSandboxStateValue(state=cri.SANDBOX_READY)),
            [ID_A, ID_C],
        ),
        (cri.PodSandboxFilter(state=cri.PodSandboxStateValue(state=cri.SANDBOX_NOTREADY)), [ID_B]),
        (cri.PodSandboxFilter(label_selector={"app": "web"}), [ID_A, ID_B]),
        (cri.PodSandboxFilter(label_selector={"app": "web", "tier": "back"}), [ID_B]),
        (
            cri.PodSandboxFilter(
                label_selector={"app": "web"},
                state=cri.PodSandboxStateValue(state=cri.SANDBOX_READY),
            ),
            [ID_A],
        ),
        (cri.PodSandboxFilter(id=ID_C, label_selector={"app": "web"}), []),
    ],
)
async def test_list_filters(
    stub: Any, wanted: cri.PodSandboxFilter | None, expected: list[str]
) -> None:
    assert await listed_ids(stub, wanted) == expected


async def test_sandbox_lifecycle_over_grpc(fake_cri: FakeCriServer, stub: Any) -> None:
    config = cri.PodSandboxConfig(
        metadata=cri.PodSandboxMetadata(name="web-0", uid="uid-1", namespace="shop", attempt=2),
        labels={"app": "web"},
        annotations={"note": "x"},
    )
    run: cri.RunPodSandboxResponse = await stub.RunPodSandbox(
        cri.RunPodSandboxRequest(config=config, runtime_handler="runc"), timeout=CALL_TIMEOUT_S
    )
    sandbox_id = run.pod_sandbox_id
    assert len(sandbox_id) == 64

    listed: cri.ListPodSandboxResponse = await stub.ListPodSandbox(
        cri.ListPodSandboxRequest(), timeout=CALL_TIMEOUT_S
    )
    [item] = listed.items
    assert (item.id, item.state, item.runtime_handler) == (sandbox_id, cri.SANDBOX_READY, "runc")
    assert item.metadata == config.metadata
    assert (dict(item.labels), dict(item.annotations)) == ({"app": "web"}, {"note": "x"})
    assert item.created_at > 0

    await stub.StopPodSandbox(
        cri.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=CALL_TIMEOUT_S
    )
    assert fake_cri.sandboxes[sandbox_id].state == cri.SANDBOX_NOTREADY

    for _ in range(2):  # idempotent
        await stub.RemovePodSandbox(
            cri.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=CALL_TIMEOUT_S
        )
    assert await listed_ids(stub) == []

    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.StopPodSandbox(
            cri.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=CALL_TIMEOUT_S
        )
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND
    assert fake_cri.calls == {
        "RunPodSandbox": 1,
        "ListPodSandbox": 2,
        "StopPodSandbox": 2,
        "RemovePodSandbox": 2,
    }


async def test_hide_leaves_a_sandbox_out_of_the_next_listings(
    fake_cri: FakeCriServer, runtime: GrpcCriRuntime
) -> None:
    fake_cri.add(ID_A)
    fake_cri.add(ID_B)
    fake_cri.hide(ID_B, listings=2)

    seen = [[s.sandbox_id for s in await runtime.list_sandboxes()] for _ in range(3)]
    assert seen == [[ID_A], [ID_A], [ID_A, ID_B]]


async def test_a_failed_listing_does_not_use_up_a_hidden_listing(
    fake_cri: FakeCriServer, runtime: GrpcCriRuntime
) -> None:
    fake_cri.add(ID_A)
    fake_cri.hide(ID_A, listings=1)
    fake_cri.unavailable = True
    with pytest.raises(RuntimeUnavailable, match="UNAVAILABLE"):
        await runtime.list_sandboxes()
    fake_cri.unavailable = False
    assert await runtime.list_sandboxes() == ()
    assert [s.sandbox_id for s in await runtime.list_sandboxes()] == [ID_A]


def test_add_refuses_a_duplicate_id(fake_cri: FakeCriServer) -> None:
    fake_cri.add(ID_A)
    with pytest.raises(ValueError, match="exists"):
        fake_cri.add(ID_A)


async def test_restarts_on_the_same_path_keeping_its_sandboxes(fake_cri: FakeCriServer) -> None:
    path = fake_cri.socket_path
    fake_cri.add(ID_A)
    await fake_cri.close()
    assert not path.exists()
    await fake_cri.start()
    assert fake_cri.socket_path == path
    assert path.is_socket()
    assert list(fake_cri.sandboxes) == [ID_A]


async def test_removes_its_temp_dir_on_exit() -> None:
    async with FakeCriServer() as fake_cri:
        directory = fake_cri.socket_path.parent
        assert directory.exists()
    assert not fake_cri.serving
    assert not directory.exists()
