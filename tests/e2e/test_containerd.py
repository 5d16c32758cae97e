"""End to end (b): a real containerd with its CRI plugin puts pods on ipamd.

The test drives containerd over CRI v1 as the kubelet does (RunPodSandbox, PodSandboxStatus,
StopPodSandbox, RemovePodSandbox). containerd runs the conflist ipamd writes from the shipped one
(`ipamd-cni` as the interface plugin; its own loopback) from a test bin dir holding `loopback` and
`ipamd-cni`, and a pause image built here. ipamd runs embedded (addresses from the moto EC2 pool) with
`IPAMD_CRI_SOCKET` on this containerd and a runtime leak GC that acts within seconds.

One containerd and one ipamd serve the module; every test removes the pods it made. containerd runs
in a network namespace made for the module (the node's), so the host ends of the pods' veths and
their routes are made there, never in the machine's own namespace.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from bench.vpc.containerd import Containerd
from bench.vpc.pause.image import PAUSE_IMAGE
from bench.vpc.processes import (
    SYSTEM_CNI_DIR,
    Ipamd,
    add_netns,
    bare,
    delete_netns,
    make_workdir,
    plugin_dir,
    wait_until,
)
from ipamd.runtime._generated import cri_v1_pb2 as cri
from tests.e2e.conflist import NETWORK
from tests.e2e.support import netns_addresses, require, require_root

PODS = 20
POD_MTU = 1400
"""Not the ENI MTU's 9001 default: the pods' interfaces must take POD_MTU from the conflist ipamd
writes."""
LEAK_GRACE_S = 2
"""ipamd's leak grace: short, so that the GC acts within seconds, but longer than a RunPodSandbox, whose
allocation exists before the sandbox is listed."""

LEAKS_RELEASED = "ipamd_leaked_allocations_released_total"

pytestmark = pytest.mark.timeout(300)


@dataclass
class Node:
    containerd: Containerd
    ipamd: Ipamd

    def run_pod(self, name: str, deadline_s: float = 60.0) -> str:
        """RunPodSandbox, retried like the kubelet retries while ipamd answers "try again later"
        (CNI code 11: the warm pool is empty for a moment and is growing)."""
        client = self.containerd.client
        end = time.monotonic() + deadline_s
        while True:
            try:
                return client.run_sandbox("e2e", name, f"uid-{name}")
            except grpc.RpcError as err:
                if "try again later" not in str(err.details()) or time.monotonic() > end:
                    raise
                time.sleep(0.2)

    def remove_pod(self, sandbox_id: str) -> None:
        self.containerd.client.stop_sandbox(sandbox_id)
        self.containerd.client.remove_sandbox(sandbox_id)

    def allocation_items(self) -> dict[str, dict[str, object]]:
        """Sandbox ID → ipamd's allocation of its eth0 on the pod network."""
        items = self.ipamd.get("/v1/allocations")["allocations"]
        assert isinstance(items, list)
        return {
            item["container_id"]: item
            for item in items
            if item["network"] == NETWORK and item["ifname"] == "eth0"
        }

    def addresses(self) -> dict[str, str]:
        """Sandbox ID → the one address (no prefix) ipamd allocated to it."""
        held = {}
        for sandbox_id, item in self.allocation_items().items():
            ips = item["ips"]
            assert isinstance(ips, list) and len(ips) == 1, item
            held[sandbox_id] = bare(str(ips[0]["address"]))
        return held


DEPLOYED_CONFLIST = Path(__file__).resolve().parents[2] / "deploy" / "cni" / "10-ipamd.conflist"


def wait_for_file(path: Path, deadline_s: float = 30.0) -> None:
    """ipamd publishes the conflist right after it turns ready; poll the separate process's output."""
    end = time.monotonic() + deadline_s
    while not path.exists():
        assert time.monotonic() < end, f"{path} did not appear"
        time.sleep(0.05)


