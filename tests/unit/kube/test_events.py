"""Kubernetes Events ipamd posts about its node, as VPC CNI posts them: `MissingIAMPermissions` when
EC2 refuses a call for want of a permission (once per call and spacing, not on every backoff
round), validated by the test API server against events.k8s.io/v1's schema."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cloud.errors import Rejected, Throttled
from ipamd.config.eniconfig import EniConfig
from ipamd.config.groups import KubeSettings
from ipamd.kube.client import KubeApi
from ipamd.kube.credentials import from_kubeconfig
from ipamd.kube.kube_node import KubeNode
from ipamd.kube.node import NodeObjects
from tests.support.kube_api import KubeApiServer, kube_api

NODE = "ip-10-0-0-10.us-west-2.compute.internal"

__all__ = ["kube_api"]


class Pool:
    def __init__(self) -> None:
        self.listeners: list[Callable[[Any], None]] = []

    def on_failure(self, listener: Callable[[Any], None]) -> None:
        self.listeners.append(listener)

    def fail(self, err: Exception) -> None:
        for listener in self.listeners:
            listener(err)

    def expect_pods(self, pods_to_come: Callable[[], int]) -> None: ...

    def hold_while(self, reason: Callable[[], str]) -> None: ...

    @property
    def subnets(self) -> Pool:
        return self

    def follow_eni_config(self, config: EniConfig, problem: str = "") -> None: ...


async def test_a_missing_permission_is_an_event_on_the_node_once(kube_api: KubeApiServer) -> None:
    kube_api.add_node(NODE)
    api = KubeApi(from_kubeconfig(kube_api.kubeconfig))
    node = KubeNode(NodeObjects(api, NODE), KubeSettings(node_name=NODE))
    pool = Pool()
    try:
        node.report_missing_permissions(pool)
        refused = Rejected("CreateNetworkInterface", "UnauthorizedOperation", "not authorized")
        for _ in range(3):
            pool.fail(refused)  # a backing-off pool fails again and again
        pool.fail(Throttled("AssignPrivateIpAddresses", "RequestLimitExceeded"))
        await node.drain_events()
    finally:
        await api.close()

    (event,) = kube_api.events()
    assert (event["reason"], event["type"], event["action"]) == (
        "MissingIAMPermissions",
        "Warning",
        "CreateNetworkInterface",
    )
    assert event["regarding"]["kind"] == "Node" and event["regarding"]["name"] == NODE
    assert "ipamd-policy.json" in event["note"]
