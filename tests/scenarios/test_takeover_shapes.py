"""Taking over nodes as aws-node fleets really are: checkpoints of every shape VPC CNI has written
(tests/support/vpc_cni_checkpoints.py cites them), pods aws-node itself found through CRI, entries
ipamd cannot adopt, and files that are no checkpoint at all. Whatever the file, the daemon starts,
and no ADD gets an address an entry names while the pod that entry names may run."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from datastore.records import AllocationKey
from ipamd.awsnode.checkpoint import BACKFILL_IFNAME, BACKFILL_NETWORK, parse
from ipamd.errors import NoAddressAvailable
from ipamd.model import AddressState, PodRef
from tests.support.aws_node_left import COOLDOWN_S, GRACE_S, AwsNodeLeft, aws_cni, entry
from tests.support.vpc_cni_checkpoints import SHAPES, Pod, Shape, render

MIGRATED = "75ebe0da8b3f1e5ee3faab89e538fb32af7c038fd0cd0ebf39dee8e459d1788e"
ADDED = "9d3c" + "0" * 60
STAMP_NS = 1_647_904_840_550_836_685


@pytest.fixture
async def node(tmp_path: Path) -> AwsNodeLeft:
    node = AwsNodeLeft(tmp_path)
    await node.assign()
    return node


async def _drain(node: AwsNodeLeft, daemon: object, count: int) -> list[str]:
    """Up to `count` ADDs of new pods, the clock stepping past every cooldown: the addresses got."""
    from ipamd.node.daemon import Daemon

    assert isinstance(daemon, Daemon)
    got: list[str] = []
    node.clock.advance(2 * COOLDOWN_S)
    for n in range(count):
        try:
            record = await daemon.engine.assign(aws_cni(f"new{n:03}"), PodRef("default", "p", ""))
        except NoAddressAvailable:
            break
        got.extend(record.addresses)
    return got


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.tag)
async def test_every_shape_is_adopted_and_the_cri_migrated_pod_keeps_its_address(
    node: AwsNodeLeft, shape: Shape
) -> None:
    a0, a1, *_ = node.addresses[0]
    (b0, *_) = node.addresses[1]
    pods = [
        Pod(MIGRATED, a0, "kube-system", "coredns-85d5b4454c-l9pwn", STAMP_NS, migrated=True),
        Pod(ADDED, b0, "default", "web-0", STAMP_NS + 1),
    ]
    node.write_bytes(render(shape, pods))
    node.runtime.start(MIGRATED)
    node.runtime.start(ADDED)
    daemon = await node.daemon()
    try:
        await daemon.start()
        migrated = AllocationKey(BACKFILL_NETWORK, MIGRATED, BACKFILL_IFNAME)
        state = daemon.engine.state
        assert state.allocations()[migrated].addresses == (a0,)
        assert state.allocations()[aws_cni(ADDED)].addresses == (b0,)

        got = await _drain(node, daemon, 100)
        assert got and a0 not in got and b0 not in got, "a new pod got a live pod's address"
        assert a1 in got

        # The kubelet's DEL carries the real key; aws-node's DEL falls back to the backfill key,
        # ipamd's releases every allocation of the container ID.
        released = await daemon.engine.release(aws_cni(MIGRATED))
        assert [r.addresses for r in released] == [(a0,)]
        assert a0 in state.cooldowns()
        assert daemon.keeper is not None
        daemon.keeper.write_now()
        node.check(daemon)
    finally:
        await daemon.close()


async def test_the_rollback_file_keeps_the_migrated_key_and_exact_timestamp(
    node: AwsNodeLeft,
) -> None:
    a0 = node.addresses[0][0]
    edge = 2**63 - 1
    node.write_bytes(render(SHAPES[-1], [Pod(MIGRATED, a0, "kube-system", "dns", edge, True)]))
    node.runtime.start(MIGRATED)
    daemon = await node.daemon()
    try:
        await daemon.start()
        assert daemon.keeper is not None
        daemon.keeper.write_now()
    finally:
        await daemon.close()
    raw = node.file.read()
    assert raw is not None
    (kept,) = parse(raw).entries
    assert kept.key == AllocationKey(BACKFILL_NETWORK, MIGRATED, BACKFILL_IFNAME)
    assert kept.stamp_ns == edge, "int64's maximum comes back exactly"


async def test_entries_not_adopted_hold_their_addresses_until_their_pods_are_gone(
    node: AwsNodeLeft,
) -> None:
    a0, a1, a2, a3 = node.addresses[0]
    node.write(
        [
            entry("twice", a1, "t", at_s=1_700_000_000),  # the older address of one attachment
            entry("twice", a3, "t", at_s=1_700_000_900),
            entry("bad/id", a2, "x"),  # no container ID ipamd accepts
            entry("fine", a0, "z"),
        ]
    )
    for cid in ("twice", "fine"):
        node.runtime.start(cid)
    daemon = await node.daemon()
    try:
        await daemon.start()
        state = daemon.engine.state
        assert {k.container_id for k in state.allocations()} == {"twice", "fine"}
        assert state.is_held(a1) and state.is_held(a2)
        assert {k.container_id for k in state.quarantine()} == {"twice", "?"}
        unit = state.units()[f"{a1}/32"]
        assert state.address_state(a1, unit, node.clock.now(), COOLDOWN_S) is AddressState.HELD

        got = await _drain(node, daemon, 100)
        assert a1 not in got and a2 not in got, "an address a live entry names was handed out"

        # The bad entry's sandbox can be no running one: two listings past grace free it, to cool.
        node.clock.advance(GRACE_S)
        await daemon.leak_gc.run_once()
        await daemon.leak_gc.run_once()
        assert not state.is_held(a2) and state.is_held(a1)
        assert a2 in state.cooldowns()
        # The live attachment's DEL frees both its addresses.
        await daemon.engine.release(aws_cni("twice"))
        assert not state.is_held(a1) and not state.quarantine()
        node.check(daemon)
    finally:
        await daemon.close()


nested = st.tuples(
    st.sampled_from([b"[", b'{"version":"vpc-cni-ipam/1","allocations":[', b'{"a":']),
    st.integers(1, 50_000),
).map(lambda t: t[0] * t[1])
garbage = st.binary(max_size=300) | nested
entries = st.lists(
    st.fixed_dictionaries(
        {
            "networkName": st.sampled_from(["aws-cni", BACKFILL_NETWORK, "", "a b"]),
            "containerID": st.sampled_from(["live1", "live2", "dead", "../x", ""]),
            "ifName": st.sampled_from(["eth0", BACKFILL_IFNAME, "a/b"]),
            "ipv4": st.sampled_from(["SLOT0", "SLOT1", "SLOT2", "SLOT5", "10.99.0.1", "x"]),
            "allocationTimestamp": st.integers(-(2**64), 2**64) | st.floats(allow_nan=False),
        }
    ),
    max_size=8,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
async def test_any_file_the_daemon_starts_serves_and_keeps_named_addresses(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    node = AwsNodeLeft(tmp_path_factory.mktemp("node"))
    await node.assign()
    on_node = [*node.addresses[0], *node.addresses[1]]
    items = data.draw(entries)
    raw = data.draw(garbage | st.just(b""))
    if items:
        import json

        doc = json.dumps({"version": "vpc-cni-ipam/1", "allocations": items})
        for slot in range(len(on_node)):
            doc = doc.replace(f"SLOT{slot}", on_node[slot])
        raw = doc.encode()
    node.write_bytes(raw)
    for cid in ("live1", "live2"):
        node.runtime.start(cid)
    daemon = await node.daemon()
    try:
        await daemon.start()
        assert daemon.ready
        try:
            checkpoint = parse(raw)
            named = {e.address for e in checkpoint.entries}
            named |= {s.address for s in checkpoint.skipped if s.address}
        except ValueError:
            named = set()
        got = await _drain(node, daemon, 20)
        assert not named & set(got), "an address an entry names was handed out"
        node.check(daemon)
    finally:
        await daemon.close()
