"""`ipamd run --embedded` as a real process with the network-policy agent beside it (the fake one: a
real NPBackend gRPC server on its own thread): the agent's GetNetworkPolicyConfigs answered over the
daemon's real config socket with the node's facts, and a pod's ADD, policy call and DEL reaching the
agent through the daemon's composition root; a refusal leaves no allocation."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import empty_pb2  # type: ignore[import-untyped]

from ipamd.netpolicy._generated import rpc_pb2, rpc_pb2_grpc
from tests.support.embedded_daemon import NETWORK, EmbeddedDaemon, start_daemon
from tests.support.policy_agent import DeleteCall, EnforceCall, ThreadedPolicyAgent

POD = {"namespace": "shop", "name": "cart-7d9f", "uid": "u-1"}


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """The daemon's directory, short enough for the unix sockets under it (107 bytes at most)."""
    path = Path(tempfile.mkdtemp(prefix="ipamd-np-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def ask_config(path: Path) -> rpc_pb2.NetworkPolicyAgentConfigReply:
    with grpc.insecure_channel(f"unix:{path}") as channel:
        stub = rpc_pb2_grpc.ConfigServerBackendStub(channel)  # type: ignore[no-untyped-call]
        reply: rpc_pb2.NetworkPolicyAgentConfigReply = stub.GetNetworkPolicyConfigs(
            empty_pb2.Empty(), timeout=10
        )
        return reply


def add_pod(daemon: EmbeddedDaemon, container_id: str, deadline_s: float = 30.0) -> dict[str, Any]:
    """ADD with the pod's names, retried while the warm pool fills (as the runtime retries)."""
    body = {"container_id": container_id, "ifname": "eth0", "network": NETWORK, "pod": POD}
    end = time.monotonic() + deadline_s
    while True:
        status, answer = daemon.call("POST", "/v1/allocations", body)
        if status == 200:
            return answer
        assert status == 503 and answer.get("code") == "no_address", (status, answer)
        assert time.monotonic() < end, "the pool did not fill in time"
        time.sleep(0.05)


def test_the_daemon_serves_the_agent_and_tells_it_of_each_pod(short_dir: Path) -> None:
    config_socket = short_dir / ".run" / "aws-node" / "ipamd.sock"  # the embedded default
    with ThreadedPolicyAgent(short_dir / "np" / "npa.sock") as agent:
        daemon = start_daemon(
            short_dir,
            NETWORK_POLICY_ENFORCING_MODE="strict",
            IPAMD_NETWORK_POLICY_AGENT_SOCKET=str(agent.socket_path),
        )
        try:
            daemon.wait_for("/readyz")
            instance_id = daemon.wait_for_line(r"instance (i-[0-9a-f]+) ").group(1)
            reply = ask_config(config_socket)
            added = add_pod(daemon, "pod-a")
            assert (reply.NetworkPolicyMode, reply.MultiNICEnabled, reply.NodeIPv6) == (
                "strict",
                False,
                "",
            )
            assert (reply.InstanceID, reply.Region) == (instance_id, "us-west-2")
            # The node's primary address: what ADD answers as the pod's gateway on the embedded node.
            assert reply.NodeIPv4 == added["ips"][0]["gateway"]
            assert added["network_policy"] == "strict"

            policy = f"/v1/allocations/pod-a/eth0/policy?network={NETWORK}"
            assert daemon.call("POST", policy, {"interfaces": 1}) == (200, {})
            assert agent.script.enforced == [EnforceCall("cart-7d9f", "shop", "strict", 1)]
            status, _ = daemon.call("DELETE", f"/v1/allocations/pod-a/eth0?network={NETWORK}")
            assert status == 200
            assert agent.script.deleted == [DeleteCall("cart-7d9f", "shop")]

            agent.script.enforce_answer = "refuse"
            add_pod(daemon, "pod-b")
            refused = daemon.call("POST", policy.replace("pod-a", "pod-b"), {"interfaces": 1})
            assert refused[0] == 502 and refused[1]["code"] == "network_policy_refused"
            held = daemon.call("GET", f"/v1/allocations/pod-b/eth0?network={NETWORK}")
            assert held[0] == 404
        finally:
            code = daemon.stop()
        assert code == 0, daemon.lines[-20:]
    assert not config_socket.exists()
