"""VPC CNI's checkpoint format: what aws-node writes parses, anything else is refused or skipped
with a reason, and what ipamd writes is what aws-node reads back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from datastore.records import AllocationKey, AllocationRecord
from ipamd.awsnode.checkpoint import (
    BACKFILL_IFNAME,
    BACKFILL_NETWORK,
    FORMAT_VERSION,
    UNREADABLE,
    CheckpointError,
    CheckpointFile,
    parse,
    render,
)
from tests.support import go_json
from tests.support.vpc_cni_checkpoints import PR_1958_FILE, SHAPES, Pod, Shape
from tests.support.vpc_cni_checkpoints import render as render_shape

WEB_0: dict[str, object] = {
    "networkName": "aws-cni",
    "containerID": "6f0d7e2b9a41",
    "ifName": "eth0",
    "ipv4": "10.0.1.23",
    "allocationTimestamp": 1764000000123456789,
    "metadata": {"k8sPodNamespace": "default", "k8sPodName": "web-0", "interfacesCount": 1},
}
AWS_NODE_FILE: dict[str, object] = {
    "version": "vpc-cni-ipam/1",
    "allocations": [
        WEB_0,
        {
            "networkName": "aws-cni",
            "containerID": "77aa",
            "ifName": "eth0",
            "ipv4": "10.0.2.9",
            "allocationTimestamp": 1764000001000000000,
        },
    ],
}


def test_aws_nodes_file_parses_into_entries_with_keys_and_pods() -> None:
    checkpoint = parse(json.dumps(AWS_NODE_FILE).encode())

    assert checkpoint.foreign and not checkpoint.skipped
    first, second = checkpoint.entries
    assert first.key == AllocationKey("aws-cni", "6f0d7e2b9a41", "eth0")
    assert (first.address, first.namespace, first.name) == ("10.0.1.23", "default", "web-0")
    assert first.allocated_at == pytest.approx(1764000000.123456789)
    assert (second.namespace, second.name) == ("", "")


def test_a_node_without_pods_is_null_allocations() -> None:
    assert parse(b'{"version":"vpc-cni-ipam/1","allocations":null}').entries == ()


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"{not json", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[]", "not a JSON object"),
        (b'{"version":"vpc-cni-ipam/2","allocations":[]}', "version"),
        (b'{"allocations":[]}', "version"),
        (b'{"version":"vpc-cni-ipam/1","allocations":{}}', "not a list"),
        (b"[" * 3000, "nested too deeply"),
        (b'{"version":"vpc-cni-ipam/1","allocations":[' + b"[" * 100_000, "nested too deeply"),
    ],
)
def test_a_file_that_is_not_the_format_is_refused_whole(raw: bytes, why: str) -> None:
    with pytest.raises(CheckpointError, match=why):
        parse(raw)


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ({"ipv4": ""}, "no ipv4 or ipv6 address"),
        ({"ipv6": "2600::x"}, "not an IPv6 address"),
        ({"ipv4": "10.0.1.300"}, "not an IPv4 address"),
        ({"containerID": "../etc"}, "containerID"),
        ({"ifName": "a/b"}, "ifName"),
        ({"networkName": 7}, "networkName"),
        ("just a string", "not an object"),
    ],
)
def test_an_entry_that_cannot_be_an_allocation_is_skipped_with_why(entry: object, why: str) -> None:
    good = WEB_0
    bad = {**good, **entry} if isinstance(entry, dict) else entry
    if isinstance(bad, dict) and "ipv6" in bad:
        bad.pop("ipv4")
    doc = {"version": FORMAT_VERSION, "allocations": [bad, good]}

    checkpoint = parse(json.dumps(doc).encode())

    assert [e.address for e in checkpoint.entries] == ["10.0.1.23"]
    assert len(checkpoint.skipped) == 1 and why in checkpoint.skipped[0].reason
    assert checkpoint.skipped[0].reason.startswith("allocations[0]")


def test_what_ipamd_writes_reads_back_as_vpc_cnis_format_marked_as_ipamds() -> None:
    record = AllocationRecord(
        AllocationKey("aws-cni", "abc", "eth0"),
        ("10.0.3.4",),
        ("10.0.3.4/32",),
        "eni-1",
        1764000000.5,
        pod_namespace="kube-system",
        pod_name="coredns-1",
    )

    raw = render([record])
    doc = json.loads(raw)
    back = parse(raw)

    assert doc["version"] == FORMAT_VERSION and doc["writer"] == "ipamd"
    item = doc["allocations"][0]
    assert item["allocationTimestamp"] == 1764000000500000000
    assert item["metadata"] == {
        "k8sPodNamespace": "kube-system",
        "k8sPodName": "coredns-1",
        "interfacesCount": 1,
    }
    assert not back.foreign
    assert [(e.key, e.address, e.name) for e in back.entries] == [
        (record.key, "10.0.3.4", "coredns-1")
    ]


def test_an_ipv6_pods_address_is_written_where_aws_node_in_ipv6_mode_reads_it() -> None:
    address = "2600:1f14:abc:d00:1234::1"
    record = AllocationRecord(
        AllocationKey("aws-cni", "v6", "eth0"),
        (address,),
        ("2600:1f14:abc:d00:1234::/80",),
        "eni-0",
        1764000000.0,
    )

    (item,) = json.loads(render([record]))["allocations"]

    assert item["ipv6"] == address and "ipv4" not in item


def test_an_ipv6_nodes_entry_carries_its_128_in_ipv6() -> None:
    entry = {**WEB_0, "ipv6": "2600:1f14:abc:d00:1234:0:0:5"}
    entry.pop("ipv4")

    (parsed,) = parse(
        json.dumps({"version": FORMAT_VERSION, "allocations": [entry]}).encode()
    ).entries

    assert parsed.address == "2600:1f14:abc:d00:1234::5", "in the one text ipamd writes"


def test_the_file_is_replaced_whole_and_an_absent_one_reads_as_none(tmp_path: Path) -> None:
    file = CheckpointFile(tmp_path / "aws-node" / "ipam.json")
    assert file.read() is None

    file.write(b"first")
    file.write(b"second")

    assert file.read() == b"second"
    assert sorted(p.name for p in file.path.parent.iterdir()) == ["ipam.json"], "no temp file left"


def test_an_unreadable_path_is_a_checkpoint_error(tmp_path: Path) -> None:
    (tmp_path / "ipam.json").mkdir()

    with pytest.raises(CheckpointError, match="cannot read"):
        CheckpointFile(tmp_path / "ipam.json").read()


@pytest.mark.parametrize("created_at", [0.0, 1.7e9, 9223372036.854775807, 1e12])
def test_every_written_timestamp_is_one_gos_int64_decodes(created_at: float) -> None:
    """aws-node decodes `allocationTimestamp` into an int64 and refuses the whole file when one is
    beyond it, restoring no pod on a rollback."""
    alloc = AllocationRecord(
        AllocationKey("aws-cni", "c" * 64, "eth0"),
        ("10.0.1.23",),
        ("10.0.1.23/32",),
        "eni-1",
        created_at,
    )
    (entry,) = json.loads(render([alloc]))["allocations"]
    stamp = entry["allocationTimestamp"]
    assert isinstance(stamp, int) and 0 <= stamp <= 2**63 - 1


def test_pods_aws_node_found_through_cri_keep_its_backfill_key() -> None:
    """The file of aws/amazon-vpc-cni-k8s PR #1958: entries keyed `_migrated-from-cri`/`unknown`,
    a network name no CNI config could carry, are still the pods' allocations."""
    checkpoint = parse(PR_1958_FILE)

    assert not checkpoint.skipped
    first, second = checkpoint.entries
    assert first.key == AllocationKey(
        BACKFILL_NETWORK,
        "75ebe0da8b3f1e5ee3faab89e538fb32af7c038fd0cd0ebf39dee8e459d1788e",
        BACKFILL_IFNAME,
    )
    assert (first.address, first.stamp_ns) == ("192.168.12.15", 1647904840550836685)
    assert (second.namespace, second.name) == (
        "kube-system",
        "aws-load-balancer-controller-588487d8fc-fcn4m",
    )


