"""A node as aws-node leaves it, for takeover scenarios: addresses assigned in EC2 on the primary ENI
and on a secondary ENI, aws-node's checkpoint naming the pods that hold some of them, and the
runtime's pods."""

from __future__ import annotations

import json
from pathlib import Path

from cloud.fakes import FakeEc2
from datastore.records import AllocationKey
from datastore.store import STATE_FILE_NAME
from ipamd.awsnode.checkpoint import CheckpointFile
from ipamd.clock import FakeClock
from ipamd.config.settings import Config
from ipamd.engine.invariants import check_invariants
from ipamd.node.daemon import Daemon
from ipamd.runtime.fake import FakeRuntime
from tests.support.daemons import fake_daemon

COOLDOWN_S = 30
GRACE_S = 60


def aws_cni(container_id: str) -> AllocationKey:
    return AllocationKey("aws-cni", container_id, "eth0")


def entry(
    container_id: str, address: str, name: str, at_s: float = 1_700_000_000.0
) -> dict[str, object]:
    return {
        "networkName": "aws-cni",
        "containerID": container_id,
        "ifName": "eth0",
        "ipv4": address,
        "allocationTimestamp": int(at_s * 1e9),
        "metadata": {"k8sPodNamespace": "default", "k8sPodName": name, "interfacesCount": 1},
    }


class AwsNodeLeft:
    """A node aws-node ran: its ENIs' addresses in EC2, its checkpoint, the runtime's pods."""

    def __init__(self, tmp_path: Path) -> None:
        self.clock = FakeClock(1_800_000_000.0)
        self.ec2 = FakeEc2(self.clock)
        self.runtime = FakeRuntime(self.clock)
        self.file = CheckpointFile(tmp_path / "aws-node" / "ipam.json")
        self.config = Config.from_env(
            {
                "IPAMD_STATE_DIR": str(tmp_path / "state"),
                "IP_COOLDOWN_PERIOD": str(COOLDOWN_S),
                "IPAMD_LEAK_GRACE": str(GRACE_S),
            }
        )
        self.addresses: dict[int, list[str]] = {}

    async def assign(self) -> None:
        primary = next(iter(self.ec2.enis))
        secondary = await self.ec2.create_eni(
            self.ec2.subnet_id, ["sg-0fake"], "aws-K8S-i-0fake0000000001", {}
        )
        await self.ec2.attach_eni(secondary.eni_id, self.ec2.instance_id, 1)
        for index, eni_id in enumerate((primary, secondary.eni_id)):
            cidrs = await self.ec2.assign_units(eni_id, "ip", 4)
            self.addresses[index] = [c.removesuffix("/32") for c in cidrs]

    def write(self, entries: list[dict[str, object]], **extra: object) -> None:
        doc = {"version": "vpc-cni-ipam/1", "allocations": entries, **extra}
        self.write_bytes(json.dumps(doc).encode())

    def write_bytes(self, raw: bytes) -> None:
        self.file.path.parent.mkdir(parents=True, exist_ok=True)
        self.file.path.write_bytes(raw)

    async def daemon(self) -> Daemon:
        return await fake_daemon(
            self.config, self.ec2, self.clock, runtime=self.runtime, checkpoint=self.file
        )

    def check(self, daemon: Daemon) -> None:
        state_file = Path(self.config.storage.state_dir) / STATE_FILE_NAME
        check_invariants(daemon.engine, state_file, self.clock.now())
