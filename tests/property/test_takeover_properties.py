"""Properties of taking a node over from aws-node's checkpoint, over checkpoints hypothesis makes up:
whatever the file holds, parsing either refuses it as a whole or yields entries, and adopting them
never gives an address two owners, never owns an address EC2 does not list, never revives a deleted
container, and takes an address from ipamd's own claim only on the runtime's evidence."""

from __future__ import annotations

import json
import os
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from datastore.records import (
    AllocationKey,
    AllocationRecord,
    EniRecord,
    IntentRecord,
    Mutation,
    UnitRecord,
)
from ipamd.awsnode.checkpoint import CheckpointError, parse, render, stamp_ns
from ipamd.awsnode.takeover import plan_adoption
from ipamd.engine.allocator import pick_addresses
from ipamd.engine.invariants import check_state
from ipamd.engine.state import NodeState
from tests.support import go_json

EXAMPLES = int(os.environ.get("IPAMD_HYPOTHESIS_EXAMPLES", "200"))
NOW = 1_800_000_000.0
COOLDOWN_S = 30.0
TTL_S = 600.0
SECONDARIES = [f"10.0.0.{n}" for n in range(10, 18)]
PREFIX = "10.1.0.0/28"
ON_NODE = SECONDARIES + [f"10.1.0.{n}" for n in range(16)]
ELSEWHERE = ["10.9.9.9", "10.0.0.200"]
CONTAINERS = ["c1", "c2", "c3", "c4", "c5", "c6"]


def base_state(owned: dict[str, str], intents: dict[str, float]) -> NodeState:
    """Two ENIs (eight /32s on the primary, one /28 on the other) and ipamd's own allocations."""
    enis = (
        EniRecord("eni-0", 0, "subnet-1", True, NOW - 900, "0a:00:00:00:00:00", "10.0.0.5"),
        EniRecord("eni-1", 1, "subnet-1", False, NOW - 900, "0a:00:00:00:00:01", "10.0.0.6"),
    )
    units = tuple(UnitRecord(f"{a}/32", "eni-0", "ip", "active", NOW - 900) for a in SECONDARIES)
    units += (UnitRecord(PREFIX, "eni-1", "prefix", "active", NOW - 900),)
    records = tuple(
        AllocationRecord(
            AllocationKey("aws-cni", cid, "eth0"),
            (address,),
            (f"{address}/32" if address in SECONDARIES else PREFIX,),
            "eni-0" if address in SECONDARIES else "eni-1",
            NOW - 500,
        )
        for address, cid in owned.items()
        if intents.get(cid, -1e12) + TTL_S <= NOW  # invariant 3 holds in the state we start from
    )
    state = NodeState()
    state.apply(
        Mutation(
            put_enis=enis,
            put_units=units,
            put_allocations=records,
            put_intents=tuple(IntentRecord(c, t) for c, t in intents.items()),
        )
    )
    return state


