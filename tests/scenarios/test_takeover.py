"""Taking a node over from aws-node: the pods its checkpoint records keep their addresses and keys,
the ones gone are released through the usual grace, and nothing owned is ever handed out again.

The node is prepared as aws-node leaves it: addresses assigned in EC2 on the primary ENI and on a
secondary ENI, and aws-node's checkpoint naming the pods that hold some of them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from datastore.records import AllocationKey
from ipamd.awsnode.checkpoint import parse
from ipamd.awsnode.takeover import plan_adoption
from ipamd.errors import NoAddressAvailable
from ipamd.model import PodRef
from tests.support.aws_node_left import COOLDOWN_S, GRACE_S, AwsNodeLeft, aws_cni, entry


@pytest.fixture
async def node(tmp_path: Path) -> AwsNodeLeft:
    node = AwsNodeLeft(tmp_path)
    await node.assign()
    return node


async def test_every_pod_of_the_checkpoint_keeps_its_key_and_address(node: AwsNodeLeft) -> None:
    (a0, a1, *_), (b0, *_) = node.addresses[0], node.addresses[1]
    node.write([entry("c1", a0, "web-0"), entry("c2", a1, "web-1"), entry("c3", b0, "db-0")])
    for cid in ("c1", "c2", "c3"):
        node.runtime.start(cid)
    daemon = await node.daemon()
    try:
        await daemon.start()

        assert daemon.ready
        owned = {k: (a.addresses, a.pod_name) for k, a in daemon.engine.state.allocations().items()}
        assert owned == {
            aws_cni("c1"): ((a0,), "web-0"),
            aws_cni("c2"): ((a1,), "web-1"),
            aws_cni("c3"): ((b0,), "db-0"),
        }
        node.check(daemon)
    finally:
        await daemon.close()


async def test_free_addresses_of_adopting_enis_cool_and_new_pods_wait_for_them(
    node: AwsNodeLeft,
) -> None:
    """The checkpoint records no release times: an address aws-node freed a moment ago cools
    before it goes to a new pod."""
    a0, *rest = node.addresses[0]
    node.write([entry("c1", a0, "web-0")])
    node.runtime.start("c1")
    daemon = await node.daemon()
    try:
        await daemon.start()
        cooling = set(daemon.engine.state.cooldowns())
        assert set(rest) <= cooling, "every free address of the adopting ENI cools"
        assert not cooling & set(node.addresses[1]), "an ENI without adopted pods does not"

        engine = daemon.engine
        for b in node.addresses[1]:  # fill the other ENI: only cooling addresses are left
            await engine.assign(aws_cni(f"new-{b}"), PodRef("default", b, ""))
        with pytest.raises(NoAddressAvailable):
            await engine.assign(aws_cni("new-late"), PodRef("default", "late", ""))
        node.clock.advance(COOLDOWN_S)
        late = await engine.assign(aws_cni("new-late"), PodRef("default", "late", ""))
        assert late.addresses[0] in rest
        node.check(daemon)
    finally:
        await daemon.close()


async def test_a_pod_gone_is_released_through_the_leak_grace_and_an_adopted_del_works(
    node: AwsNodeLeft,
) -> None:
    a0, a1, *_ = node.addresses[0]
    node.write([entry("live", a0, "web-0"), entry("gone", a1, "web-1")])
    node.runtime.start("live")
    daemon = await node.daemon()
    try:
        await daemon.start()
        assert aws_cni("gone") in daemon.engine.state.allocations(), "adopted, not judged yet"

        node.clock.advance(GRACE_S)
        assert await daemon.leak_gc.run_once() == (), "one listing without it proves nothing"
        assert await daemon.leak_gc.run_once() == ("gone",)

        assert aws_cni("gone") not in daemon.engine.state.allocations()
        assert "gone" in daemon.engine.state.intents(), "released as a DEL would be"
        assert a1 in daemon.engine.state.cooldowns()
        released = await daemon.engine.release(aws_cni("live"))
        assert [r.addresses for r in released] == [(a0,)], "the runtime's DEL finds the pod"
        node.check(daemon)
    finally:
        await daemon.close()


async def test_ipamd_keeps_the_file_and_a_restart_on_its_own_file_adopts_nothing_again(
    node: AwsNodeLeft,
) -> None:
    a0, a1, *_ = node.addresses[0]
    node.write([entry("c1", a0, "web-0"), entry("c2", a1, "web-1")])
    node.runtime.start("c1")
    node.runtime.start("c2")
    daemon = await node.daemon()
    try:
        await daemon.start()
        assert daemon.keeper is not None
        daemon.keeper.write_now()
        await daemon.engine.release(aws_cni("c2"))
        daemon.keeper.write_now()
    finally:
        await daemon.close()
    raw = node.file.read()
    assert raw is not None
    kept = parse(raw)
    assert not kept.foreign
    assert [(e.key, e.address) for e in kept.entries] == [(aws_cni("c1"), a0)]

    node.clock.advance(2 * COOLDOWN_S)
    again = await node.daemon()
    try:
        await again.start()
        assert again.takeover is not None
        assert await again.takeover.run() is None, "ipamd's own file is not taken over"
        assert set(again.engine.state.allocations()) == {aws_cni("c1")}
    finally:
        await again.close()


@pytest.mark.parametrize(
    "raw",
    [b"{broken", b'{"version":"vpc-cni-ipam/9","allocations":[]}', b"[1, 2]", b""],
)
async def test_a_malformed_or_foreign_checkpoint_is_logged_and_ignored(
    node: AwsNodeLeft, raw: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    node.file.path.parent.mkdir(parents=True, exist_ok=True)
    node.file.path.write_bytes(raw)
    daemon = await node.daemon()
    try:
        await daemon.start()

        assert daemon.ready
        assert not daemon.engine.state.allocations()
        assert "takeover.checkpoint_ignored" in caplog.text
        assert str(node.file.path) in caplog.text
    finally:
        await daemon.close()


async def test_entries_that_cannot_be_backed_are_refused_and_nothing_is_owned_twice(
    node: AwsNodeLeft,
) -> None:
    a0, a1, a2, a3 = node.addresses[0]
    node.write(
        [
            entry("twice", a1, "t", at_s=1_700_000_000),  # one attachment, two addresses
            entry("twice", a3, "t", at_s=1_700_000_900),  # the newer wins
            entry("old", a0, "web-0", at_s=1_700_000_000),
            entry("new", a0, "web-0b", at_s=1_700_000_500),  # a duplicate: the newer wins
            entry("elsewhere", "10.99.0.5", "x"),  # on no ENI of this node per EC2
            entry("v6", a1, "y") | {"ipv4": "", "ipv6": "2600::1"},
            entry("fine", a2, "z"),
        ]
    )
    daemon = await node.daemon()
    try:
        await daemon.start()

        owned = {k.container_id: a.addresses for k, a in daemon.engine.state.allocations().items()}
        assert owned == {"new": (a0,), "fine": (a2,), "twice": (a3,)}
        node.check(daemon)
    finally:
        await daemon.close()


async def test_a_live_entry_takes_an_address_from_ipamds_stale_claim_only_on_evidence(
    node: AwsNodeLeft,
) -> None:
    """A node rolled back to aws-node and forward again, on ipamd's old state: the checkpoint's pod
    replaces ipamd's claim only if the runtime runs it and not ipamd's."""
    daemon = await node.daemon()
    try:
        await daemon.start()
        before = await daemon.engine.assign(AllocationKey("aws-cni", "stale", "eth0"), None)
        address = before.addresses[0]
        doc = {"version": "vpc-cni-ipam/1", "allocations": [entry("fresh", address, "w")]}
        checkpoint = parse(json.dumps(doc).encode())
        state, now, ttl = daemon.engine.state, node.clock.now(), 600.0

        for live in (None, frozenset({"stale", "fresh"}), frozenset()):
            mutation, adoption = plan_adoption(state, checkpoint, live, now, ttl)
            assert not mutation.put_allocations and adoption.refused, live

        mutation, adoption = plan_adoption(state, checkpoint, frozenset({"fresh"}), now, ttl)
        assert adoption.replaced == (aws_cni("stale"),)
        assert [r.key for r in mutation.put_allocations] == [aws_cni("fresh")]
        assert mutation.delete_allocations == (aws_cni("stale"),)
    finally:
        await daemon.close()
