"""The network-policy agent's part in ADD and DEL, over the real API socket and the real gRPC client,
against a fake agent that is a real NPBackend server on a unix socket: the ADD answer's mode, the
policy call's request, the retraction when the agent refuses or is gone, DeletePodNp before the
release, and when the mode calls the agent at all."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from ipamd.api import create_app, serve_unix
from ipamd.model import PodRef
from ipamd.netpolicy.agent import GrpcPolicyAgent
from ipamd.netpolicy.enforcement import NetworkPolicy
from ipamd.netpolicy.ports import AgentUnavailable, NetworkPolicyRefused
from tests.support.node import NodeFixture, key
from tests.support.policy_agent import (
    AgentScript,
    DeleteCall,
    EnforceCall,
    FakePolicyAgent,
)
from tests.unit.api.conftest import GC_GRACE_S, NETWORK, Api, ReadyFlag

POD = {"namespace": "default", "name": "web-0", "uid": "0b1c2d3e"}


@contextlib.asynccontextmanager
async def served(node: NodeFixture, socket_dir: Path, mode: str) -> AsyncIterator[Api]:
    """The API with network policy under `mode`, its agent client dialling `npa_path(socket_dir)`."""
    engine = await node.open()
    await node.seed(enis=1, per_eni=4)
    agent = GrpcPolicyAgent(str(npa_path(socket_dir)), timeout_s=2.0)
    policy = NetworkPolicy(engine, agent, mode)
    ready = ReadyFlag(True)
    app = create_app(
        engine, ready=ready, gc_grace_s=GC_GRACE_S, clock=node.clock, network_policy=policy
    )
    socket_path = socket_dir / "run" / "ipamd.sock"
    runner = await serve_unix(app, socket_path)
    try:
        connector = aiohttp.UnixConnector(path=str(socket_path))
        async with aiohttp.ClientSession(connector=connector) as session:
            yield Api(session, socket_path, engine, node, ready, runner)
    finally:
        await runner.cleanup()
        await agent.close()


def npa_path(socket_dir: Path) -> Path:
    return socket_dir / "aws-node" / "npa.sock"


async def call_policy(
    api: Api, container_id: str, interfaces: int = 1
) -> tuple[int, dict[str, object]]:
    answer = await api.call(
        "POST",
        f"/v1/allocations/{container_id}/eth0/policy?network={NETWORK}",
        json={"interfaces": interfaces},
    )
    return answer.status, answer.body


@pytest.mark.parametrize(
    ("mode", "told"), [("standard", "standard"), ("strict", "strict"), ("", "standard")]
)
async def test_add_then_the_policy_call_reaches_the_agent_with_the_pod(
    node: NodeFixture, socket_dir: Path, mode: str, told: str
) -> None:
    async with (
        FakePolicyAgent(npa_path(socket_dir)) as agent,
        served(node, socket_dir, mode) as api,
    ):
        added = await api.add("c1", pod=POD)
        assert added.status == 200 and added.body["network_policy"] == told
        assert agent.script.enforced == []  # the plugin asks once the interface exists
        assert await call_policy(api, "c1", interfaces=2) == (200, {})
        assert agent.script.enforced == [EnforceCall("web-0", "default", told, 2)]
        assert api.engine.state.allocation(key("c1", network=NETWORK)) is not None
        api.node.check()


@pytest.mark.parametrize("agent_state", ["refuse", "error", "absent"])
async def test_an_agent_that_refuses_or_is_unreachable_fails_the_call_and_leaves_nothing(
    node: NodeFixture, socket_dir: Path, agent_state: str
) -> None:
    script = AgentScript(enforce_answer="refuse" if agent_state == "refuse" else "error")
    async with contextlib.AsyncExitStack() as stack:
        if agent_state != "absent":
            await stack.enter_async_context(FakePolicyAgent(npa_path(socket_dir), script))
        api = await stack.enter_async_context(served(node, socket_dir, "strict"))
        added = await api.add("c1", pod=POD)
        address = added.body["ips"][0]["address"][:-3]
        status, body = await call_policy(api, "c1")
        assert status == 502
        assert body["code"] == "network_policy_refused" and body["retryable"] is False
        assert "default/web-0" in str(body["message"])
        state = api.engine.state
        assert state.allocations() == {}
        assert state.intents() == {}  # no pod used it: the runtime's next ADD starts afresh
        assert address not in state.cooldowns()
        api.node.check()
        if agent_state != "absent":
            assert script.enforced == [EnforceCall("web-0", "default", "strict", 1)]
        again = await api.add("c1", pod=POD)
        assert again.status == 200  # no delete intent refuses it


async def test_del_tells_the_agent_before_releasing(node: NodeFixture, socket_dir: Path) -> None:
    seen: list[bool] = []
    script = AgentScript()
    async with (
        FakePolicyAgent(npa_path(socket_dir), script),
        served(node, socket_dir, "standard") as api,
    ):
        await api.add("c1", pod=POD)
        # What DeletePodNp sees: the allocation still held (nothing released before the agent knew).
        script.on_delete = lambda call: seen.append(
            api.engine.state.allocation(key("c1", network=NETWORK)) is not None
        )
        deleted = await api.delete("c1")
        assert deleted.status == 200 and len(deleted.body["released"]) == 1
        assert script.deleted == [DeleteCall("web-0", "default")]
        assert seen == [True]
        assert api.engine.state.allocations() == {}


async def test_an_agent_that_errors_on_delete_gives_503_and_keeps_the_allocation(
    node: NodeFixture, socket_dir: Path
) -> None:
    script = AgentScript(delete_answer="error")
    async with (
        FakePolicyAgent(npa_path(socket_dir), script),
        served(node, socket_dir, "standard") as api,
    ):
        await api.add("c1", pod=POD)
        failed = await api.delete("c1")
        assert failed.status == 503
        assert failed.body["code"] == "network_policy_unavailable"
        assert failed.body["retryable"] is True
        assert api.engine.state.allocation(key("c1", network=NETWORK)) is not None
        assert api.engine.state.intents() == {}
        script.delete_answer = "ok"  # the kubelet's retry, once the agent answers
        retried = await api.delete("c1")
        assert retried.status == 200 and len(retried.body["released"]) == 1
        assert len(script.deleted) == 2
        api.node.check()


async def test_mode_none_never_calls_the_agent(node: NodeFixture, socket_dir: Path) -> None:
    script = AgentScript(enforce_answer="refuse", delete_answer="error")
    async with (
        FakePolicyAgent(npa_path(socket_dir), script),
        served(node, socket_dir, "none") as api,
    ):
        added = await api.add("c1", pod=POD)
        assert added.status == 200 and "network_policy" not in added.body
        assert await call_policy(api, "c1") == (200, {})
        assert (await api.delete("c1")).status == 200
        assert script.enforced == [] and script.deleted == []
        assert api.engine.state.allocations() == {}


async def test_mode_unset_calls_the_agent_only_while_its_socket_exists(
    node: NodeFixture, socket_dir: Path
) -> None:
    async with served(node, socket_dir, "") as api:
        absent = await api.add("c1", pod=POD)
        assert absent.status == 200 and "network_policy" not in absent.body
        assert await call_policy(api, "c1") == (200, {})
        assert (await api.delete("c1")).status == 200
        assert api.engine.state.allocations() == {}
        async with FakePolicyAgent(npa_path(socket_dir)) as agent:
            present = await api.add("c2", pod=POD)
            assert present.body["network_policy"] == "standard"
            assert await call_policy(api, "c2") == (200, {})
            assert (await api.delete("c2")).status == 200
            assert agent.script.enforced == [EnforceCall("web-0", "default", "standard", 1)]
            assert agent.script.deleted == [DeleteCall("web-0", "default")]


async def test_an_unnamed_pod_is_not_enforced_and_an_unknown_attachment_is_404(
    node: NodeFixture, socket_dir: Path
) -> None:
    async with (
        FakePolicyAgent(npa_path(socket_dir)) as agent,
        served(node, socket_dir, "strict") as api,
    ):
        added = await api.add("c1")  # no CNI_ARGS: nothing the agent could find the pod by
        assert added.status == 200 and "network_policy" not in added.body
        assert await call_policy(api, "c1") == (200, {})
        status, body = await call_policy(api, "c9")
        assert status == 404 and body["code"] == "allocation_not_found"
        bad = await api.call(
            "POST", f"/v1/allocations/c1/eth0/policy?network={NETWORK}", json={"interfaces": 0}
        )
        assert bad.status == 400 and bad.body["code"] == "bad_request"
        assert (await api.delete("c1")).status == 200
        assert agent.script.enforced == [] and agent.script.deleted == []


class BlockedAgent:
    """A `PolicyAgent` whose EnforceNpToPod is held until the test lets it fail."""

    def __init__(self) -> None:
        self.called = asyncio.Event()
        self.fail = asyncio.Event()

    def present(self) -> bool:
        return True

    async def enforce(self, pod: PodRef, mode: str, interfaces: int) -> None:
        self.called.set()
        await self.fail.wait()
        raise AgentUnavailable("the agent went away")

    async def delete(self, pod: PodRef) -> None:
        return None


async def test_a_refusal_after_a_concurrent_del_keeps_the_del_and_its_intent(
    node: NodeFixture,
) -> None:
    engine = await node.open()
    await node.seed(enis=1, per_eni=4)
    agent = BlockedAgent()
    policy = NetworkPolicy(engine, agent, "strict")
    k = key("c1")
    record = await engine.assign(k, PodRef("default", "web-0"))
    enforcing = asyncio.create_task(policy.enforce(record, 1))
    await agent.called.wait()
    await policy.forget(k)
    released = await engine.release(k)
    assert released == (record,)
    agent.fail.set()
    with pytest.raises(NetworkPolicyRefused):
        await enforcing
    assert engine.state.allocations() == {}
    assert "c1" in engine.state.intents()  # the DEL's intent stands: retract undid nothing
    assert policy.calls == {("enforce", "unavailable"): 1, ("delete", "ok"): 1}
    node.check()
