"""The embedded cloud's file round-trips: a world captured, written, read back and rebuilt on a wiped
moto is the same world — the same IDs, MACs, attachments, device indexes, addresses, prefixes, tags
and DeleteOnTermination, as DescribeNetworkInterfaces and DescribeInstances show them. The keeper
saves before a request is answered, and a save that fails turns the answer into InternalError."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest

from cloud.embedded import cloud_file
from cloud.embedded.cloud_file import CloudFacts, CloudFileError
from cloud.embedded.cloud_keeper import CloudKeeper, start_kept_world
from cloud.embedded.cloud_restore import capture, rebuild
from cloud.embedded.world import EmbeddedEc2, World
from datastore import atomic

REGION = "us-west-2"
_VOLATILE = {"AttachTime", "LaunchTime", "ReservationId", "UsageOperationUpdateTime", "ClientToken"}
"""What a rebuilt world has anew: times, the launch's reservation and token. (The root volume's ID
too, below: ipamd never reads volumes, and the file does not keep them.)"""


def _busy_world(host: EmbeddedEc2) -> World:
    """A world as ipamd leaves it: secondaries on the primary ENI, a tagged ENI with prefixes at
    device index 2 (index 1 free), DeleteOnTermination set on it, and a detached ENI."""
    world = host.world("m5.large", REGION, "10.0.0.0/20")
    ec2 = world.client()
    ec2.assign_private_ip_addresses(
        NetworkInterfaceId=world.primary_eni_id, SecondaryPrivateIpAddressCount=4
    )
    tags = [{"Key": "node.k8s.amazonaws.com/instance_id", "Value": world.instance_id}]
    eni = ec2.create_network_interface(
        SubnetId=world.subnet_id,
        Groups=[world.security_group_id],
        Description="aws-K8S-" + world.instance_id,
        TagSpecifications=[{"ResourceType": "network-interface", "Tags": tags}],
    )["NetworkInterface"]["NetworkInterfaceId"]
    ec2.assign_private_ip_addresses(NetworkInterfaceId=eni, Ipv4PrefixCount=2)
    ec2.assign_private_ip_addresses(NetworkInterfaceId=eni, SecondaryPrivateIpAddressCount=1)
    attachment = ec2.attach_network_interface(
        NetworkInterfaceId=eni, InstanceId=world.instance_id, DeviceIndex=2
    )["AttachmentId"]
    ec2.modify_network_interface_attribute(
        NetworkInterfaceId=eni,
        Attachment={"AttachmentId": attachment, "DeleteOnTermination": True},
    )
    ec2.create_network_interface(SubnetId=world.subnet_id, Groups=[world.security_group_id])
    ec2.create_tags(Resources=[world.instance_id], Tags=[{"Key": "Name", "Value": "node"}])
    return world


def _described(world: World) -> tuple[Any, Any]:
    ec2 = world.client()
    enis = ec2.describe_network_interfaces()["NetworkInterfaces"]
    instances = ec2.describe_instances(InstanceIds=[world.instance_id])["Reservations"]
    return _stable(enis), _stable([i for r in instances for i in r["Instances"]])


def _stable(value: Any) -> Any:
    """The answer without what EC2 sets anew (times, reservation), lists in a fixed order."""
    if isinstance(value, dict):
        return {
            k: _stable(v)
            for k, v in sorted(value.items())
            if k not in _VOLATILE and not (k == "VolumeId" and str(v).startswith("vol-"))
        }
    if isinstance(value, list):
        return sorted((_stable(v) for v in value), key=repr)
    return value


def test_a_world_survives_the_file_and_a_wiped_moto(embedded: EmbeddedEc2, tmp_path: Path) -> None:
    world = _busy_world(embedded)
    before = _described(world)
    facts = capture(world)
    path = tmp_path / "embedded-cloud.json"
    cloud_file.save(path, facts.to_json())
    read = cloud_file.load(path)
    assert read == facts

    assert read is not None
    embedded.wipe(REGION)
    assert world.client().describe_network_interfaces()["NetworkInterfaces"] == []
    rebuilt = rebuild(embedded, read)

    assert rebuilt == world
    assert capture(rebuilt) == facts
    assert _described(rebuilt) == before
    primary = next(e for e in facts.enis if e.eni_id == world.primary_eni_id)
    assert primary.attachment is not None and primary.attachment.delete_on_termination
    tagged = next(e for e in facts.enis if e.tags)
    assert tagged.attachment is not None and tagged.attachment.device_index == 2
    assert tagged.attachment.delete_on_termination and len(tagged.prefixes) == 2
    assert [e.attachment for e in facts.enis].count(None) == 1, "the detached ENI stays detached"


def test_a_rebuilt_world_keeps_the_extension_rules(embedded: EmbeddedEc2) -> None:
    """Rebuilt addresses are in use as any others: a new draw never hands one out again."""
    facts = capture(_busy_world(embedded))
    rebuilt = rebuild(embedded, facts)
    ec2 = rebuilt.client()
    taken = {a for e in facts.enis for a in (e.primary_ip, *e.secondary_ips)}
    drawn = ec2.assign_private_ip_addresses(
        NetworkInterfaceId=rebuilt.primary_eni_id, SecondaryPrivateIpAddressCount=3
    )["AssignedPrivateIpAddresses"]
    assert not {a["PrivateIpAddress"] for a in drawn} & taken


def test_the_file_is_written_atomically_and_private(tmp_path: Path) -> None:
    path = tmp_path / "embedded-cloud.json"
    cloud_file.save(path, "one\n")
    cloud_file.save(path, "two\n")
    assert path.read_text() == "two\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == [path.name], "no temporary file is left"
    with pytest.raises(CloudFileError, match="cannot write"):
        cloud_file.save(tmp_path / "missing" / "embedded-cloud.json", "x")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{not json", "unreadable"),
        ("[]", "unreadable"),
        ('{"format": 99}', "format 99"),
        ('{"format": 1, "region": "us-west-2"}', "unreadable"),
    ],
)
def test_a_file_that_makes_no_sense_is_refused(tmp_path: Path, text: str, reason: str) -> None:
    path = tmp_path / "embedded-cloud.json"
    path.write_text(text)
    with pytest.raises(CloudFileError, match=reason) as caught:
        cloud_file.load(path)
    assert str(path) in str(caught.value)


def test_no_file_is_a_new_node(tmp_path: Path) -> None:
    assert cloud_file.load(tmp_path / "embedded-cloud.json") is None


def test_a_record_without_its_primary_eni_is_refused(embedded: EmbeddedEc2, tmp_path: Path) -> None:
    facts = capture(embedded.world("m5.large", REGION))
    body = json.loads(facts.to_json())
    body["primary_eni_id"] = "eni-00000000000000000"
    with pytest.raises(CloudFileError, match="primary ENI"):
        CloudFacts.from_json(json.dumps(body), tmp_path / "f")
    body = json.loads(facts.to_json())
    body["enis"].append(body["enis"][0])
    with pytest.raises(CloudFileError, match="listed twice"):
        CloudFacts.from_json(json.dumps(body), tmp_path / "f")


def _answer(keeper: CloudKeeper, app: Any) -> tuple[str, bytes]:
    seen: list[str] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        seen.append(status)
        return lambda data: None

    body = b"".join(keeper.wrap(app)({}, start_response))
    return seen[0], body


def test_the_keeper_saves_a_change_before_the_answer_leaves(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    world = embedded.world("m5.large", REGION)
    keeper = CloudKeeper(tmp_path / "embedded-cloud.json")
    keeper.watch(world)
    assert keeper.saves == 1

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        # As moto's app does: the change is made, then the answer is started.
        world.client().assign_private_ip_addresses(
            NetworkInterfaceId=world.primary_eni_id, SecondaryPrivateIpAddressCount=2
        )
        start_response("200 OK", [])
        return [b"<ok/>"]

    def unchanged(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("200 OK", [])
        return [b"<ok/>"]

    seen: list[CloudFacts | None] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        seen.append(cloud_file.load(keeper.path))  # what a kill at this instant would leave
        return lambda data: None

    assert b"".join(keeper.wrap(app)({}, start_response)) == b"<ok/>"
    saved = seen[0]
    assert saved is not None
    assert len(saved.enis[0].secondary_ips) == 2, "the file had the change when the answer went"
    assert keeper.saves == 2
    assert _answer(keeper, unchanged) == ("200 OK", b"<ok/>")
    assert keeper.saves == 2, "a request that changed nothing writes nothing"


def test_a_failed_save_answers_internal_error(embedded: EmbeddedEc2, tmp_path: Path) -> None:
    world = embedded.world("m5.large", REGION)
    keeper = CloudKeeper(tmp_path / "gone" / "embedded-cloud.json")
    with pytest.raises(CloudFileError):
        keeper.watch(world)

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("200 OK", [])
        return [b"<ok/>"]

    status, body = _answer(keeper, app)
    assert status.startswith("500") and b"<Code>InternalError</Code>" in body
    (tmp_path / "gone").mkdir()
    assert _answer(keeper, app) == ("200 OK", b"<ok/>"), "answers again once a save succeeds"
    assert cloud_file.load(keeper.path) == capture(world)


def test_a_kept_world_is_the_same_node_on_the_next_start(tmp_path: Path) -> None:
    path = tmp_path / "embedded-cloud.json"
    first = start_kept_world(path, "m5.large", REGION)
    try:
        assert not first.restored and path.exists()
        ec2 = first.world.client()
        ec2.assign_private_ip_addresses(
            NetworkInterfaceId=first.world.primary_eni_id, SecondaryPrivateIpAddressCount=2
        )
        facts = capture(first.world)
    finally:
        first.close()
    assert cloud_file.load(path) == facts, "saved before the answer, and again on close"

    second = start_kept_world(path, "c5.xlarge", REGION)
    try:
        assert second.restored
        assert second.world.instance_id == first.world.instance_id
        assert capture(second.world) == facts
        assert [n.split()[0] for n in second.notes] == ["IPAMD_EMBEDDED_INSTANCE_TYPE"]
    finally:
        second.close()


def test_a_stopped_keeper_refuses_what_it_could_no_longer_save(
    embedded: EmbeddedEc2, tmp_path: Path
) -> None:
    world = embedded.world("m5.large", REGION)
    keeper = CloudKeeper(tmp_path / "embedded-cloud.json")
    keeper.watch(world)
    (tmp_path / ".embedded-cloud.json.4242.tmp").write_text("cut short by a kill")
    atomic.remove_leftovers(keeper.path)
    assert [p.name for p in tmp_path.iterdir()] == ["embedded-cloud.json"]
    keeper.stop()
    reached: list[bool] = []

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        reached.append(True)
        start_response("200 OK", [])
        return [b"<ok/>"]

    status, body = _answer(keeper, app)
    assert status.startswith("500") and b"InternalError" in body and reached == []