def test_the_backfill_network_with_another_ifname_is_no_backfill_key() -> None:
    item = {**WEB_0, "networkName": BACKFILL_NETWORK}
    checkpoint = parse(json.dumps({"version": FORMAT_VERSION, "allocations": [item]}).encode())

    (skipped,) = checkpoint.skipped
    assert "networkName" in skipped.reason
    assert skipped.address == "10.0.1.23"
    assert skipped.key == AllocationKey(BACKFILL_NETWORK, "6f0d7e2b9a41", "eth0")


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.tag)
def test_every_shape_vpc_cni_has_written_parses(shape: Shape) -> None:
    pods = [
        Pod("a" * 64, "10.0.1.23", "default", "web-0", 1_647_904_840_550_836_685),
        Pod("b" * 64, "10.0.1.24", "kube-system", "coredns", 1_647_904_840_496_172_364, True),
    ]
    checkpoint = parse(render_shape(shape, pods))

    assert not checkpoint.skipped and checkpoint.foreign
    web, dns = checkpoint.entries
    assert web.key == AllocationKey("aws-cni", "a" * 64, "eth0")
    assert dns.key == AllocationKey(BACKFILL_NETWORK, "b" * 64, BACKFILL_IFNAME)
    if shape.stamp_and_metadata:
        assert (web.stamp_ns, web.namespace, web.name) == (pods[0].stamp_ns, "default", "web-0")
    else:
        assert (web.stamp_ns, web.name) == (None, "")
    assert parse(render_shape(shape, [])).entries == ()


