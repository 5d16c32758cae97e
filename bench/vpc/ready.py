"""The world process's ready file: what the emulated VPC's world says of itself once EC2, IMDS and
the topology are up, written by `bench.vpc.world` and read by `bench.vpc.node`, in one shape."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Ready:
    """The world process's ready file."""

    ec2_url: str
    imds_url: str
    region: str
    instance_id: str
    primary_eni_id: str
    primary_mac: str
    primary_ip: str
    subnet_cidr: str
    vpc_cidr: str
    gateway: str
    vpc_ipv6_cidr: str = ""
    """The VPC's IPv6 /56; "" in a world without IPv6 (and so the two below)."""
    subnet_ipv6_cidr: str = ""
    vpc_host_ipv6: str = ""

    @classmethod
    def read(cls, path: Path) -> Ready:
        return cls(**json.loads(path.read_text()))

    def write(self, path: Path) -> None:
        """Atomically: the node never reads half a file."""
        staged = path.with_name(f".{path.name}.tmp")
        staged.write_text(json.dumps(dataclasses.asdict(self), indent=2) + "\n")
        os.replace(staged, path)
