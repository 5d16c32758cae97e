"""`ConfigServer`: VPC CNI's `rpc.ConfigServerBackend`, served by ipamd on a unix socket for
aws-network-policy-agent, which asks `GetNetworkPolicyConfigs` once at its start and exits if nobody
answers.

It owns the gRPC server, its socket (mode 0660, as VPC CNI makes it: the agent runs as root in the
same pod; nobody else on the node needs it) and the reply, which is fixed for the process's life
(`AgentConfig`, read by `read_agent_config` from the configuration and IMDS). A socket left by a
killed run is removed at start; one another process answers on is not (two daemons on one node is an
operator's mistake to be told, not papered over); the socket is removed on stop. No grpc or protobuf
type leaves this module, and it changes nothing of the daemon's state.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path

import grpc
import grpc.aio

from cloud.errors import CloudError
from cloud.ports import Imds
from ipamd.errors import SettingUnusable, os_reason
from ipamd.netpolicy._generated import rpc_pb2 as rpc
from ipamd.netpolicy._generated import rpc_pb2_grpc as rpc_grpc
from ipamd.netpolicy.enforcement import agent_mode
from ipamd.netpolicy.ports import AgentConfig
from ipamd.unix_socket import SocketPathError, clear_stale

logger = logging.getLogger(__name__)

SOCKET_MODE = 0o660
SETTING = "IPAMD_CONFIG_SERVER_SOCKET"

_add_servicer: Callable[[object, grpc.aio.Server], None] = (
    rpc_grpc.add_ConfigServerBackendServicer_to_server
)


async def read_agent_config(imds: Imds, configured_mode: str, known_ipv4: str = "") -> AgentConfig:
    """The reply, from IMDS: the instance, its region, and the primary ENI's (device 0) primary
    private address. The interfaces' listing can fail where the identity did not (an ENI detached
    while it is read): the address is then `known_ipv4`, EC2's word on the same fact, rather than a
    failed start. Raises `CloudError` when the identity cannot be read."""
    identity = await imds.identity()
    try:
        primary = [eni for eni in await imds.interfaces() if eni.device_number == 0]
    except CloudError as err:
        logger.warning("netpolicy.interfaces_unread error=%s node_ipv4=%s", err, known_ipv4)
        primary = []
    node_ipv4 = primary[0].local_ipv4s[0] if primary and primary[0].local_ipv4s else known_ipv4
    return AgentConfig(
        network_policy_mode=agent_mode(configured_mode),
        node_ipv4=node_ipv4,
        instance_id=identity.instance_id,
        region=identity.region,
    )


class ConfigServer:
    """Serves `config` on `socket_path`: `await start()` (before the daemon is ready: the agent
    must find it whenever it starts), `await serve()` as a named task, `await close()`."""

    def __init__(self, socket_path: str, config: AgentConfig) -> None:
        self.socket_path = Path(socket_path)
        self.config = config
        self._server: grpc.aio.Server | None = None
        self._stopped = asyncio.Event()

    async def start(self) -> None:
        """Listen on the socket. Raises `SettingUnusable` (the one line `ipamd.main` prints)."""
        path = self.socket_path
        try:
            clear_stale(path)
            path.parent.mkdir(parents=True, exist_ok=True)
        except SocketPathError as err:
            raise SettingUnusable(f"{err} ({SETTING}): stop it first") from err
        except OSError as err:
            raise SettingUnusable(f"cannot serve on {path} ({SETTING}): {os_reason(err)}") from err
        server = grpc.aio.server()
        _add_servicer(_Servicer(self.config), server)
        try:
            bound = server.add_insecure_port(f"unix:{path}")
        except RuntimeError as err:  # grpc's way of saying the bind failed
            raise SettingUnusable(f"cannot serve on {path} ({SETTING}): {err}") from err
        if bound == 0:
            raise SettingUnusable(f"cannot serve on {path} ({SETTING})")
        await server.start()
        self._server = server
        try:
            os.chmod(path, SOCKET_MODE)
        except OSError as err:
            await self.close()
            raise SettingUnusable(f"cannot set the mode of {path} ({SETTING}): {err}") from err
        c = self.config
        logger.info(
            "netpolicy.config_serving path=%s mode=%s node_ipv4=%s",
            path,
            c.network_policy_mode,
            c.node_ipv4,
        )

    async def serve(self) -> None:
        """The daemon's named task: waits while the server runs (it serves on its own once started)
        and ends when `close()` stops it. Not gRPC's `wait_for_termination`: cancelling that (as the
        task group does on stop) cancels the server's own shutdown, and `close()` then fails."""
        await self._stopped.wait()

    async def close(self) -> None:
        """Stop serving and remove the socket. Idempotent."""
        self._stopped.set()
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace=None)
            self.socket_path.unlink(missing_ok=True)


class _Servicer(rpc_grpc.ConfigServerBackendServicer):
    """The gRPC face of the reply; the method name is VPC CNI's."""

    def __init__(self, config: AgentConfig) -> None:
        self._config = config

    async def GetNetworkPolicyConfigs(  # noqa: N802
        self, request: object, context: grpc.aio.ServicerContext
    ) -> rpc.NetworkPolicyAgentConfigReply:
        c = self._config
        logger.info(
            "netpolicy.config_asked mode=%s node_ipv4=%s instance_id=%s region=%s",
            c.network_policy_mode,
            c.node_ipv4,
            c.instance_id,
            c.region,
        )
        return rpc.NetworkPolicyAgentConfigReply(
            NetworkPolicyMode=c.network_policy_mode,
            MultiNICEnabled=c.multi_nic_enabled,
            NodeIPv4=c.node_ipv4,
            NodeIPv6=c.node_ipv6,
            InstanceID=c.instance_id,
            Region=c.region,
        )
