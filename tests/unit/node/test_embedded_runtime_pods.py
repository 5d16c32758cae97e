"""The embedded node tells its runtime each ADD ipamd answered and each DEL sent (`RuntimePods`), one
container's in the order ipamd answered them, and a DEL ipamd could not do still ends the pod."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from datastore.records import AllocationKey, AllocationRecord
from ipamd.errors import StateUnavailable
from ipamd.model import PodRef
from ipamd.node.embedded import RuntimePods, runtime_record_path
from ipamd.runtime.embedded_cri import CriSandbox
from ipamd.runtime.embedded_runtime import EmbeddedCri

KEY = AllocationKey("k8s-pod-network", "pod-a", "eth0")


def listed(rt: EmbeddedCri) -> list[CriSandbox]:
    """What the runtime lists (it is loaded: a list, never UNAVAILABLE's None)."""
    found = rt.listing()
    assert found is not None
    return found


class Inner:
    """ADD and DEL whose answers the test releases (`add_may_answer`), or that fail."""

    def __init__(self) -> None:
        self.add_may_answer = asyncio.Event()
        self.add_may_answer.set()
        self.adding = asyncio.Event()
        self.release_fails = False

    async def add(self, key: AllocationKey, pod: PodRef | None) -> AllocationRecord:
        self.adding.set()
        await self.add_may_answer.wait()
        return AllocationRecord(key, ("10.0.1.5",), ("10.0.1.5/32",), "eni-1", 1_700_000_000.0)

    async def release(self, key: AllocationKey) -> tuple[AllocationRecord, ...]:
        if self.release_fails:
            raise StateUnavailable("state file is unusable")
        return ()


@pytest.fixture
def runtime() -> Iterator[EmbeddedCri]:
    where = Path(tempfile.mkdtemp(prefix="ipamd-rp-"))
    socket = where / "ipamd-cri.sock"
    made = EmbeddedCri(socket, runtime_record_path(socket), where / "gone")
    made.load()
    yield made
    shutil.rmtree(where, ignore_errors=True)


def test_the_record_is_beside_the_socket_named_after_it() -> None:
    assert runtime_record_path(Path("/r/.run/ipamd-cri.sock")) == Path(
        "/r/.run/ipamd-cri/sandboxes.json"
    )


async def test_an_answered_add_is_recorded_with_its_addresses_and_a_del_forgets_it(
    runtime: EmbeddedCri,
) -> None:
    pods = RuntimePods(Inner(), runtime)
    await pods.add(KEY, PodRef("shop", "web-0", "uid-a"))
    [sandbox] = listed(runtime)
    assert (sandbox.sandbox_id, sandbox.addresses, sandbox.name) == (
        "pod-a",
        ("10.0.1.5",),
        "web-0",
    )
    await pods.release(AllocationKey("other-network", "pod-a", "eth1"))
    assert listed(runtime) == [], "a DEL ends the container, whatever its network or ifname"


async def test_a_del_sent_during_the_add_is_heard_after_it(runtime: EmbeddedCri) -> None:
    inner = Inner()
    inner.add_may_answer.clear()
    pods = RuntimePods(inner, runtime)
    adding = asyncio.create_task(pods.add(KEY, None))
    await inner.adding.wait()
    deleting = asyncio.create_task(pods.release(KEY))
    inner.add_may_answer.set()
    await asyncio.gather(adding, deleting)
    assert listed(runtime) == [], "the DEL came last: no sandbox is left behind"
    assert pods._turns == {}


async def test_a_del_ipamd_could_not_do_still_ends_the_pod(runtime: EmbeddedCri) -> None:
    inner = Inner()
    pods = RuntimePods(inner, runtime)
    await pods.add(KEY, None)
    inner.release_fails = True
    with pytest.raises(StateUnavailable):
        await pods.release(KEY)
    assert listed(runtime) == []
