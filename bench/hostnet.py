"""What host networking costs: ADD with the pod's rules installed against ADD without, and the
reconcile of a node holding 250 pods, on the real netlink adapter.

Everything happens in a network namespace made for the run (`ip netns add`, deleted at the end),
whose "ENIs" are veth links carrying the ENIs' MACs (their peers stay in the namespace, up); the
machine's own namespace is never touched.
Two engines run side by side in the same process on the same kind of node (9 ENIs x 30 addresses),
one with host networking off and one on; their ADDs alternate, so both see the same machine at the
same moments, and the overhead is the difference of their medians. Between them, one netlink round
trip on the same adapter's socket in the same namespace (a rule of no pod's added, timed, and
deleted): `hostnet_add_overhead_over_netlink_floor` is the overhead over that round trip's median,
what the pod's rules cost in units of what this machine charges for the least netlink exchange
through pyroute2, so a slower machine cannot hide or fake a change in the ADD's own work. Its target,
3, follows from what an ADD sends: the pod's two rules (to the pod in main, from the pod in its ENI's
table), together, so two round trips if the kernel answered them one after the other; about 2 here
(0.8 ms over 0.4). Above 3 the ADD does a whole exchange more than its rules. Needs root (a
namespace and netlink writes); without root the family says so and prints nothing.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.node import pod_key, unit_cidrs
from bench.timing import p50, timed_ms
from datastore.records import EniRecord
from datastore.store import STATE_FILE_NAME
from ipamd.clock import FakeClock
from ipamd.config.groups import DatapathSettings
from ipamd.engine.allocator import EngineParams
from ipamd.engine.engine import Engine
from ipamd.hostnet.datapath import Datapath
from ipamd.hostnet.fake import FakeSnatTable
from ipamd.hostnet.netlink import NetlinkHostNetwork
from ipamd.hostnet.ports import Rule

PODS = 250
ENIS = 9
PER_ENI = 30
SUBNET = "10.0.0.0/16"
FLOOR_PRIORITY = 31000
FLOOR_TABLE = 250


def _mac(index: int) -> str:
    return f"02:00:00:be:00:{index:02x}"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


async def _node(path: Path, clock: FakeClock, with_macs: bool) -> Engine:
    engine = await Engine.open(path, clock, EngineParams())
    for index in range(ENIS):
        eni_id = f"eni-{index:04d}"
        facts = {"mac": _mac(index), "primary_ip": f"10.0.{index}.5"} if with_macs else {}
        await engine.add_eni(EniRecord(eni_id, index, "subnet-1", index == 0, clock.now(), **facts))
        await engine.add_units(eni_id, unit_cidrs(index, PER_ENI, "ip"), "ip")
    return engine


async def _subnet_cidr(subnet_id: str) -> str:
    return SUBNET


async def _vpc_cidrs(mac: str) -> tuple[str, ...]:
    return ("10.0.0.0/8",)


async def run(workdir: Path) -> dict[str, float]:
    if os.geteuid() != 0:
        print("bench: hostnet needs root (a network namespace); skipped", file=sys.stderr)
        return {}
    with _bench_netns() as netns:
        return await _measure(workdir, netns)


async def _round_trip(kernel: NetlinkHostNetwork, n: int) -> float:
    """One netlink request and its ack on the adapter's socket: a rule of no pod's (an address of
    TEST-NET-2, a table no ENI uses) added, timed, then deleted untimed."""
    rule = Rule(FLOOR_PRIORITY, FLOOR_TABLE, src=f"198.51.100.{n % 250}/32")
    ms, _ = await timed_ms(kernel.add_rules((rule,)))
    await kernel.delete_rules((rule,))
    return ms


@contextmanager
def _bench_netns() -> Iterator[str]:
    """A namespace with lo and one veth link per ENI (with its MAC); deleted afterwards."""
    netns = f"ipamd-bench-{os.getpid()}"
    _ip("netns", "add", netns)
    try:
        _ip("-n", netns, "link", "set", "lo", "up")
        for index in range(ENIS):
            name, peer = f"eth{index}", f"peer{index}"
            _ip(
                "-n",
                netns,
                "link",
                "add",
                name,
                "address",
                _mac(index),
                "type",
                "veth",
                "peer",
                "name",
                peer,
            )
            _ip("-n", netns, "link", "set", peer, "up")
        yield netns
    finally:
        subprocess.run(["ip", "netns", "delete", netns], check=False, capture_output=True)


async def _measure(workdir: Path, netns: str) -> dict[str, float]:
    clock = FakeClock()
    off = await _node(workdir / "off" / STATE_FILE_NAME, clock, with_macs=False)
    on = await _node(workdir / "on" / STATE_FILE_NAME, clock, with_macs=True)
    kernel = NetlinkHostNetwork(netns)
    await kernel.open()
    try:
        datapath = Datapath(
            on,
            kernel,
            FakeSnatTable(),
            DatapathSettings(),
            node_ip="10.0.0.5",
            subnet_cidr=_subnet_cidr,
            vpc_cidrs=_vpc_cidrs,
            clock=clock,
        )
        await datapath.reconcile()  # sets up the eight secondary ENIs' links and tables
        if on.blocked_enis:
            raise RuntimeError(f"ENIs not set up: {on.blocked_enis}")
        adds_off: list[float] = []
        adds_on: list[float] = []
        floor: list[float] = []
        for n in range(PODS):
            key = pod_key("hostnet", n)
            adds_off.append((await timed_ms(off.assign(key)))[0])
            adds_on.append((await timed_ms(datapath.add(key, None)))[0])
            floor.append(await _round_trip(kernel, n))
        rules = await kernel.list_rules()
        await kernel.delete_rules(rules)  # as after a reboot: nothing of ipamd's is left
        gc.collect()  # what the ADDs above left is not the reconcile's to collect
        restore_ms, _ = await timed_ms(datapath.reconcile())
        gc.collect()
        steady_ms, steady = await timed_ms(datapath.reconcile())
        if not steady.is_empty() or await kernel.list_rules() != rules:
            raise RuntimeError("reconcile did not restore exactly what was removed")
    finally:
        await kernel.close()
        await off.close()
        await on.close()
    overhead = p50(adds_on) - p50(adds_off)
    return {
        "hostnet_add_overhead_p50_ms": overhead,
        "hostnet_netlink_round_trip_p50_ms": p50(floor),
        "hostnet_add_overhead_over_netlink_floor": overhead / p50(floor),
        "hostnet_add_p50_ms": p50(adds_on),
        "hostnet_reconcile_ms_250_pods": restore_ms,
        "hostnet_reconcile_steady_ms_250_pods": steady_ms,
        "hostnet_rules_250_pods": float(len(rules)),
    }
