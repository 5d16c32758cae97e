"""VPC CNI's documented examples (its eni-and-ip-target.md and prefix-and-ip-target.md pages, listed in
docs/architecture.md §5.7), run to a settled pool: plan, apply, schedule pods, plan again, until
the plan is empty."""

from __future__ import annotations

from ipamd.sizing import PREFIXES, SECONDARY_IPS, NodeLimits, PoolTargets
from tests.unit.sizing.simulation import addresses, assigned, fresh_node, settle

T3_SMALL = NodeLimits(max_enis=3, units_per_eni=3)
"""3 ENIs x 4 IPv4 addresses."""
P3DN_24XLARGE = NodeLimits(max_enis=15, units_per_eni=49)
"""15 ENIs x 50 IPv4 addresses."""


def test_warm_eni_target_1_with_5_pods_holds_3_enis_and_9_ips() -> None:
    done = settle(fresh_node(), PoolTargets(warm_eni_target=1), T3_SMALL, SECONDARY_IPS, pods=5)
    assert done.waiting == 0
    assert len(done.stats.enis) == 3
    assert addresses(done.stats) == 9
    assert assigned(done.stats) == 5


def test_warm_ip_target_2_minimum_5_with_no_pods_holds_2_enis_and_5_ips() -> None:
    targets = PoolTargets(warm_ip_target=2, minimum_ip_target=5)
    done = settle(fresh_node(), targets, T3_SMALL, SECONDARY_IPS)
    assert len(done.stats.enis) == 2
    assert [len(e.units) for e in done.stats.enis] == [3, 2]


def test_warm_prefix_target_1_with_17_pods_holds_3_prefixes_16_1_0() -> None:
    done = settle(fresh_node(), PoolTargets(warm_prefix_target=1), T3_SMALL, PREFIXES, pods=17)
    assert done.waiting == 0
    prefixes = [u for e in done.stats.enis for u in e.units]
    assert sorted(u.assigned for u in prefixes) == [0, 1, 16]
    assert len(done.stats.enis) == 1  # the primary ENI has room for all three


def test_p3dn_warm_eni_target_1_with_3_pods_holds_2_enis_and_98_ips() -> None:
    # The "IP hoarding" VPC CNI is known for, kept: it is what WARM_ENI_TARGET=1 asks for.
    done = settle(fresh_node(), PoolTargets(), P3DN_24XLARGE, SECONDARY_IPS, pods=3)
    assert len(done.stats.enis) == 2
    assert addresses(done.stats) == 98


def test_minimum_ip_target_in_prefix_mode_rounds_up_to_whole_prefixes() -> None:
    # docs/prefix-and-ip-target.md: a minimum between N*16 and (N+1)*16 behaves like (N+1)*16.
    targets = PoolTargets(warm_ip_target=1, minimum_ip_target=20)
    done = settle(fresh_node(), targets, T3_SMALL, PREFIXES)
    assert addresses(done.stats) == 32


def test_warm_ip_target_in_prefix_mode_counts_addresses() -> None:
    # WARM_IP_TARGET=5 in prefix mode: one prefix keeps 5 free until the 12th pod, then a second.
    targets = PoolTargets(warm_ip_target=5)
    assert addresses(settle(fresh_node(), targets, T3_SMALL, PREFIXES, pods=11).stats) == 16
    assert addresses(settle(fresh_node(), targets, T3_SMALL, PREFIXES, pods=12).stats) == 32


def test_minimum_ip_target_alone_pins_the_pool_at_the_floor() -> None:
    # VPC CNI keeps this on purpose: WARM_IP_TARGET=0 with a minimum stops all growth past it.
    done = settle(fresh_node(), PoolTargets(minimum_ip_target=4), T3_SMALL, SECONDARY_IPS, pods=6)
    assert addresses(done.stats) == 4
    assert done.waiting == 2


def test_a_full_node_stops_at_its_limits() -> None:
    done = settle(fresh_node(), PoolTargets(warm_ip_target=3), T3_SMALL, SECONDARY_IPS, pods=20)
    assert len(done.stats.enis) == 3
    assert addresses(done.stats) == 9
    assert done.waiting == 11
