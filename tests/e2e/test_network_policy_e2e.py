"""End to end: a pod's ADD and DEL through the real `ipamd-cni` interface plugin reach the
network-policy agent through a real `ipamd run --embedded`, at the moment VPC CNI's plugin would call
it: once the pod's host veth exists.

The agent is the fake one (`tests.support.policy_agent`): a real NPBackend gRPC server on a unix
socket in the test's temp dir, its `on_enforce` hook reading the node's namespace while the call is
in flight. The plugin runs as a runtime runs it, inside a namespace made here standing for the
node's (where the host end of the veth goes); the pods' namespaces are made here too. The daemon
runs in NETWORK_POLICY_ENFORCING_MODE=standard (an unreachable agent fails the ADD), one per module;
the agent is started per test, on the path the daemon was given, or not at all.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bench.vpc.processes import BIN, Ipamd, add_netns, bare, delete_netns, make_workdir
from ipamd.wire.pod import veth_name
from tests.e2e.conflist import NETWORK, conflist
from tests.e2e.support import CniOutcome, netns_links, require, require_root, run_plugin
from tests.support.policy_agent import DeleteCall, EnforceCall, ThreadedPolicyAgent

POD_NAMESPACE = "shop"
CNI_ARGS = (
    "IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name};K8S_POD_UID=uid-{name}"
)
ERR_NETWORK_POLICY = 105

NetnsFactory = Callable[[], tuple[str, str]]


@dataclass(frozen=True)
class Sighting:
    """What the node's namespace held while the agent was being asked to enforce a pod."""

    call: EnforceCall
    veth: str
    link: dict[str, Any] | None
    """`ip -j -d link show <veth>` in the node's namespace, None when there was no such link."""
    routes: list[str] = field(default_factory=list)
    """The destinations routed through that veth (the pod's /32)."""


