"""`ipamd.sizing.subnets` on full subnets: a subnet a call found without room goes last among the
candidates and stays full until a view shows the room that call asked for; while another candidate
is not full, its ENIs get no new units and the plan grows on new ENIs instead (`EniStats.grows`)."""

from __future__ import annotations

from ipamd.sizing import SECONDARY_IPS, NodeLimits, PoolTargets, plan_pool
from ipamd.sizing.subnets import (
    ROLE_TAG,
    SubnetFacts,
    growth_closed,
    rank_subnets,
    still_full,
    stop_growth,
)
from tests.unit.sizing.simulation import eni, node, units

NODE = "subnet-node"
PODS = "subnet-pods"
M5_LARGE = NodeLimits(max_enis=3, units_per_eni=9)


def test_a_full_subnet_goes_last_whatever_its_count() -> None:
    listing = [SubnetFacts(NODE, 300, {}), SubnetFacts(PODS, 60000, {ROLE_TAG: "1"})]
    assert rank_subnets(listing, NODE, "") == (PODS, NODE)
    assert rank_subnets(listing, NODE, "", full={PODS}) == (NODE, PODS)


def test_a_full_subnet_stays_full_until_a_view_shows_what_was_asked() -> None:
    full = {NODE: 9, PODS: 1}
    view = [SubnetFacts(NODE, 4, {}), SubnetFacts(PODS, 1, {ROLE_TAG: "1"})]
    assert still_full(full, view) == {NODE: 9}, "4 free is not the 9 the assign asked for"
    assert still_full(full, [SubnetFacts(NODE, 9, {})]) == {}, "9 free, and PODS unlisted"


def test_growth_closes_only_while_another_candidate_is_not_full() -> None:
    assert growth_closed({NODE: 9}, (PODS, NODE)) == {NODE}
    assert growth_closed({NODE: 9, PODS: 1}, (PODS, NODE)) == frozenset(), "nothing takes over"
    assert growth_closed({NODE: 9}, (NODE,)) == frozenset(), "no other candidate"
    assert growth_closed({}, (PODS, NODE)) == frozenset()


def test_an_unfilled_primary_in_a_full_subnet_gives_way_to_a_new_eni() -> None:
    """WARM_ENI_TARGET=1 on an m5.large whose primary ENI got 2 of its 9 addresses before the node
    subnet ran dry: the plan fills the primary; with the primary's subnet full, a new ENI instead,
    and the primary's free addresses still count towards the goal."""
    stats = node(eni(0, units(0, 2)))
    targets = PoolTargets(warm_eni_target=1)
    assert plan_pool(stats, targets, M5_LARGE, SECONDARY_IPS).assign == (("eni-0", 7),)

    stopped = stop_growth(stats, {"eni-0": NODE}, {NODE})
    assert [e.grows for e in stopped.enis] == [False]
    plan = plan_pool(stopped, targets, M5_LARGE, SECONDARY_IPS)
    assert plan.assign == () and plan.new_enis == (9,)

    busy = stop_growth(node(eni(0, units(0, 2, assigned=1)), eni(1, units(1, 9))), {}, {NODE})
    assert all(e.grows for e in busy.enis), "an ENI whose subnet is not known is left as it is"
