"""The agent's gRPC client against the fake agent on a real unix socket: its requests, `Success=false`
and gRPC failures as typed errors, the deadline, and a fresh dial once an agent is back."""

from __future__ import annotations

import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ipamd.model import PodRef
from ipamd.netpolicy.agent import GrpcPolicyAgent
from ipamd.netpolicy.ports import AgentRefused, AgentUnavailable
from tests.support.policy_agent import (
    AgentScript,
    DeleteCall,
    EnforceCall,
    FakePolicyAgent,
    ThreadedPolicyAgent,
)

POD = PodRef("shop", "cart-1", "u-1")


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="ipamd-npa-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_requests_carry_the_pod_and_refusals_are_typed(socket_dir: Path) -> None:
    path = socket_dir / "npa.sock"
    client = GrpcPolicyAgent(str(path), timeout_s=2.0)
    try:
        assert not client.present()
        async with FakePolicyAgent(path) as agent:
            assert client.present()
            await client.enforce(POD, "strict", 3)
            await client.delete(POD)
            assert agent.script.enforced == [EnforceCall("cart-1", "shop", "strict", 3)]
            assert agent.script.deleted == [DeleteCall("cart-1", "shop")]
            agent.script.enforce_answer = "refuse"
            agent.script.delete_answer = "refuse"
            with pytest.raises(AgentRefused, match="Success=false"):
                await client.enforce(POD, "standard", 1)
            with pytest.raises(AgentRefused, match="Success=false"):
                await client.delete(POD)
            agent.script.enforce_answer = "error"
            with pytest.raises(AgentUnavailable, match="UNAVAILABLE"):
                await client.enforce(POD, "standard", 1)
    finally:
        await client.close()


async def test_a_missing_agent_fails_at_once_and_one_started_later_is_dialled(
    socket_dir: Path,
) -> None:
    path = socket_dir / "npa.sock"
    client = GrpcPolicyAgent(str(path), timeout_s=5.0)
    try:
        began = time.monotonic()
        with pytest.raises(AgentUnavailable):
            await client.enforce(POD, "standard", 1)
        assert time.monotonic() - began < 2.0, "no wait for a socket that is not there"
        async with FakePolicyAgent(path) as agent:
            await client.enforce(POD, "standard", 1)  # no reconnect backoff in the way
            assert len(agent.script.enforced) == 1
    finally:
        await client.close()


async def test_an_agent_that_does_not_answer_is_given_up_on_at_the_deadline(
    socket_dir: Path,
) -> None:
    released = threading.Event()

    def hang(call: EnforceCall) -> bool:
        released.wait(10)  # holds the agent's own loop, on its own thread
        return True

    script = AgentScript(on_enforce=hang)
    client = GrpcPolicyAgent(str(socket_dir / "npa.sock"), timeout_s=0.3)
    with ThreadedPolicyAgent(socket_dir / "npa.sock", script):
        try:
            began = time.monotonic()
            with pytest.raises(AgentUnavailable, match="DEADLINE_EXCEEDED"):
                await client.enforce(POD, "standard", 1)
            assert time.monotonic() - began < 3.0
        finally:
            released.set()
            await client.close()


def test_a_socket_nobody_listens_on_is_no_agent(socket_dir: Path) -> None:
    """aws-node's agent removes a stale socket when it starts, not when it stops: after a takeover
    its npa.sock stays, and with the mode unset ipamd must not call it on every ADD."""
    path = socket_dir / "npa.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # the file stays; connecting to it is ECONNREFUSED
    client = GrpcPolicyAgent(str(path), timeout_s=2.0)
    assert path.is_socket() and not client.present()
    path.unlink()
    path.write_text("not a socket")
    assert not client.present()
    path.unlink()
    path.mkdir()
    assert not client.present()
    path.rmdir()
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listening.bind(str(path))
        listening.listen(1)
        assert client.present()
    finally:
        listening.close()
