"""Prefix return: prefix mode taking its pool back from the /32s its fallback left.

While no /28 can be had (`cloud.errors.SubnetFragmented`: the subnet is too fragmented), prefix
mode with IPAMD_PREFIX_FALLBACK_TO_IPS grows with secondary IPs (docs/architecture.md §5.6). Once it
plans with prefixes again, each wholly free /32 is a *leftover* (`tally_node(..., set_aside_smaller=True)`,
for a strategy that `replaces_smaller_units`): it still takes its ENI slot, but the goal is counted
without it. So the plan

- grows prefixes as if the leftovers were not there: on existing ENIs' free slots, then on new ENIs,
  and when neither has room, in the slots of leftovers it gives back first (`PoolPlan.replace_units`,
  `replacements`): a node whose ENIs the fallback filled with /32s is not held on them;
- once the goal is met, gives every leftover back (`leftovers_to_return`), but those on an ENI that
  goes back whole, which go with it.

A /32 that a pod owns, or that is cooling, is never a leftover: it goes back once it has emptied and
cooled. The pool manager applies the prefix assignments before any other release, so a prefix EC2
still refuses costs only the `replace_units` of that plan, and the fallback grows them back.

Pure; no asyncio, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

from ipamd.sizing.tally import EniTally


def replacements(
    enis: Iterable[EniTally], wanted: int, budget: int
) -> tuple[tuple[tuple[str, int], ...], tuple[str, ...]]:
    """Where up to `wanted` units (at most `budget`) go in the slots of leftovers, the ENIs in the
    order given: (ENI ID, units) for each ENI used, and the leftovers to give back first, each
    ENI's latest listed first."""
    assign: list[tuple[str, int]] = []
    given_back: list[str] = []
    for eni in enis:
        take = min(len(eni.leftovers), wanted, budget)
        if take <= 0:
            continue
        assign.append((eni.stats.eni_id, take))
        given_back.extend(u.cidr for u in reversed(eni.leftovers[-take:]))
        wanted -= take
        budget -= take
    return tuple(assign), tuple(given_back)


def leftovers_to_return(
    enis: Iterable[EniTally], released_enis: Iterable[str], replaced: Iterable[str]
) -> tuple[str, ...]:
    """Every leftover not already given back (`replaced`) nor going with its ENI, latest listed
    first on each ENI."""
    skip_enis, skip_units = set(released_enis), set(replaced)
    return tuple(
        u.cidr
        for eni in enis
        if eni.stats.eni_id not in skip_enis
        for u in reversed(eni.leftovers)
        if u.cidr not in skip_units
    )