def link_mtu(netns: str, name: str) -> int:
    """The MTU of `name` in the namespace at `netns`, as the kernel reports it."""
    done = subprocess.run(
        ["nsenter", f"--net={netns}", "ip", "-j", "link", "show", name],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    (link,) = json.loads(done.stdout)
    return int(link["mtu"])


@pytest.fixture(scope="module")
def node(pause_image: Path) -> Iterator[Node]:
    require_root()
    require("containerd", "runc", "ctr", "ip", "nsenter", plugins=("loopback", "portmap"))
    workdir = make_workdir("containerd")
    containerd: Containerd | None = None
    ipamd: Ipamd | None = None
    # The node's network namespace: containerd runs in it, so ipamd-cni puts the host ends of the
    # pods' veths and their routes there, never in the machine's own namespace.
    host_ns = f"ipamd-e2e-containerd-node-{os.getpid()}"
    host_path = add_netns(host_ns)
    subprocess.run(["ip", "-n", host_ns, "link", "set", "lo", "up"], check=True, timeout=30)
    try:
        cni_bin = plugin_dir(
            workdir / "bin", SYSTEM_CNI_DIR / "loopback", SYSTEM_CNI_DIR / "portmap"
        )
        cni_conf = workdir / "net.d"
        cni_conf.mkdir()
        (workdir / "containerd").mkdir()
        containerd = Containerd.create(
            workdir / "containerd",
            cni_bin=cni_bin,
            cni_conf=cni_conf,
            sandbox_image=PAUSE_IMAGE,
            netns=host_path,
        )
        containerd.start()
        containerd.import_image(pause_image)
        ipamd = Ipamd.start(
            workdir,
            {
                "IPAMD_CRI_SOCKET": str(containerd.socket),
                "IPAMD_LEAK_GC_INTERVAL": "1",
                "IPAMD_LEAK_GRACE": str(LEAK_GRACE_S),
                "POD_MTU": str(POD_MTU),
                # ipamd writes the conflist itself once ready, from the file the DaemonSet ships.
                "IPAMD_CNI_CONF_DIR": str(cni_conf),
                "IPAMD_CNI_CONFLIST_TEMPLATE": str(DEPLOYED_CONFLIST),
            },
        )
        ipamd.wait_ready()
        wait_for_file(cni_conf / DEPLOYED_CONFLIST.name)
        yield Node(containerd, ipamd)
    finally:
        if containerd is not None:
            containerd.cleanup()  # first: the DELs of the pods it stops go to ipamd
        code, log = (ipamd.stop(), ipamd.log_tail()) if ipamd is not None else (0, "")
        delete_netns(host_ns)
        shutil.rmtree(workdir, ignore_errors=True)
    assert code == 0, f"ipamd exited {code}:\n{log}"


def test_pods_get_distinct_addresses_from_the_pool_and_free_them(node: Node) -> None:
    assert node.containerd.client.version().startswith("containerd ")
    names = [f"pod-{i:02d}" for i in range(PODS)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        sandbox_ids = list(pool.map(node.run_pod, names))

    held = node.addresses()
    assert set(held) == set(sandbox_ids), "ipamd holds one allocation per sandbox, keyed by its ID"
    assert len(set(held.values())) == PODS, f"addresses are distinct: {sorted(held.values())}"
    states = node.ipamd.address_states()
    items = node.allocation_items()
    for name, sandbox_id in zip(names, sandbox_ids, strict=True):
        address = held[sandbox_id]
        assert states.get(address) == "assigned", f"{address} is an assigned address of an ENI"
        status = node.containerd.client.sandbox_status(sandbox_id)
        assert status.ready and status.ips == (address,), (status, address)
        netns = node.containerd.netns_path(sandbox_id)
        in_netns = netns_addresses(netns, "eth0")
        assert {bare(a) for a in in_netns} == {address}
        assert link_mtu(netns, "eth0") == POD_MTU, "the pod's interface takes POD_MTU"
        assert items[sandbox_id]["pod"] == {"namespace": "e2e", "name": name, "uid": f"uid-{name}"}
    # containerd ran the plugin with the conflist ipamd wrote, which names its log (embedded:
    # under the daemon's ./.run): a line per ADD, as aws-cni's plugin.log has.
    plugin_log = node.ipamd.workdir / ".run" / "aws-routed-eni" / "plugin.log"
    added = [json.loads(x) for x in plugin_log.read_text().splitlines()]
    added = [x for x in added if x["msg"].startswith("cni.add ")]
    assert {x["container_id"]: x["addresses"] for x in added} == {
        sandbox_id: [f"{held[sandbox_id]}/32"] for sandbox_id in sandbox_ids
    }

    def stop_then_remove(sandbox_id: str) -> None:
        node.containerd.client.stop_sandbox(sandbox_id)
        assert sandbox_id not in node.addresses(), "StopPodSandbox's DEL freed the address"
        node.containerd.client.remove_sandbox(sandbox_id)

    def remove(sandbox_id: str) -> None:
        node.containerd.client.remove_sandbox(sandbox_id)  # stops it first, with a DEL
        assert sandbox_id not in node.addresses(), "RemovePodSandbox's DEL freed the address"

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(stop_then_remove, sandbox_ids[: PODS // 2]))
        list(pool.map(remove, sandbox_ids[PODS // 2 :]))
    assert node.addresses() == {}
    assert node.containerd.client.list_sandboxes() == []
    states = node.ipamd.address_states()
    assert {states[a] for a in held.values()} == {"cooling"}, "freed addresses cool before reuse"


def test_leak_gc_frees_the_address_of_a_sandbox_removed_behind_its_back(node: Node) -> None:
    live = [node.run_pod(f"live-{i}") for i in range(2)]
    doomed = node.run_pod("doomed")
    doomed_netns = node.containerd.netns_path(doomed)
    phantom = {"container_id": "no-such-sandbox", "ifname": "eth0", "network": NETWORK}

    def allocated() -> bool | None:
        status, body = node.ipamd.call("POST", "/v1/allocations", phantom)
        assert status == 200 or body.get("retryable"), body
        return True if status == 200 else None

    wait_until(allocated, "an allocation for a container that no sandbox has")
    before = node.addresses()
    assert set(before) == {*live, doomed, "no-such-sandbox"}
    released_before = node.ipamd.metric(LEAKS_RELEASED)
    try:
        # The sandbox's task and container go with `ctr`, then containerd restarts: its CRI plugin
        # recovers the sandboxes from containerd's metadata, where this one is gone. No DEL ran.
        node.containerd.forget_sandbox(doomed)
        node.containerd.restart()
        listed = {s.id: s.state for s in node.containerd.client.list_sandboxes()}
        assert listed == dict.fromkeys(live, cri.SANDBOX_READY), listed

        def collected() -> dict[str, str] | None:
            now = node.addresses()
            assert set(live) <= set(now), "the leak GC never frees a live sandbox's address"
            return now if set(now) == set(live) else None

        after = wait_until(collected, "the leak GC freeing the two leaked allocations", 60.0)
        assert after == {sandbox_id: before[sandbox_id] for sandbox_id in live}
        assert node.ipamd.metric(LEAKS_RELEASED) == released_before + 2, "freed by the leak GC"
        states = node.ipamd.address_states()
        assert {states[before[doomed]], states[before["no-such-sandbox"]]} == {"cooling"}
        intents = node.ipamd.get("/v1/intents")["intents"]
        assert isinstance(intents, list)
        assert {doomed, "no-such-sandbox"} <= {i["container_id"] for i in intents}, intents

        time.sleep(2)  # more GC rounds
        assert node.addresses() == after, "live sandboxes keep their addresses"
    finally:
        subprocess.run(["umount", doomed_netns], check=False, capture_output=True)
        Path(doomed_netns).unlink(missing_ok=True)
        for sandbox_id in live:
            node.remove_pod(sandbox_id)
    assert node.addresses() == {}
