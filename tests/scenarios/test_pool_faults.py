"""S25 and a failing disk: the pool manager under throttling and errors during churn, an unassign
applied but answered with an error, and pool ticks on a disk that fails.

Every test ends with the shared invariant check, which includes "what EC2 reports equals what ipamd
believes". What each scenario replays, and which tests prove it: docs/failure-scenarios.md."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from cloud.embedded.faults import FaultInjector
from cloud.embedded.world import EmbeddedEc2
from datastore.records import AllocationRecord
from ipamd.engine.invariants import check_invariants
from ipamd.errors import NoAddressAvailable
from ipamd.model import AddressState
from ipamd.node.cloud_node import open_cloud_node
from tests.scenarios.pool_support import (
    EAGER,
    NO_RELEASE_DELAY,
    addresses,
    all_ec2_units,
    faulty_node,
    fill_then_empty,
    handed_out,
    on_faulty_store,
    releasing,
    rounds,
)
from tests.support.ec2_doubles import (
    retrying_on,
)
from tests.support.node import key

# -- S25 ---------------------------------------------------------------------------------------

# Partial failures (EC2 acts, the caller sees a timeout) on every call type but the unassign, whose
# handling is the subject of its own test below.
PARTIAL_FAILURES = (
    "AssignPrivateIpAddresses",
    "CreateNetworkInterface",
    "AttachNetworkInterface",
    "ModifyNetworkInterfaceAttribute",
    "DetachNetworkInterface",
    "DeleteNetworkInterface",
    "DescribeNetworkInterfaces",
)


def _inject_churn_faults(faults: FaultInjector) -> None:
    faults.throttle(rate=0.3)
    faults.server_error(code="Unavailable", rate=0.05)
    faults.server_error(code="InternalError", rate=0.03)
    faults.timeout(rate=0.03)
    faults.partial_failure(*PARTIAL_FAILURES, rate=0.1)


async def test_s25_throttling_and_errors_during_churn(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    faults = FaultInjector(seed=27)
    targets = replace(EAGER, warm_ip_target=3, minimum_ip_target=4)
    async with open_cloud_node(
        embedded,
        tmp_path,
        "m5.large",
        targets=targets,
        api_wrapper=retrying_on(faults),
        settings=NO_RELEASE_DELAY,
    ) as node:
        rng = random.Random(2025)
        live: list[str] = []
        served = refused = 0
        await node.settle()
        _inject_churn_faults(faults)
        for step in range(200):
            # Waves: pods come (ENIs attach), then go (ENIs detach and are deleted).
            leaving = 0.3 if (step // 50) % 2 == 0 else 0.75
            if live and rng.random() < leaving:
                await node.engine.release(key(live.pop(rng.randrange(len(live)))))
            else:
                free = node.engine.snapshot().counts[AddressState.FREE]
                try:
                    await node.engine.assign(key(f"pod-{step}"))
                    live.append(f"pod-{step}")
                    served += 1
                except NoAddressAvailable:
                    assert free == 0, f"step {step}: {free} free addresses, yet refused"
                    refused += 1
            node.clock.advance(rng.uniform(0, 5))
            await node.pool.run_once()
            if step % 50 == 49:
                # Each wave ends in a quiet spell, still under the faults: throttle answers hold
                # background work (warm-up, shrinking) back for a while, and freed addresses cool
                # down; past both, the pool does what the wave left it to do.
                for _ in range(6):
                    conditions = node.pool.conditions
                    quiet = (
                        max(conditions.warm_hold_until, conditions.backoff_until) - node.clock.now()
                    )
                    node.clock.advance(max(quiet, 0.0) + 31.0)
                    await node.pool.run_once()
            # EC2 and ipamd may disagree mid-churn (a partial failure); ipamd's own state may not.
            check_invariants(node.engine, node.path, node.clock.now())
        injected = faults.injected
        assert {"throttle", "server_error", "timeout", "partial_failure"} <= set(injected)
        assert node.calls.count(outcome="RequestLimitExceeded") > 0
        assert node.calls.retries > 0
        assert node.pool.health.failures > 0
        assert {
            "AssignPrivateIpAddresses",
            "UnassignPrivateIpAddresses",
            "CreateNetworkInterface",
            "AttachNetworkInterface",
            "DetachNetworkInterface",
            "DeleteNetworkInterface",
        } <= node.calls.operations(), "every call type went through the faults"
        assert served > refused, "ADDs are served from the warm pool"

        faults.clear()
        node.clock.advance(120)  # past any backoff and cooldown, and the grace window
        # A partial failure of an assign or attach leaves units (or an ENI) on EC2 that ipamd
        # never heard of, and a release of unknown outcome leaves units releasing: the EC2 drift
        # settles both, as in the daemon.
        await node.drift.run_once()
        await node.settle()
        assert releasing(node) == set(), "nothing stuck releasing"
        node.check()


async def test_s25_unassign_applied_but_answered_with_an_error_hands_out_none_of_its_units(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    faults = FaultInjector(seed=1)
    async with faulty_node(
        embedded, tmp_path, "m5.large", replace(EAGER, warm_ip_target=2), faults
    ) as node:
        await fill_then_empty(node, 3, "old")
        excess = set(node.pool.plan().release_units)
        assert len(excess) == 3
        faults.partial_failure("UnassignPrivateIpAddresses", times=1)
        await node.pool.run_once()
        assert excess.isdisjoint(all_ec2_units(node)), "EC2 did unassign them"
        served: list[AllocationRecord] = []
        with pytest.raises(NoAddressAvailable):
            for i in range(10):
                served.append(await node.engine.assign(key(f"new-{i}")))
        assert handed_out(served).isdisjoint(addresses(excess)), "gone from EC2, handed out"
        await rounds(node)
        assert releasing(node) == set()
        node.check()


@pytest.mark.parametrize("direction", ["grow", "shrink"])
async def test_pool_tick_on_a_failing_disk_backs_off_and_the_drift_catches_up(
    embedded: EmbeddedEc2, tmp_path: Path, direction: str
) -> None:
    """A full state disk during pool work (the chaos runner found the daemon exiting on it): the tick
    fails like a failed EC2 call, with backoff, memory unchanged; what EC2 did meanwhile the drift
    reconciles once the disk takes writes again."""
    targets = replace(EAGER, warm_ip_target=2)
    async with open_cloud_node(
        embedded, tmp_path, targets=targets, settings=NO_RELEASE_DELAY
    ) as node:
        store = await on_faulty_store(node)
        if direction == "shrink":
            await fill_then_empty(node, 3, "old")  # one free address more than wanted
        plan = node.pool.plan()
        assert plan.assign if direction == "grow" else plan.release_units
        before = node.engine.state.to_image()
        store.fail_next("read_only")
        await node.pool.run_once()  # raises nothing: the daemon's pool loop keeps going
        assert not store.faults, "the tick's first commit met the failing disk"
        assert node.pool.health.errors_by_code == {"store_write_failed": 1}
        assert node.pool.conditions.backoff_until >= node.clock.now()
        assert node.engine.state.to_image() == before, "nothing half-applied in memory"

        node.clock.advance(61.0)  # past the backoff and the grace window
        await node.drift.run_once()
        await node.settle()
        node.check()  # EC2's view and ipamd's agree again
