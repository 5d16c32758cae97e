"""The parent's checks after each kill of the S8 crash scenario with the cloud in the loop: the state
file against the model of what was acknowledged, every owned address on its ENI per EC2, and S12's
settling of what a kill left `releasing`.

What each scenario replays, and which tests prove it: docs/failure-scenarios.md."""

from __future__ import annotations

from collections import Counter

from cloud.ec2 import Boto3Ec2
from ipamd.engine.engine import Engine
from ipamd.reconcile.ec2_drift import DriftReport
from tests.crash.test_s08_crash import (
    Disk,
    Model,
)


def promises_only(messages: list[str]) -> list[str]:
    return [m for m in messages if not m.startswith("trace\t")]


def check_disk(model: Model, disk: Disk, where: str) -> None:
    """The raw file against the acknowledged model: Model.check without its fixed inventory (here
    the inventory is EC2's, checked against EC2 after reopening)."""
    assert not disk.hollow, f"{where}: allocations without addresses: {disk.hollow}"
    assert not disk.orphans, f"{where}: addresses without allocation: {disk.orphans}"
    assert not disk.other_keys, f"{where}: allocations nobody made: {disk.other_keys}"
    assert disk.quarantined == 0, f"{where}: {disk.quarantined} quarantined allocations"
    for cid, held in model.alive.items():
        assert disk.allocations.get(cid) == held, (
            f"{where}: acknowledged ADD {cid} -> {held} lost; {disk.describe(cid)}"
        )
    for cid, first_del in model.deleted.items():
        on_disk = disk.intents.get(cid)
        assert cid not in disk.allocations and on_disk is not None, (
            f"{where}: acknowledged DEL {cid} lost; {disk.describe(cid)}"
        )
        assert first_del in (None, on_disk), (
            f"{where}: the delete intent of {cid} moved from {first_del} to {on_disk}"
        )
        model.deleted[cid] = on_disk
    unexplained = sorted(set(disk.allocations) - set(model.alive))
    assert not unexplained, f"{where}: allocations no acknowledged ADD explains: {unexplained}"
    unexplained = sorted(set(disk.intents) - set(model.deleted))
    assert not unexplained, f"{where}: intents no acknowledged DEL explains: {unexplained}"
    cooling = [a for held in disk.allocations.values() for a in held if a in disk.cooldowns]
    assert not cooling, f"{where}: owned addresses still cooling: {cooling}"


EC2View = dict[str, set[str]]
"""Attached ENI ID to its secondary IPs as /32 CIDRs, as DescribeNetworkInterfaces lists them."""


async def read_ec2(ec2: Boto3Ec2, instance_id: str, where: str) -> EC2View:
    enis = await ec2.describe_enis(instance_id)
    view = {e.eni_id: set(e.units("ip")) for e in enis if e.device_index is not None}
    twice = Counter(c for units in view.values() for c in units)
    assert [c for c, n in twice.items() if n > 1] == [], f"{where}: EC2 lists an address twice"
    return view


def check_owned_on_ec2(engine: Engine, model: Model, ec2: EC2View, where: str) -> None:
    """Every acknowledged ADD is owned with its addresses, each on the allocation's ENI per EC2."""
    state = engine.state
    in_memory = {k.container_id: a for k, a in state.allocations().items()}
    assert {c: a.addresses for c, a in in_memory.items()} == model.alive, (
        f"{where}: the engine's allocations differ from the acknowledged ADDs"
    )
    for cid, alloc in in_memory.items():
        for address, cidr in zip(alloc.addresses, alloc.unit_cidrs, strict=True):
            assert cidr in ec2.get(alloc.eni_id, set()), (
                f"{where}: {address} of acknowledged ADD {cid} is not on {alloc.eni_id} per EC2 "
                f"(EC2: {sorted(ec2.get(alloc.eni_id, set()))}; unit {state.unit(cidr)})"
            )


def check_s12(
    releasing: dict[str, str], ec2: EC2View, report: DriftReport, engine: Engine, where: str
) -> None:
    """Units the kill left `releasing`: EC2's listing settles each, nothing else does."""
    kept = {c for c, eni in releasing.items() if c in ec2.get(eni, set())}
    released = {c for c, eni in releasing.items() if eni in ec2 and c not in ec2[eni]}
    with_eni = set(releasing) - kept - released
    where = f"{where}: S12, units left releasing {sorted(releasing)}"
    assert set(report.settled_kept) == kept, f"{where}: EC2 still lists {kept}: {report}"
    assert set(report.settled_released) == released, f"{where}: EC2 dropped {released}: {report}"
    state = engine.state
    for cidr in kept:
        assert state.units()[cidr].state == "active", f"{where}: {cidr} not free again"
    for cidr in released | with_eni:
        assert cidr not in state.units(), f"{where}: {cidr} still in the inventory"


def ipamd_view(engine: Engine) -> EC2View:
    state = engine.state
    return {eni: set(state.units_on(eni)) for eni in state.enis()}
