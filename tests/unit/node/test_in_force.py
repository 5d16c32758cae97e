"""`ipamctl status`'s `in_force` (`ipamd.node.report.in_force`): which warm targets the pool follows,
for a pool that learns of pods at their ADD and for a pod-aware one with every warm target at 0."""

from __future__ import annotations

from pathlib import Path

from cloud.fakes import FakeEc2
from ipamd.clock import FakeClock
from ipamd.config.settings import Config
from ipamd.node.report import in_force
from tests.support.daemons import fake_daemon

ZEROS = {"WARM_ENI_TARGET": "0", "WARM_IP_TARGET": "0", "MINIMUM_IP_TARGET": "0"}


async def test_warm_targets_at_0_follow_the_pods_only_once_the_pool_is_pod_aware(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    config = Config.from_env({"IPAMD_STATE_DIR": str(tmp_path), **ZEROS})
    daemon = await fake_daemon(config, FakeEc2(clock), clock)
    try:
        await daemon.start()
        assert in_force(daemon)["goal"] == "warm_eni", "VPC CNI's WARM_ENI_TARGET=0"

        daemon.pool.expect_pods(lambda: 2)  # what the API's pod watch does (ipamd.kube.kube_node)
        shown = in_force(daemon)
        assert shown["goal"] == "pods"
        assert shown["targets"] == ["IPAMD_POD_AWARE_POOL"]
        ignored = shown["ignored"]
        assert isinstance(ignored, dict) and set(ignored) == {
            "WARM_ENI_TARGET",
            "WARM_PREFIX_TARGET",
        }
        assert daemon.pool.targets().pods_to_come == 2
    finally:
        await daemon.close()
