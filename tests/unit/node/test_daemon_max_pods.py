"""The daemon's max pods comes from the kubelet's config when it has maxPods, else from the instance
type's limits as EKS computes it (vCPU cap and Nitro included), and `GET /v1/pool` names the rule
that set it and what the kubelet's config said."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloud.fakes import FakeEc2
from cloud.models import InstanceLimits
from ipamd.clock import FakeClock
from ipamd.config.settings import Config
from ipamd.node.report import pool_report
from tests.support.daemons import fake_daemon


class Ec2WithCpus(FakeEc2):
    """The in-memory EC2, answering DescribeInstanceTypes with vCPUs and a hypervisor."""

    def __init__(self, clock: FakeClock, vcpus: int, hypervisor: str) -> None:
        super().__init__(clock, max_enis=3, ipv4_per_eni=10)
        self.vcpus = vcpus
        self.hypervisor = hypervisor

    async def instance_limits(self, instance_type: str) -> InstanceLimits:
        return InstanceLimits(instance_type, 3, 10, self.hypervisor, self.vcpus)


@pytest.mark.parametrize(
    ("env", "vcpus", "hypervisor", "max_pods", "rule"),
    [
        ({}, 2, "nitro", 29, "secondary-ip-formula"),
        ({"ENABLE_PREFIX_DELEGATION": "true"}, 2, "nitro", 110, "cap-110-vcpus-30-or-fewer"),
        ({"ENABLE_PREFIX_DELEGATION": "true"}, 32, "nitro", 250, "cap-250-vcpus-over-30"),
        ({"ENABLE_PREFIX_DELEGATION": "true"}, 2, "xen", 29, "secondary-ip-formula"),
        (
            {"ENABLE_PREFIX_DELEGATION": "true", "IPAMD_MAX_PODS": "300"},
            2,
            "nitro",
            300,
            "override",
        ),
        (
            {"ENABLE_PREFIX_DELEGATION": "true", "IPAMD_KUBELET_CONFIG": "{kubelet}"},
            32,
            "nitro",
            737,
            "kubelet",
        ),
        ({"IPAMD_KUBELET_CONFIG": "{kubelet}"}, 2, "nitro", 737, "kubelet"),
        (
            {"IPAMD_KUBELET_CONFIG": "{kubelet}", "IPAMD_MAX_PODS": "300"},
            2,
            "nitro",
            300,
            "override",
        ),
        ({"IPAMD_KUBELET_CONFIG": "{missing}"}, 2, "nitro", 29, "secondary-ip-formula"),
    ],
)
async def test_max_pods_and_its_rule(
    tmp_path: Path, env: dict[str, str], vcpus: int, hypervisor: str, max_pods: int, rule: str
) -> None:
    clock = FakeClock()
    kubelet = tmp_path / "kubelet.json"
    kubelet.write_text('{"kind": "KubeletConfiguration", "maxPods": 737}', encoding="utf-8")
    paths = {"{kubelet}": str(kubelet), "{missing}": str(tmp_path / "none.json")}
    env = {k: paths.get(v, v) for k, v in env.items()}
    config = Config.from_env({"IPAMD_STATE_DIR": str(tmp_path), **env})
    daemon = await fake_daemon(config, Ec2WithCpus(clock, vcpus, hypervisor), clock)
    try:
        assert daemon.engine.settings.max_pods == max_pods
        limits = pool_report(daemon)["limits"]
        assert isinstance(limits, dict)
        assert (limits["max_pods"], limits["max_pods_rule"]) == (max_pods, rule)
        assert str(max_pods) in limits["max_pods_reason"]
        if rule == "kubelet":
            assert limits["kubelet_config"] == f"maxPods=737 in {kubelet}"
        if env.get("IPAMD_KUBELET_CONFIG") == paths["{missing}"]:
            assert limits["kubelet_config"] == f"no file at {paths['{missing}']}"
    finally:
        await daemon.close()
