"""The introspection endpoint over an engine on a real state file: VPC CNI's paths and JSON shapes,
each answer one moment of the engine, the settings split as VPC CNI lists them, and a port in use
reported as `ListenFailed`."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from ipamd.config.kinds import HostPort
from ipamd.config.settings import Config
from ipamd.engine.engine import Engine
from ipamd.model import PodRef
from ipamd.telemetry.endpoint import ListenFailed
from ipamd.telemetry.introspection import (
    NETWORKUTILS_SETTINGS,
    PATHS,
    create_introspection_app,
    serve_introspection,
)
from tests.support.node import NodeFixture, key

SETTINGS = Config.from_env({}).describe()
MAX_PODS = {
    "max_pods": 737,
    "max_pods_rule": "kubelet",
    "max_pods_reason": "the kubelet's maxPods=737 (...)",
    "kubelet_config": "maxPods=737 in /etc/kubernetes/kubelet/config.json",
}


@pytest.fixture
async def served(node: NodeFixture) -> AsyncIterator[tuple[Engine, aiohttp.ClientSession, str]]:
    engine = await node.open()
    server = TestServer(create_introspection_app(engine, SETTINGS, MAX_PODS))
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            yield engine, session, str(server.make_url(""))
    finally:
        await server.close()


async def get(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as answer:
        assert answer.status == 200, await answer.text()
        return await answer.json()


async def test_root_lists_the_paths(served: tuple[Engine, aiohttp.ClientSession, str]) -> None:
    _, session, url = served
    assert await get(session, f"{url}/") == {"AvailableCommands": list(PATHS)}


async def test_enis_is_vpc_cni_eni_infos(
    served: tuple[Engine, aiohttp.ClientSession, str], node: NodeFixture
) -> None:
    engine, session, url = served
    await node.seed(enis=2, per_eni=2)
    record = await engine.assign(key("c1"), PodRef("default", "web-1", "uid-1"))
    await engine.assign(key("c2"))
    await engine.release(key("c2"))
    body = await get(session, f"{url}/v1/enis")
    assert (body["TotalIPs"], body["AssignedIPs"]) == (4, 1)
    assert set(body["ENIs"]) == {"eni-0000", "eni-0001"}
    primary = body["ENIs"]["eni-0000"]
    assert (primary["ID"], primary["IsPrimary"], primary["DeviceNumber"]) == ("eni-0000", True, 0)
    assert body["ENIs"]["eni-0001"]["DeviceNumber"] == 1
    assert primary["IsTrunk"] is False and primary["IPv6Cidrs"] == {}
    cidrs = {
        c: info for eni in body["ENIs"].values() for c, info in eni["AvailableIPv4Cidrs"].items()
    }
    assert len(cidrs) == 4
    address = record.addresses[0]
    info = cidrs[record.unit_cidrs[0]]
    assert info["Cidr"] == {"IP": address, "Mask": "/////w=="}
    assert (info["IsPrefix"], info["AddressFamily"]) == (False, "4")
    owned = info["IPAddresses"][address]
    assert owned["Address"] == address
    assert owned["IPAMKey"] == {
        "networkName": "k8s-pod-network",
        "containerID": "c1",
        "ifName": "eth0",
    }
    assert owned["IPAMMetadata"] == {"k8sPodNamespace": "default", "k8sPodName": "web-1"}
    assert owned["AssignedTime"] == "2023-11-14T22:13:20Z"
    assert owned["UnassignedTime"] == "0001-01-01T00:00:00Z"
    addresses = [a for c in cidrs.values() for a in c["IPAddresses"].values()]
    cooled = [a for a in addresses if a["UnassignedTime"] != "0001-01-01T00:00:00Z"]
    assert len(cooled) == 1 and cooled[0]["IPAMKey"]["containerID"] == ""


async def test_a_prefix_lists_its_sixteen_addresses(
    served: tuple[Engine, aiohttp.ClientSession, str], node: NodeFixture
) -> None:
    _, session, url = served
    [[prefix]] = await node.seed(enis=1, per_eni=1, kind="prefix")
    body = await get(session, f"{url}/v1/enis")
    info = body["ENIs"]["eni-0000"]["AvailableIPv4Cidrs"][prefix]
    assert info["IsPrefix"] is True and info["Cidr"]["Mask"] == "////8A=="
    assert len(info["IPAddresses"]) == 16 and body["TotalIPs"] == 16


async def test_pods_are_keyed_as_vpc_cni_keyed_them(
    served: tuple[Engine, aiohttp.ClientSession, str], node: NodeFixture
) -> None:
    engine, session, url = served
    await node.seed(enis=2, per_eni=3)
    web = await engine.assign(key("c1"), PodRef("default", "web-1"))
    await engine.assign(key("c2", "eth0"), PodRef("kube-system", "multi"))
    await engine.assign(key("c2", "net1"), PodRef("kube-system", "multi"))
    body = await get(session, f"{url}/v1/pods")
    assert body["web-1_default_c1"] == {
        "IPAMKey": {"networkName": "k8s-pod-network", "containerID": "c1", "ifName": "eth0"},
        "IP": web.addresses[0],
        "DeviceNumber": 0 if web.eni_id == "eni-0000" else 1,
    }
    assert set(body) == {
        "web-1_default_c1",
        "multi_kube-system_c2_eth0_k8s-pod-network",
        "multi_kube-system_c2_net1_k8s-pod-network",
    }


async def test_settings_are_split_as_vpc_cni_lists_them(
    served: tuple[Engine, aiohttp.ClientSession, str],
) -> None:
    _, session, url = served
    ipamd = await get(session, f"{url}/v1/ipamd-env-settings")
    network = await get(session, f"{url}/v1/networkutils-env-settings")
    assert set(SETTINGS) >= NETWORKUTILS_SETTINGS, "every name is a setting"
    assert set(network) == NETWORKUTILS_SETTINGS
    assert {**ipamd, **network} == SETTINGS and not set(ipamd) & set(network)
    assert ipamd["WARM_ENI_TARGET"] == "1" and network["AWS_VPC_ENI_MTU"] == "9001"
    assert ipamd["INTROSPECTION_BIND_ADDRESS"] == "127.0.0.1:61679"


async def test_max_pods_says_which_rule_set_it(
    served: tuple[Engine, aiohttp.ClientSession, str],
) -> None:
    _, session, url = served
    assert await get(session, f"{url}/v1/max-pods") == MAX_PODS


async def test_a_port_in_use_is_listen_failed(node: NodeFixture) -> None:
    engine = await node.open()
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(ListenFailed) as failed:
            await serve_introspection(engine, SETTINGS, HostPort("127.0.0.1", port))
    assert str(failed.value) == (
        f"cannot listen on 127.0.0.1:{port} (INTROSPECTION_BIND_ADDRESS): Address already in use"
    )
