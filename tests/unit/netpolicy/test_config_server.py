"""ipamd's `rpc.ConfigServerBackend` on a real unix socket, asked as the network-policy agent asks it:
the reply, the socket's mode, a stale socket replaced, a live one or a non-socket refused, the socket
gone on stop; and the reply's facts read from IMDS."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import grpc.aio
import pytest
from google.protobuf import empty_pb2  # type: ignore[import-untyped]

from cloud.errors import NotFound
from cloud.ports import ImdsIdentity, ImdsInterface
from ipamd.errors import SettingUnusable
from ipamd.netpolicy._generated import rpc_pb2, rpc_pb2_grpc
from ipamd.netpolicy.config_server import ConfigServer, read_agent_config
from ipamd.netpolicy.ports import AgentConfig

CONFIG = AgentConfig(
    network_policy_mode="strict",
    node_ipv4="10.0.0.10",
    instance_id="i-0123456789abcdef0",
    region="eu-west-1",
)


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A short directory: a unix socket path must fit in 107 bytes, pytest's tmp_path may not."""
    path = Path(tempfile.mkdtemp(prefix="ipamd-np-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def ask(path: Path) -> rpc_pb2.NetworkPolicyAgentConfigReply:
    async with grpc.aio.insecure_channel(f"unix:{path}") as channel:
        stub = rpc_pb2_grpc.ConfigServerBackendStub(channel)  # type: ignore[no-untyped-call]
        reply: rpc_pb2.NetworkPolicyAgentConfigReply = await stub.GetNetworkPolicyConfigs(
            empty_pb2.Empty(), timeout=5
        )
        return reply


async def test_the_agent_is_answered_the_node_s_facts_on_a_0660_socket(socket_dir: Path) -> None:
    path = socket_dir / "aws-node" / "ipamd.sock"  # the directory is made
    server = ConfigServer(str(path), CONFIG)
    await server.start()
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o660
        reply = await ask(path)
        assert (
            reply.NetworkPolicyMode,
            reply.MultiNICEnabled,
            reply.NodeIPv4,
            reply.NodeIPv6,
            reply.InstanceID,
            reply.Region,
        ) == ("strict", False, "10.0.0.10", "", "i-0123456789abcdef0", "eu-west-1")
    finally:
        await server.close()
    assert not path.exists()
    await server.close()  # idempotent


async def test_a_stale_socket_is_replaced(socket_dir: Path) -> None:
    path = socket_dir / "ipamd.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as left:
        left.bind(os.fspath(path))  # bound, never listening: what a killed run leaves
    server = ConfigServer(str(path), CONFIG)
    await server.start()
    try:
        assert (await ask(path)).InstanceID == CONFIG.instance_id
    finally:
        await server.close()


async def test_a_live_socket_or_a_file_is_refused_and_kept(socket_dir: Path) -> None:
    live = socket_dir / "live.sock"
    first = ConfigServer(str(live), CONFIG)
    await first.start()
    try:
        with pytest.raises(SettingUnusable, match="another process is serving on"):
            await ConfigServer(str(live), CONFIG).start()
        assert (await ask(live)).Region == "eu-west-1"
    finally:
        await first.close()
    plain = socket_dir / "plain"
    plain.write_text("not a socket")
    with pytest.raises(SettingUnusable, match="not a socket"):
        await ConfigServer(str(plain), CONFIG).start()
    assert plain.read_text() == "not a socket"


class Imds:
    """IMDS with two ENIs, listed out of device order."""

    async def identity(self) -> ImdsIdentity:
        return ImdsIdentity("i-0abc", "m5.large", "us-east-2", "us-east-2a", ("0a", "0b"))

    async def interfaces(self) -> tuple[ImdsInterface, ...]:
        return (
            ImdsInterface("0b", "eni-b", 1, "subnet-1", ("10.0.0.20", "10.0.0.21"), ()),
            ImdsInterface("0a", "eni-a", 0, "subnet-1", ("10.0.0.10", "10.0.0.11"), ()),
        )


@pytest.mark.parametrize(
    ("configured", "told"),
    [("", "standard"), ("none", "standard"), ("standard", "standard"), ("strict", "strict")],
)
async def test_the_reply_comes_from_imds_with_a_mode_the_agent_accepts(
    configured: str, told: str
) -> None:
    config = await read_agent_config(Imds(), configured, "10.9.9.9")
    assert config == AgentConfig(told, "10.0.0.10", "i-0abc", "us-east-2")


class LaggingImds(Imds):
    """IMDS whose interface listing fails (an ENI detached while it was read)."""

    async def interfaces(self) -> tuple[ImdsInterface, ...]:
        raise NotFound("ImdsGet", "404", "network/interfaces/macs/0b/")


async def test_an_unreadable_interface_listing_falls_back_to_the_known_address() -> None:
    config = await read_agent_config(LaggingImds(), "strict", "10.0.0.10")
    assert config == AgentConfig("strict", "10.0.0.10", "i-0abc", "us-east-2")
