"""`ipamd.sizing.subnets`: which subnets subnet discovery may create ENIs in and which it excludes
(VPC CNI's `isSubnetValidForENICreation` and `IsSubnetExcluded`, pkg/awsutils/awsutils.go), how it
ranks them, which ENIs are someone else's, and how the ENIs of an excluded subnet are drained."""

from __future__ import annotations

import random

import pytest

from ipamd.sizing import SECONDARY_IPS, NodeLimits, PoolTargets, plan_pool
from ipamd.sizing.subnets import (
    CLUSTER_TAG_PREFIX,
    NO_MANAGE_TAG,
    ROLE_TAG,
    SubnetFacts,
    excluded_subnets,
    is_excluded,
    left_alone,
    plan_drain,
    rank_subnets,
    takes_new_enis,
)
from tests.unit.sizing.simulation import eni, node, unit, units

NODE = "subnet-node"
BLUE = f"{CLUSTER_TAG_PREFIX}blue"
GREEN = f"{CLUSTER_TAG_PREFIX}green"


def subnet(subnet_id: str, free: int = 100, tags: dict[str, str] | None = None) -> SubnetFacts:
    return SubnetFacts(subnet_id, free, tags or {})


def tagged(
    subnet_id: str, free: int = 100, role: str = "1", more: dict[str, str] | None = None
) -> SubnetFacts:
    return SubnetFacts(subnet_id, free, {ROLE_TAG: role, **(more or {})})


@pytest.mark.parametrize("value", ["1", "true", "yes", "anything"])
def test_any_role_value_but_0_opts_a_subnet_in(value: str) -> None:
    assert takes_new_enis(tagged("subnet-a", role=value), NODE, "")
    assert not is_excluded(tagged("subnet-a", role=value), "")


def test_0_excludes_a_subnet_the_nodes_own_included() -> None:
    for subnet_id in ("subnet-a", NODE):
        zero = tagged(subnet_id, role="0")
        assert not takes_new_enis(zero, NODE, "") and is_excluded(zero, "")


def test_an_untagged_subnet_is_used_only_if_it_is_the_nodes_and_never_excluded() -> None:
    """An empty value is no tag at all, as in VPC CNI (`getTagValue` returns "")."""
    for tags in ({}, {ROLE_TAG: ""}):
        assert takes_new_enis(SubnetFacts(NODE, 10, tags), NODE, "blue")
        assert not takes_new_enis(SubnetFacts("subnet-a", 10, tags), NODE, "blue")
        assert not is_excluded(SubnetFacts("subnet-a", 10, tags), "blue")


def test_the_cluster_tag_scopes_a_subnet_to_the_clusters_it_names() -> None:
    mine, theirs = tagged("subnet-a", more={BLUE: "1"}), tagged("subnet-b", more={GREEN: "1"})
    shared = tagged("subnet-c", more={BLUE: "1", GREEN: "1"})
    assert takes_new_enis(mine, NODE, "blue") and not is_excluded(mine, "blue")
    assert takes_new_enis(shared, NODE, "blue") and takes_new_enis(shared, NODE, "green")
    assert not takes_new_enis(theirs, NODE, "blue") and is_excluded(theirs, "blue")
    # The tag's key is what scopes; its value is not read.
    assert takes_new_enis(tagged("subnet-d", more={BLUE: ""}), NODE, "blue")


def test_without_a_cluster_name_cluster_tags_are_ignored() -> None:
    theirs = tagged("subnet-b", more={GREEN: "1"})
    assert takes_new_enis(theirs, NODE, "") and not is_excluded(theirs, "")


def test_the_nodes_subnet_untagged_is_used_whatever_its_cluster_tags() -> None:
    """VPC CNI checks cluster tags only on a subnet that carries the role tag."""
    own = subnet(NODE, tags={GREEN: "1"})
    assert takes_new_enis(own, NODE, "blue") and not is_excluded(own, "blue")
    opted = tagged(NODE, more={GREEN: "1"})
    assert not takes_new_enis(opted, NODE, "blue") and is_excluded(opted, "blue")


def test_the_most_free_addresses_first_ties_by_subnet_id_whatever_the_listing_order() -> None:
    listing = [
        tagged("subnet-b", 500),
        tagged("subnet-a", 500),
        subnet(NODE, 400),
        tagged("subnet-c", 900),
        subnet("subnet-untagged", 5000),
        tagged("subnet-zero", 8000, role="0"),
        tagged("subnet-green", 7000, more={GREEN: "1"}),
    ]
    expected = ("subnet-c", "subnet-a", "subnet-b", NODE)
    for seed in range(5):
        random.Random(seed).shuffle(listing)
        assert rank_subnets(listing, NODE, "blue") == expected
    assert excluded_subnets(listing, "blue") == {"subnet-zero", "subnet-green"}


def test_nothing_to_rank_when_every_subnet_is_excluded() -> None:
    assert rank_subnets([tagged(NODE, role="0"), subnet("subnet-a")], NODE, "") == ()