entries = st.fixed_dictionaries(
    {
        "networkName": st.sampled_from(["aws-cni", "aws-cni", "k8s-pod-network", ""]),
        "containerID": st.sampled_from([*CONTAINERS, "../etc", ""]),
        "ifName": st.sampled_from(["eth0", "eth0", "eth1", "a/b"]),
        "ipv4": st.sampled_from([*ON_NODE, *ELSEWHERE, "300.1.1.1", ""]),
        "allocationTimestamp": st.integers(min_value=-5, max_value=2**62),
    },
    optional={"metadata": st.fixed_dictionaries({"k8sPodName": st.text(max_size=8)})},
)
owned_by_ipamd = st.dictionaries(
    st.sampled_from(ON_NODE), st.sampled_from([*CONTAINERS, "own1", "own2"]), max_size=6
).filter(lambda d: len(set(d.values())) == len(d))  # one address per ipamd container
intents = st.dictionaries(
    st.sampled_from(CONTAINERS), st.sampled_from([NOW - 10, NOW - 2 * TTL_S]), max_size=3
)
live = st.none() | st.frozensets(st.sampled_from([*CONTAINERS, "own1", "own2"]))


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    items=st.lists(entries | st.integers() | st.text(max_size=4), max_size=12),
    owned=owned_by_ipamd,
    deleted=intents,
    running=live,
)
def test_adopting_any_checkpoint_keeps_every_invariant(
    items: list[Any],
    owned: dict[str, str],
    deleted: dict[str, float],
    running: frozenset[str] | None,
) -> None:
    state = base_state(owned, deleted)
    before = dict(state.allocations())
    checkpoint = parse(json.dumps({"version": "vpc-cni-ipam/1", "allocations": items}).encode())

    mutation, adoption = plan_adoption(state, checkpoint, running, NOW, TTL_S)
    state.apply(mutation)

    check_state(state, NOW, COOLDOWN_S, TTL_S)
    assert len(checkpoint.entries) + len(checkpoint.skipped) == len(items)
    for key in adoption.adopted:
        (address,) = state.allocations()[key].addresses
        assert address in ON_NODE, f"{address} owned though EC2 lists it nowhere here"
    for key, record in before.items():
        if key in adoption.replaced:
            taker = state.owner_of(record.addresses[0])
            assert running is not None and taker is not None
            assert taker.container_id in running and key.container_id not in running
        else:
            assert state.allocations().get(key) == record, "ipamd's own claim kept"


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    st.binary(max_size=200)
    | st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
        ),
        max_leaves=12,
    ).map(lambda doc: json.dumps(doc).encode())
    | st.tuples(
        st.sampled_from([b"[", b'{"a":', b'{"version":"vpc-cni-ipam/1","allocations":[']),
        st.integers(1, 100_000),
    ).map(lambda t: t[0] * t[1])
)
def test_any_bytes_parse_or_are_refused_as_not_a_checkpoint(raw: bytes) -> None:
    try:
        checkpoint = parse(raw)
    except CheckpointError:
        return
    assert all(e.address for e in checkpoint.entries)


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    items=st.lists(entries | st.integers() | st.text(max_size=4), max_size=12),
    owned=owned_by_ipamd,
    deleted=intents,
    running=live,
)
def test_no_address_an_entry_names_is_left_free(
    items: list[Any],
    owned: dict[str, str],
    deleted: dict[str, float],
    running: frozenset[str] | None,
) -> None:
    """Adopted or not, every address the checkpoint names stays out of the next ADD's reach: owned
    by its pod, or held by the quarantined claim the entry became."""
    state = base_state(owned, deleted)
    checkpoint = parse(json.dumps({"version": "vpc-cni-ipam/1", "allocations": items}).encode())
    named = {e.address for e in checkpoint.entries}
    named |= {s.address for s in checkpoint.skipped if s.address is not None}

    mutation, _ = plan_adoption(state, checkpoint, running, NOW, TTL_S)
    state.apply(mutation)

    for address in named & set(ON_NODE):
        assert state.owner_of(address) is not None or state.is_held(address), address
    while (picked := pick_addresses(state, 1, NOW + 10 * COOLDOWN_S, COOLDOWN_S)) is not None:
        eni_id, [(address, cidr)] = picked
        assert address not in named, f"{address} handed out while an entry names it"
        key = AllocationKey("new", f"n-{address}", "eth0")
        state.apply(
            Mutation(put_allocations=(AllocationRecord(key, (address,), (cidr,), eni_id, NOW),))
        )


records = st.builds(
    AllocationRecord,
    key=st.builds(
        AllocationKey,
        st.sampled_from(["aws-cni", "_migrated-from-cri", "k8s-pod-network"]),
        st.text("0123456789abcdef", min_size=1, max_size=64),
        st.sampled_from(["eth0", "unknown", "net1"]),
    ),
    addresses=st.sampled_from([*ON_NODE, "2600:1f14:abc:d00:1234::1"]).map(lambda a: (a,)),
    unit_cidrs=st.just(("10.0.0.10/32",)),
    eni_id=st.just("eni-0"),
    created_at=st.floats(min_value=-1e20, max_value=1e20, allow_nan=False),
    pod_namespace=st.text(max_size=20),
    pod_name=st.text(max_size=40),
    stamp_ns=st.none() | st.integers(min_value=-(2**63), max_value=2**63 - 1),
)


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.lists(records, max_size=8, unique_by=lambda r: r.key))
def test_every_file_ipamd_writes_decodes_with_gos_rules(allocs: list[AllocationRecord]) -> None:
    """aws-node, rolled back onto the node, decodes the file into its own structs (one error and it
    restores no pod): every entry comes back with its key, address and exact timestamp."""
    raw = render(allocs)

    decoded = go_json.decode(raw)

    assert decoded.version == "vpc-cni-ipam/1"
    by_key = {(e.network_name, e.container_id, e.if_name): e for e in decoded.allocations}
    for alloc in allocs:
        e = by_key[(alloc.key.network, alloc.key.container_id, alloc.key.ifname)]
        assert (e.ipv6 or e.ipv4) == alloc.addresses[0]
        assert e.allocation_timestamp == stamp_ns(alloc)
        if alloc.stamp_ns is not None:
            assert e.allocation_timestamp == alloc.stamp_ns
        assert (e.namespace, e.name) == (alloc.pod_namespace, alloc.pod_name)
