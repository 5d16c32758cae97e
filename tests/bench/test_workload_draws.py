"""The workload's dice are its own: each kind of draw comes from a stream of its own and takes the
same draws whatever the cluster looks like, so the nth pod's arrival, lifetime, missed DEL and the
nodes it is offered do not depend on what ipamd (or any other draw) did before it."""

from __future__ import annotations

from typing import Any

from bench.cluster.workload import Draws


def _nodes(n: int) -> list[Any]:
    return [f"node-{i}" for i in range(n)]


def test_a_pods_lifetime_and_missed_del_do_not_move_with_other_draws() -> None:
    quiet, busy = Draws(7), Draws(7)
    for _ in range(50):
        busy.offers(_nodes(13))
        busy.gap_s(4.0)
    assert [quiet.lifetime_s(1800.0) for _ in range(20)] == [
        busy.lifetime_s(1800.0) for _ in range(20)
    ]
    assert [quiet.del_missed(0.3) for _ in range(40)] == [busy.del_missed(0.3) for _ in range(40)]


def test_a_lifetime_is_drawn_even_for_pods_that_live_to_the_end() -> None:
    """A burst's pods (no lifetime) take their draw too, so the pods after them are not shifted."""
    a, b = Draws(3), Draws(3)
    assert a.lifetime_s(None) is None
    b.lifetime_s(60.0)
    assert a.lifetime_s(60.0) == b.lifetime_s(60.0)


def test_offers_take_the_same_draws_whatever_the_number_of_nodes() -> None:
    a, b = Draws(11), Draws(11)
    a.offers(_nodes(3))
    b.offers(_nodes(997))  # a choice over more nodes must not take more of the stream
    many = _nodes(500)
    offered = a.offers(many)
    assert offered == b.offers(many)
    assert len(offered) == Draws.OFFERS and set(offered) <= set(many)


def test_seeds_give_different_workloads() -> None:
    one, two = Draws(1), Draws(2)
    assert [one.gap_s(1.0) for _ in range(3)] != [two.gap_s(1.0) for _ in range(3)]
