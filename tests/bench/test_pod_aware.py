"""The pod-aware pool's benches' own logic, without a daemon: `bench.pod_aware` reads EC2's view from
the embedded cloud's file, counts a pod ready only when its first ADD got an address EC2 held before
it, and schedules bindings and ADDs in time order with retries; `bench.api` finds whether every pod
list and watch a daemon made named its node, from the test API server's request log."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench.api import node_scoped
from bench.pod_aware import Pod, answered, ec2_addresses, schedule
from cloud.embedded.cloud_file import AttachmentFacts, CloudFacts, EniFacts
from tests.support.kube_api import KubeApiServer

NODE = "ip-10-0-0-10.us-west-2.compute.internal"


def _eni(eni_id: str, ips: tuple[str, ...], instance: str | None, index: int = 0) -> EniFacts:
    attachment = (
        None if instance is None else AttachmentFacts(f"att-{eni_id}", instance, index, True)
    )
    return EniFacts(eni_id, "02:00:00:00:00:01", "subnet-1", "10.0.0.5", ips, attachment=attachment)


def test_ec2s_view_is_the_secondary_ips_of_the_instances_attached_enis(tmp_path: Path) -> None:
    facts = CloudFacts(
        region="us-west-2",
        vpc_id="vpc-1",
        vpc_cidr="10.0.0.0/16",
        subnet_id="subnet-1",
        subnet_cidr="10.0.0.0/24",
        availability_zone="us-west-2a",
        security_group_id="sg-1",
        security_group_name="default",
        instance_id="i-1",
        instance_type="m5.xlarge",
        primary_eni_id="eni-1",
        enis=(
            _eni("eni-1", ("10.0.0.10", "10.0.0.11"), "i-1"),
            _eni("eni-2", ("10.0.0.20",), "i-1", 1),
            _eni("eni-3", ("10.0.0.30",), "i-2", 2),  # another instance's
            _eni("eni-4", ("10.0.0.40",), None),  # created, not attached
        ),
    )
    path = tmp_path / "embedded-cloud.json"
    path.write_text(facts.to_json())
    assert ec2_addresses(path) == {"10.0.0.10", "10.0.0.11", "10.0.0.20"}


def _ok(address: str) -> dict[str, Any]:
    return {"ips": [{"address": f"{address}/32"}]}


def _never() -> set[str]:
    raise AssertionError("EC2's view is read again only for an address it did not hold before")


REFUSED = {"code": "no_address", "message": "no free address"}


def test_a_pod_is_ready_only_when_its_first_add_got_an_address_ec2_held_before() -> None:
    ready = Pod(0, "web-00")
    assert answered(ready, 200, _ok("10.0.0.10"), {"10.0.0.10"}, _never)
    assert (ready.ready, ready.tries) == (True, 1)

    late = Pod(1, "web-01")
    assert not answered(late, 503, REFUSED, set(), _never)
    assert answered(late, 200, _ok("10.0.0.11"), {"10.0.0.11"}, _never)
    assert (late.ready, late.tries) == (False, 2), "a refused first ADD is late whatever follows"

    raced = Pod(2, "web-02")  # EC2 assigned it between the read and the ADD: counted late
    assert answered(raced, 200, _ok("10.0.0.12"), {"10.0.0.10"}, lambda: {"10.0.0.12"})
    assert raced.ready is False


@pytest.mark.parametrize(
    ("status", "answer", "ec2_now"),
    [
        (200, _ok("10.0.0.99"), set[str]),  # an address EC2 never assigned
        (500, {"code": "internal"}, _never),
        (503, {"code": "state_unavailable"}, _never),
    ],
)
def test_an_answer_the_bench_cannot_count_stops_it(
    status: int, answer: dict[str, Any], ec2_now: Callable[[], set[str]]
) -> None:
    with pytest.raises(RuntimeError):
        answered(Pod(0, "web-00"), status, answer, {"10.0.0.10"}, ec2_now)


def test_bindings_come_in_order_and_each_add_a_pull_later_retried_while_refused() -> None:
    pods = [Pod(n, f"web-{n}") for n in range(3)]
    log: list[str] = []
    refusals = {"web-1": 2}

    def add(pod: Pod) -> bool:
        log.append(f"add {pod.name}")
        left = refusals.get(pod.name, 0)
        refusals[pod.name] = left - 1
        return left <= 0

    schedule(
        pods,
        bind=lambda pod: log.append(f"bind {pod.name}"),
        add=add,
        every_s=0.001,
        pull_s=0.05,
        retry_s=0.02,  # later than every first ADD, whenever the refusal came
    )
    assert log[:3] == ["bind web-0", "bind web-1", "bind web-2"], "the pull outlasts the binds"
    assert log[3:] == [
        "add web-0",
        "add web-1",
        "add web-2",
        "add web-1",
        "add web-1",
    ]


def test_a_pod_never_answered_stops_the_schedule() -> None:
    with pytest.raises(RuntimeError, match="web-0"):
        schedule(
            [Pod(0, "web-0")],
            bind=lambda pod: None,
            add=lambda pod: False,
            every_s=0.0,
            pull_s=0.0,
            retry_s=0.001,
            limit_s=0.05,
        )


async def _get(api: KubeApiServer, path: str) -> None:
    async with api.session() as session, session.get(path) as answer:
        await answer.read()


async def test_the_request_log_says_whether_every_pod_list_and_watch_named_the_node(
    tmp_path: Path,
) -> None:
    async with KubeApiServer(tmp_path / "kube", default_watch_timeout_s=0.01) as api:
        api.add_node(NODE)
        by_node = f"fieldSelector=spec.nodeName%3D{NODE}"
        await _get(api, f"/api/v1/pods?{by_node}")
        assert not node_scoped(api.requests, NODE), "a list alone: no watch was seen"
        await _get(api, f"/api/v1/pods?{by_node}&watch=1")
        await _get(api, f"/api/v1/nodes/{NODE}")
        assert node_scoped(api.requests, NODE)
        assert not node_scoped(api.requests, "ip-10-0-9-9.us-west-2.compute.internal")
        await _get(api, "/api/v1/pods?watch=1&timeoutSeconds=0.01")
        assert not node_scoped(api.requests, NODE), "a watch of every node's pods"