@dataclass
class Node:
    """The node's namespace (the host ends of the veths) and the daemon serving its pods."""

    ipamd: Ipamd
    host_ns: str
    host_path: str
    agent_socket: Path

    def conf(self) -> dict[str, object]:
        whole: Any = conflist(str(self.ipamd.socket_path))
        (plugin,) = whole["plugins"]
        return {"cniVersion": whole["cniVersion"], "name": whole["name"], **plugin}

    def plugin(self, command: str, container_id: str, pod_path: str, pod: str) -> CniOutcome:
        return run_plugin(
            BIN / "ipamd-cni",
            command,
            self.conf(),
            cni_path=str(BIN),
            container_id=container_id,
            netns=pod_path,
            ifname="eth0",
            cni_args=CNI_ARGS.format(namespace=POD_NAMESPACE, name=pod),
            in_netns=self.host_path,
        )

    def host_link(self, name: str) -> dict[str, Any] | None:
        """The link `name` in the node's namespace (never the machine's), None if absent."""
        shown = subprocess.run(
            ["ip", "-n", self.host_ns, "-j", "-d", "link", "show", name],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
        if shown.returncode != 0:
            return None
        (link,) = json.loads(shown.stdout)
        assert isinstance(link, dict)
        return link

    def routes_via(self, name: str) -> list[str]:
        shown = subprocess.run(
            ["ip", "-n", self.host_ns, "-j", "route", "show", "dev", name],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
        return [r["dst"] for r in json.loads(shown.stdout or "[]")] if shown.returncode == 0 else []

    def veths(self) -> set[str]:
        return {n for n in netns_links(self.host_path) if n.startswith("eni")}

    def intents(self) -> set[str]:
        items = self.ipamd.get("/v1/intents")["intents"]
        assert isinstance(items, list)
        return {item["container_id"] for item in items}

    def watch(self, agent: ThreadedPolicyAgent) -> list[Sighting]:
        """Has the agent look at the node's namespace on each EnforceNpToPod, before it answers.
        It accepts whatever it saw (the script's answer decides), so a missing veth fails the
        test's assertion on the sighting, not the ADD. Returns what it saw, in order."""
        seen: list[Sighting] = []

        def look(call: EnforceCall) -> bool:
            name = veth_name("eni", call.namespace, call.name)
            try:
                sighting = Sighting(call, name, self.host_link(name), self.routes_via(name))
            except Exception as err:  # a raise here would reach the daemon as a gRPC error
                sighting = Sighting(call, name, {"error": repr(err)})
            seen.append(sighting)
            return True

        agent.script.on_enforce = look
        return seen


def start_node(prefix: str, mode: str) -> tuple[Node, Path]:
    workdir = make_workdir(prefix)
    host_ns = f"ipamd-e2e-{prefix}-{os.getpid()}"
    host_path = add_netns(host_ns)
    subprocess.run(["ip", "-n", host_ns, "link", "set", "lo", "up"], check=True, timeout=30)
    agent_socket = workdir / "np" / "npa.sock"
    env = {
        "NETWORK_POLICY_ENFORCING_MODE": mode,
        "IPAMD_NETWORK_POLICY_AGENT_SOCKET": str(agent_socket),
    }
    return Node(Ipamd.start(workdir, env), host_ns, host_path, agent_socket), workdir


def stop_node(node: Node, workdir: Path) -> None:
    code, log = node.ipamd.stop(), node.ipamd.log_tail()
    delete_netns(node.host_ns)
    shutil.rmtree(workdir, ignore_errors=True)
    assert code == 0, f"ipamd exited {code}:\n{log}"


def tidy(node: Node) -> None:
    """Removes what a failed test left on the node (allocations, veths), so that the next test
    starts from nothing and fails only for itself."""
    held = node.ipamd.get("/v1/allocations")["allocations"]
    assert isinstance(held, list)
    if held and not node.agent_socket.exists():
        with ThreadedPolicyAgent(node.agent_socket):  # in standard mode DEL must tell it
            tidy(node)
        return
    for item in held:
        path = f"/v1/allocations/{item['container_id']}/{item['ifname']}?network={item['network']}"
        node.ipamd.call("DELETE", path)
    for name in node.veths():
        subprocess.run(["ip", "-n", node.host_ns, "link", "del", name], check=False, timeout=30)


@pytest.fixture(scope="module")
def standard_node() -> Iterator[Node]:
    require_root()
    require("ip", "nsenter")
    made, workdir = start_node("np", "standard")
    try:
        made.ipamd.wait_ready()
        yield made
    finally:
        stop_node(made, workdir)


@pytest.fixture
def node(standard_node: Node) -> Iterator[Node]:
    """The module's node (daemon in mode standard) for one test, tidied after it."""
    yield standard_node
    tidy(standard_node)


@pytest.fixture
def agent(node: Node) -> Iterator[ThreadedPolicyAgent]:
    """A fresh agent on the daemon's agent socket for one test; gone (socket too) after it."""
    with ThreadedPolicyAgent(node.agent_socket) as running:
        yield running
    assert not node.agent_socket.exists()


def test_add_tells_the_agent_once_the_veth_exists_and_del_tells_it_the_pod_goes(
    node: Node, agent: ThreadedPolicyAgent, netns: NetnsFactory
) -> None:
    seen = node.watch(agent)
    held_then: list[dict[str, list[str]]] = []
    agent.script.on_delete = lambda call: held_then.append(node.ipamd.allocations(NETWORK))
    _, pod_path = netns()
    host_name = veth_name("eni", POD_NAMESPACE, "cart-1")
    added = node.plugin("ADD", "np-e2e-add", pod_path, "cart-1")
    assert added.returncode == 0, (added.output, added.stderr, node.ipamd.log_tail())
    result: Any = added.output
    (ip,) = result["ips"]
    address = bare(ip["address"])
    assert agent.script.enforced == [EnforceCall("cart-1", POD_NAMESPACE, "standard", 1)]
    (sighting,) = seen
    assert sighting.link is not None, f"no {host_name} in the node's namespace during the call"
    assert sighting.veth == host_name and sighting.link["ifname"] == host_name
    assert sighting.link["linkinfo"]["info_kind"] == "veth"
    assert sighting.routes == [address], "the pod's route was not there during the call"
    assert node.ipamd.allocations(NETWORK) == {"np-e2e-add/eth0": [address]}
    assert agent.script.deleted == []

    deleted = node.plugin("DEL", "np-e2e-add", pod_path, "cart-1")
    assert deleted.returncode == 0, (deleted.output, deleted.stderr, node.ipamd.log_tail())
    assert agent.script.deleted == [DeleteCall("cart-1", POD_NAMESPACE)]
    assert held_then == [{"np-e2e-add/eth0": [address]}], "released before the agent was told"
    assert node.host_link(host_name) is None
    assert "eth0" not in netns_links(pod_path)
    assert node.ipamd.allocations(NETWORK) == {}


def assert_failed_cleanly(
    node: Node, failed: CniOutcome, container_id: str, pod_path: str, pod: str, says: str
) -> None:
    """A failed ADD as the plugin must leave it: CNI error 105 whose message names the pod and the
    agent's answer, no allocation, no delete intent, no veth on either side."""
    assert failed.returncode != 0, failed.output
    assert failed.output.get("code") == ERR_NETWORK_POLICY, (failed.output, failed.stderr)
    message = failed.output.get("msg")
    assert isinstance(message, str), failed.output
    assert message.startswith("the network-policy agent refused the pod: "), message
    assert f"pod {POD_NAMESPACE}/{pod}: EnforceNpToPod on unix:" in message, message
    assert says in message, message
    assert node.ipamd.allocations(NETWORK) == {}
    assert container_id not in node.intents()
    assert node.veths() == set()
    assert "eth0" not in netns_links(pod_path)


@pytest.mark.parametrize(
    ("answer", "says"),
    [("refuse", "Success=false"), ("error", "UNAVAILABLE: the fake agent fails this call")],
)
def test_an_agent_that_refuses_fails_the_add_and_leaves_nothing(
    node: Node, agent: ThreadedPolicyAgent, netns: NetnsFactory, answer: str, says: str
) -> None:
    seen = node.watch(agent)
    _, pod_path = netns()
    cid = f"np-e2e-{answer}"
    agent.script.enforce_answer = answer  # type: ignore[assignment]
    failed = node.plugin("ADD", cid, pod_path, "cart-2")
    assert len(seen) <= 1 and agent.script.enforced == [
        EnforceCall("cart-2", POD_NAMESPACE, "standard", 1)
    ]
    if answer == "refuse":  # an agent that fails the call answers before its hook runs
        (sighting,) = seen
        assert sighting.link is not None, "the veth was not there when the agent refused"
        (address,) = sighting.routes
        assert node.ipamd.address_states()[address] == "free", "retracted, not cooling"
    assert_failed_cleanly(node, failed, cid, pod_path, "cart-2", says)

    agent.script.enforce_answer = "ok"
    again = node.plugin("ADD", cid, pod_path, "cart-2")
    assert again.returncode == 0, (again.output, again.stderr, node.ipamd.log_tail())
    assert len(agent.script.enforced) == 2 and seen[-1].link is not None
    assert set(node.ipamd.allocations(NETWORK)) == {f"{cid}/eth0"}
    deleted = node.plugin("DEL", cid, pod_path, "cart-2")
    assert deleted.returncode == 0, deleted.output
    assert node.ipamd.allocations(NETWORK) == {} and node.veths() == set()


def test_an_agent_that_is_not_there_fails_the_add_in_standard_mode(
    node: Node, netns: NetnsFactory
) -> None:
    assert not node.agent_socket.exists()
    _, pod_path = netns()
    failed = node.plugin("ADD", "np-e2e-absent", pod_path, "cart-3")
    assert_failed_cleanly(node, failed, "np-e2e-absent", pod_path, "cart-3", "UNAVAILABLE")

    with ThreadedPolicyAgent(node.agent_socket) as agent:
        again = node.plugin("ADD", "np-e2e-absent", pod_path, "cart-3")
        assert again.returncode == 0, (again.output, again.stderr, node.ipamd.log_tail())
        assert agent.script.enforced == [EnforceCall("cart-3", POD_NAMESPACE, "standard", 1)]
        deleted = node.plugin("DEL", "np-e2e-absent", pod_path, "cart-3")
        assert deleted.returncode == 0, deleted.output
        assert agent.script.deleted == [DeleteCall("cart-3", POD_NAMESPACE)]
    assert node.ipamd.allocations(NETWORK) == {} and node.veths() == set()


def test_mode_none_never_calls_the_agent(netns: NetnsFactory) -> None:
    require_root()
    require("ip", "nsenter")
    quiet, workdir = start_node("np-none", "none")
    try:
        with ThreadedPolicyAgent(quiet.agent_socket) as agent:
            quiet.ipamd.wait_ready()
            _, pod_path = netns()
            added = quiet.plugin("ADD", "np-e2e-none", pod_path, "cart-4")
            assert added.returncode == 0, (added.output, added.stderr, quiet.ipamd.log_tail())
            assert quiet.host_link(veth_name("eni", POD_NAMESPACE, "cart-4")) is not None
            deleted = quiet.plugin("DEL", "np-e2e-none", pod_path, "cart-4")
            assert deleted.returncode == 0, deleted.output
            assert (agent.script.enforced, agent.script.deleted) == ([], [])
    finally:
        stop_node(quiet, workdir)