@pytest.mark.parametrize(
    ("tags", "interface_type", "alone"),
    [
        ({}, "interface", False),
        ({}, "", False),
        ({NO_MANAGE_TAG: "true"}, "interface", True),
        ({NO_MANAGE_TAG: "false"}, "interface", False),
        ({NO_MANAGE_TAG: "True"}, "interface", False),
        ({}, "efa", True),
        ({}, "efa-only", True),
        ({}, "trunk", True),
        ({}, "branch", True),
    ],
)
def test_enis_of_other_users_are_left_alone(
    tags: dict[str, str], interface_type: str, alone: bool
) -> None:
    """VPC CNI's `no_manage` tag is unmanaged only when it is exactly `true`."""
    assert left_alone(tags, interface_type, is_primary=False) is alone


def test_the_primary_eni_is_never_left_alone() -> None:
    assert not left_alone({NO_MANAGE_TAG: "true"}, "efa", is_primary=True)


# --- draining -------------------------------------------------------------------------------------

LIMITS = NodeLimits(max_enis=4, units_per_eni=5)
TARGETS = PoolTargets(warm_ip_target=2)


def test_nothing_closed_and_no_others_changes_nothing() -> None:
    stats = node(eni(0, units(0, 2)), eni(1, units(1, 2)))
    drain = plan_drain(stats, TARGETS, LIMITS, closed=set())
    assert (drain.stats, drain.targets, drain.limits) == (stats, TARGETS, LIMITS)
    assert (drain.release_units, drain.release_enis) == ((), ())


def test_an_idle_closed_eni_goes_whole_young_or_not() -> None:
    stats = node(eni(0, units(0, 3)), eni(1, units(1, 3), age_s=0.0))
    drain = plan_drain(stats, TARGETS, LIMITS, closed={"eni-1"})
    assert drain.release_enis == ("eni-1",) and drain.release_units == ()
    assert [e.eni_id for e in drain.stats.enis] == ["eni-0"]


def test_a_closed_eni_with_pods_gives_back_its_wholly_free_units_and_stays() -> None:
    busy = [
        unit("10.1.0.0/28", 16, assigned=3),
        unit("10.1.0.16/28", 16),
        unit("10.1.0.32/28", 16, cooling=1),
        unit("10.1.0.48/28", 16, releasing=True),
    ]
    drain = plan_drain(node(eni(0), eni(1, busy)), TARGETS, LIMITS, closed={"eni-1"})
    assert drain.release_units == ("10.1.0.16/28",) and drain.release_enis == ()


def test_a_closed_eni_with_an_unassign_in_flight_is_not_released_yet() -> None:
    drain = plan_drain(
        node(eni(0), eni(1, [unit("10.1.0.1/32", releasing=True)])),
        TARGETS,
        LIMITS,
        closed={"eni-1"},
    )
    assert (drain.release_units, drain.release_enis) == ((), ())


def test_a_closed_primary_stays_and_gives_back_its_free_units() -> None:
    primary = [unit("10.0.0.1/32", assigned=1), unit("10.0.0.2/32"), unit("10.0.0.3/32")]
    drain = plan_drain(node(eni(0, primary)), TARGETS, LIMITS, closed={"eni-0"})
    assert drain.release_units == ("10.0.0.2/32", "10.0.0.3/32") and drain.release_enis == ()


def test_closed_enis_and_other_users_enis_take_attachments() -> None:
    stats = node(eni(0, units(0, 5)), eni(1, units(1, 5, assigned=1)))
    drain = plan_drain(stats, TARGETS, LIMITS, closed={"eni-1"}, others=1)
    assert drain.limits.max_enis == 2
    capped = plan_drain(stats, PoolTargets(max_eni=2), LIMITS, closed={"eni-0"})
    assert capped.limits.max_enis == 1 and capped.targets.max_eni is None
    # MAX_ENI=1 with its one ENI closed leaves room for none (MAX_ENI < 1 would mean no cap).
    none_left = plan_drain(node(eni(0)), PoolTargets(max_eni=1), LIMITS, closed={"eni-0"})
    assert none_left.limits.max_enis == 0


def test_the_targets_are_met_on_open_enis_only() -> None:
    """Free addresses on a closed ENI are not available: the pool grows on the open ones (a new
    ENI here, since the primary is closed) and drains the closed one meanwhile."""
    stats = node(eni(0, [unit("10.0.0.1/32", assigned=1), *units(5, 4)]))
    drain = plan_drain(stats, TARGETS, LIMITS, closed={"eni-0"})
    plan = drain.applied_to(plan_pool(drain.stats, drain.targets, drain.limits, SECONDARY_IPS))
    assert plan.new_enis == (2,)
    assert set(plan.release_units) == {u.cidr for u in units(5, 4)}
    assert "draining 0 ENIs and 4 units" in plan.reason
