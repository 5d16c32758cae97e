"""The world process of the emulated VPC: `python -m bench.vpc.world <config.json>`, started by the
node (`bench.vpc.node`) under `nsenter --net=/run/netns/<node>` so that its loopback servers live
where ipamd runs.

It owns, until SIGTERM (or SIGINT):
- EC2: moto with the project's extension as a loopback server (`EmbeddedEc2("server")`), holding one
  world: an m5.large in us-west-2 on subnet 10.0.1.0/24 of VPC 10.0.0.0/16;
- IMDS: the simulator (`ImdsSimulator`), serving that instance from moto's live state;
- the hypervisor and the VPC fabric (`fabric.Fabric`): the static topology once, then every
  `poll_interval_s` the ENIs EC2 shows on the instance (read under moto's LOCK), which the fabric
  follows: a link pair per attached ENI, the source/destination check, the delivery of addresses.

Once EC2, IMDS and the topology are up it writes the ready file (`ready.Ready`, JSON, atomically):
`ec2_url`, `imds_url`, `region`, `instance_id`, `primary_eni_id`, `primary_mac`, `primary_ip`,
`subnet_cidr`, `vpc_cidr`, `gateway`; with IPv6 also `vpc_ipv6_cidr`, `subnet_ipv6_cidr` and
`vpc_host_ipv6`.

Config (JSON): `namespaces` (`node`, `vpc`, `vpchost`, `inet`: names the node created), `ready_file`,
and optionally `attach_delay_s` (default 0.5), `poll_interval_s` (default 0.1) and `ipv6` (default
false: true makes the VPC dual-stack, `Layout(ipv6=True)`, with `fabric_ipv6.DualStackFabric`).

It refuses to run anywhere but in the node's namespace: its servers must be reachable by ipamd, and
a mistake must never let it build the topology in the machine's own namespace. Namespaces are the
node's to delete; whatever this process made in them goes with them.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.vpc.fabric import (
    GATEWAY,
    INSTANCE_TYPE,
    REGION,
    SUBNET_CIDR,
    Eni,
    Fabric,
    Namespaces,
    ip,
    netns_path,
    prefix_addresses,
)
from bench.vpc.fabric_ipv6 import DualStackFabric, Ipv6Vpc
from bench.vpc.ready import Ready
from cloud.embedded.eni_rules import LOCK
from cloud.embedded.imds_sim import ImdsSimulator
from cloud.embedded.ipv6_rules import eni_ipv6_prefixes
from cloud.embedded.world import EmbeddedEc2, World
from cloud.embedded.world_layout import Layout

logger = logging.getLogger("bench.vpc.world")


def read_enis(world: World) -> list[Eni]:
    """The instance's ENIs as EC2 has them now, by device index."""
    with LOCK:  # moto is changed from its server's threads: read one consistent state
        instance: Any = world.backend().get_instance(world.instance_id)
        enis = []
        for index, nic in sorted(instance.nics.items()):
            addresses = {str(e["PrivateIpAddress"]) for e in nic.private_ip_addresses}
            addresses.add(str(nic.private_ip_address))
            for prefix in nic.ipv4_prefixes:
                addresses |= prefix_addresses(str(prefix["Ipv4Prefix"]))
            ipv6 = {f"{a}/128" for a in nic.ipv6_addresses or ()}
            ipv6 |= {str(p) for p in eni_ipv6_prefixes(nic)}
            enis.append(
                Eni(
                    eni_id=str(nic.id),
                    device_index=int(index),
                    mac=str(nic.mac_address).lower(),
                    primary_ip=str(nic.private_ip_address),
                    addresses=frozenset(addresses),
                    ipv6=frozenset(ipv6),
                )
            )
        return enis


def ipv6_blocks(world: World) -> Ipv6Vpc:
    """The VPC's IPv6 /56 and the node subnet's /64, as DescribeVpcs and DescribeSubnets list them."""
    ec2 = world.client()
    vpc = ec2.describe_vpcs(VpcIds=[world.vpc_id])["Vpcs"][0]
    subnet = ec2.describe_subnets(SubnetIds=[world.subnet_id])["Subnets"][0]
    return Ipv6Vpc(
        vpc_cidr=str(vpc["Ipv6CidrBlockAssociationSet"][0]["Ipv6CidrBlock"]),
        subnet_cidr=str(subnet["Ipv6CidrBlockAssociationSet"][0]["Ipv6CidrBlock"]),
    )


def _poll(world: World, fabric: Fabric, stop: threading.Event, interval_s: float) -> None:
    failing = ""
    while not stop.wait(interval_s):
        try:
            fabric.step(read_enis(world))
            failing = ""
        except Exception as err:  # the next poll retries; the log says what kept failing
            if str(err) != failing:
                logger.exception("fabric step failed")
                failing = str(err)


def _in_namespace(path: str) -> bool:
    mine, theirs = os.stat("/proc/self/ns/net"), os.stat(path)
    return (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino)


async def serve(config: dict[str, Any]) -> None:
    ns = Namespaces.from_json(config["namespaces"])
    interval_s = float(config.get("poll_interval_s", 0.1))
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    ip(ns.node, "link", "set", "lo", "up")  # a new namespace's loopback is down: no servers yet
    host = EmbeddedEc2("server").start()
    try:
        ipv6 = bool(config.get("ipv6", False))
        world = host.world(
            INSTANCE_TYPE, region=REGION, subnet_cidr=SUBNET_CIDR, layout=Layout(ipv6=ipv6)
        )
        assert world.endpoint_url is not None
        imds = ImdsSimulator(world)
        imds_url = await imds.start()
        try:
            primary = read_enis(world)[0]
            delay_s = float(config.get("attach_delay_s", 0.5))
            vpc6 = ipv6_blocks(world) if ipv6 else None
            fabric = (
                Fabric(ns, primary, attach_delay_s=delay_s)
                if vpc6 is None
                else DualStackFabric(ns, primary, attach_delay_s=delay_s, vpc6=vpc6)
            )
            await asyncio.to_thread(fabric.start)
            stop = threading.Event()
            poller = threading.Thread(
                target=_poll, args=(world, fabric, stop, interval_s), name="fabric", daemon=True
            )
            poller.start()
            subnet = ipaddress.IPv4Network(world.subnet_cidr)
            Ready(
                ec2_url=world.endpoint_url,
                imds_url=imds_url,
                region=world.region,
                instance_id=world.instance_id,
                primary_eni_id=primary.eni_id,
                primary_mac=primary.mac,
                primary_ip=primary.primary_ip,
                subnet_cidr=str(subnet),
                vpc_cidr=str(subnet.supernet(new_prefix=16)),
                gateway=GATEWAY,
                **(
                    {}
                    if vpc6 is None
                    else {
                        "vpc_ipv6_cidr": vpc6.vpc_cidr,
                        "subnet_ipv6_cidr": vpc6.subnet_cidr,
                        "vpc_host_ipv6": vpc6.vpc_host,
                    }
                ),
            ).write(Path(config["ready_file"]))
            logger.info("ready: EC2 at %s, IMDS at %s", world.endpoint_url, imds_url)
            await stopping.wait()
            stop.set()
            await asyncio.to_thread(poller.join)
        finally:
            await imds.close()
    finally:
        host.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m bench.vpc.world <config.json>", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
    )
    config = json.loads(Path(args[0]).read_text())
    node = netns_path(config["namespaces"]["node"])
    if not _in_namespace(node):
        print(f"not in {node}: run under `nsenter --net={node}`", file=sys.stderr)
        return 2
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