def test_names_match_as_gos_decoder_matches_them() -> None:
    """Go's decoder matches member names case-insensitively and the last match wins."""
    item = {"NetworkName": "aws-cni", "CONTAINERID": "c1", "ifname": "eth0", "IPv4": "10.0.0.1"}
    raw = json.dumps({"Version": FORMAT_VERSION, "Allocations": [item]}).encode()
    (entry,) = parse(raw).entries
    assert entry.key == AllocationKey("aws-cni", "c1", "eth0") and entry.address == "10.0.0.1"

    twice = b'{"version":"vpc-cni-ipam/1","allocations":[{"networkName":"aws-cni",'
    twice += b'"containerID":"c1","ifName":"eth0","ipv4":"10.0.0.1","IPV4":"10.0.0.2"}]}'
    assert [e.address for e in parse(twice).entries] == ["10.0.0.2"]


@pytest.mark.parametrize(
    ("stamp", "kept"),
    [
        (2**63 - 1, 2**63 - 1),
        (-(2**63), -(2**63)),
        (0, 0),
        (2**63, None),
        (-(2**63) - 1, None),
        (1.5, None),
    ],
)
def test_a_timestamp_is_kept_exactly_when_go_reads_it_as_an_int64(
    stamp: float, kept: int | None
) -> None:
    raw = json.dumps(
        {"version": FORMAT_VERSION, "allocations": [{**WEB_0, "allocationTimestamp": stamp}]}
    )
    (entry,) = parse(raw.encode()).entries
    assert entry.stamp_ns == kept


@pytest.mark.parametrize("raw", [b"NaN", b'{"version":"vpc-cni-ipam/1","allocations":[Infinity]}'])
def test_what_go_does_not_call_json_is_refused(raw: bytes) -> None:
    with pytest.raises(CheckpointError, match="not JSON"):
        parse(raw)


def test_a_refused_entry_keeps_what_of_it_can_be_read() -> None:
    items = [{**WEB_0, "containerID": "../etc"}, {"ifName": 3, "ipv4": "10.0.1.9"}, 7]
    checkpoint = parse(json.dumps({"version": FORMAT_VERSION, "allocations": items}).encode())

    first, second, third = checkpoint.skipped
    assert first.key == AllocationKey("aws-cni", UNREADABLE, "eth0")
    assert first.address == "10.0.1.23"
    assert second.key == AllocationKey(UNREADABLE, UNREADABLE, UNREADABLE)
    assert second.address == "10.0.1.9"
    assert third.address is None


@pytest.mark.parametrize("stamp", [2**63 - 1, -(2**63), 0, 1, 1647904840550836685])
def test_an_adopted_pods_timestamp_goes_back_to_the_file_exactly(stamp: int) -> None:
    alloc = AllocationRecord(
        AllocationKey("aws-cni", "c" * 64, "eth0"),
        ("10.0.1.23",),
        ("10.0.1.23/32",),
        "eni-1",
        1.7e9,
        stamp_ns=stamp,
    )
    raw = render([alloc])

    (entry,) = parse(raw).entries
    assert entry.stamp_ns == stamp
    (decoded,) = go_json.decode(raw).allocations
    assert decoded.allocation_timestamp == stamp
