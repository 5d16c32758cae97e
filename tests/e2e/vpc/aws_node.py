"""A node of the emulated VPC as aws-node leaves it, made before ipamd ever starts, and the probes that
say what of aws-node is still there.

What aws-node would have made, and `AwsNode` makes without it:
- EC2: secondary ENIs with VPC CNI's description and tags, attached, secondary addresses on each ENI
  (`tests.e2e.vpc.aws_node_ec2`, run in the node's namespace where the world's EC2 listens);
- each secondary ENI's link as `setupENINetwork` sets it up: MTU 9001, up, the ENI's primary address
  with the subnet's mask, table device+1 with `<gateway> scope link` and `default via <gateway>`, the
  subnet's connected route gone from main, `from <ENI address> lookup device+1` at 32765;
- its SNAT: iptables (the nft backend, Debian's default) nat `AWS-SNAT-CHAIN-0` and
  `AWS-CONNMARK-CHAIN-0` with their jumps, mangle PREROUTING's "AWS, primary ENI" connmark rules,
  `fwmark 0x80/0x80 lookup main` at 1024 (`updateHostIptablesRules`), IPv4 forwarding on;
- `10-aws.conflist` (network `aws-cni`, portmap chained after the plugin) in containerd's conf dir
  and a stand-in `aws-cni` plugin (`tests.e2e.vpc.aws_cni_plugin`) that gives each pod the address
  the test wrote for it, so a pod with hostPorts gets portmap's chains;
- the checkpoint (VPC CNI's `vpc-cni-ipam/1`) at ipamd's AWS_VPC_K8S_CNI_BACKING_STORE.

`aws_vpc_node` gives a fresh node to prepare (ipamd configured, not started), and `taken_over`
says when ipamd has replaced all of it.

No rule, route or chain made here carries a protocol tag: ipamd's are the ones tagged 167. Every
command names the node's namespace.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from bench.vpc.fabric import ENI_MTU, Namespaces, in_netns, ip, ip_batch, node_link, run, sysctl
from bench.vpc.processes import make_workdir, wait_until
from ipamd.hostnet.ports import RT_PROTO_IPAMD
from tests.e2e.support import require, require_root
from tests.e2e.vpc.harness import REPO, VpcNode
from tests.e2e.vpc.rules import (
    CONNMARK,
    PRIORITY_CONNMARK,
    PRIORITY_FROM_ENI,
    PRIORITY_FROM_POD,
    PRIORITY_TO_POD,
    KernelRule,
    expected_rules,
)
from tests.support.vpc_cni_checkpoints import Pod, Shape
from tests.support.vpc_cni_checkpoints import render as render_checkpoint

NETWORK = "aws-cni"
"""aws-node's network name, which ipamd's conflist keeps."""
AWS_CONFLIST = "10-aws.conflist"
POD_NAMESPACE = "e2e"
"""The namespace `VpcNode.run_pod` gives its pods."""
CHECKPOINT_VERSION = "vpc-cni-ipam/1"
SNAT_CHAINS = ("AWS-SNAT-CHAIN-0", "AWS-CONNMARK-CHAIN-0")
PRIMARY_LINK = node_link(0)
VETH_PREFIX = "eni"
"""VPC CNI's default `vethPrefix`, its conflist's and its connmark rules'."""
NODE_PORT_CHAIN = "PREROUTING"
"""Of table mangle, where aws-node's node-port rules are."""


@dataclass(frozen=True, slots=True)
class AwsEni:
    eni_id: str
    device_index: int
    mac: str
    primary_ip: str
    secondary_ips: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class AwsPod:
    """A pod aws-node's plugin set up."""

    name: str
    sandbox_id: str
    address: str
    device_index: int


@dataclass
class AwsNode:
    node: VpcNode
    enis: list[AwsEni]
    table: Path
    """The stand-in plugin's address table."""

    # -- EC2 and the ENIs' links ------------------------------------------------------------------

    @classmethod
    def prepare(cls, node: VpcNode, secondary_ips: Mapping[int, int]) -> AwsNode:
        """ENIs, their links, SNAT, the plugin and its conflist; no pod yet."""
        enis = create_enis(node, secondary_ips)
        ready = node.world_ready
        sysctl(node.ns.node, "net.ipv4.ip_forward", "1")
        for eni in enis:
            if eni.device_index >= 1:
                setup_eni_link(node, eni, ready.subnet_cidr, ready.gateway)
        install_snat(node, ready.primary_ip, ready.vpc_cidr)
        return cls(node, enis, install_plugin(node))

    def eni(self, device_index: int) -> AwsEni:
        return next(e for e in self.enis if e.device_index == device_index)

    # -- pods -------------------------------------------------------------------------------------

    def run_pods(
        self,
        placement: Iterable[tuple[str, int]],
        host_ports: Mapping[str, Mapping[int, int]] | None = None,
    ) -> list[AwsPod]:
        """Runs one pod per (name, device index), each on the next unused secondary address of that
        ENI, through containerd and the stand-in plugin. `host_ports`: pod name → its hostPorts
        (host port → the pod's TCP port), which portmap maps."""
        used: dict[int, int] = {}
        entries: dict[str, dict[str, object]] = {}
        pods = []
        for name, index in placement:
            address = self.eni(index).secondary_ips[used.get(index, 0)]
            used[index] = used.get(index, 0) + 1
            entries[f"{POD_NAMESPACE}/{name}"] = {"address": address, "device_index": index}
            _write_json(self.table, entries)
            sandbox_id = self.node.run_pod(name, host_ports=(host_ports or {}).get(name))
            pods.append(AwsPod(name, sandbox_id, address, index))
        return pods

    def write_checkpoint(
        self, pods: Iterable[AwsPod], shape: Shape | None = None, migrated: Iterable[str] = ()
    ) -> Path:
        """aws-node's checkpoint of `pods`, where ipamd reads it: as today's aws-node writes it, or
        byte for byte as the release of `shape` did, the pods named in `migrated` keyed as its CRI
        migration keyed them (`tests/support/vpc_cni_checkpoints.py`)."""
        path = checkpoint_path(self.node)
        path.parent.mkdir(parents=True, exist_ok=True)
        now = time.time_ns()
        if shape is not None:
            found = set(migrated)
            old = [
                Pod(p.sandbox_id, p.address, POD_NAMESPACE, p.name, now, p.name in found)
                for p in pods
            ]
            path.write_bytes(render_checkpoint(shape, old))
            return path
        _write_json(
            path,
            {
                "version": CHECKPOINT_VERSION,
                "allocations": [
                    {
                        "networkName": NETWORK,
                        "containerID": pod.sandbox_id,
                        "ifName": "eth0",
                        "ipv4": pod.address,
                        "allocationTimestamp": now,
                        "metadata": {
                            "k8sPodNamespace": POD_NAMESPACE,
                            "k8sPodName": pod.name,
                            "interfacesCount": 1,
                        },
                    }
                    for pod in pods
                ],
            },
        )
        return path


def checkpoint_path(node: VpcNode) -> Path:
    return Path(node.ipamd_env["AWS_VPC_K8S_CNI_BACKING_STORE"])


def _write_json(path: Path, value: object) -> None:
    staged = path.with_name(f".{path.name}.tmp")
    staged.write_text(json.dumps(value, indent=2) + "\n")
    os.replace(staged, path)  # a reader never sees half a file


def create_enis(node: VpcNode, secondary_ips: Mapping[int, int]) -> list[AwsEni]:
    ready = node.world_ready
    spec = node.workdir / "aws-node-ec2.json"
    spec.write_text(
        json.dumps(
            {
                "ec2_url": ready.ec2_url,
                "region": ready.region,
                "instance_id": ready.instance_id,
                "primary_eni_id": ready.primary_eni_id,
                "secondary_ips": {str(k): v for k, v in secondary_ips.items()},
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        AWS_EC2_METADATA_DISABLED="true",
    )
    done = subprocess.run(
        in_netns(node.ns.node, sys.executable, "-m", "tests.e2e.vpc.aws_node_ec2", str(spec)),
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"aws-node's EC2 preparation failed:\n{done.stderr[-3000:]}"
    return [
        AwsEni(
            eni_id=str(e["eni_id"]),
            device_index=int(e["device_index"]),
            mac=str(e["mac"]),
            primary_ip=str(e["primary_ip"]),
            secondary_ips=tuple(str(a) for a in e["secondary_ips"]),
        )
        for e in json.loads(done.stdout)
    ]


def _link_with_mac(node: VpcNode, name: str, mac: str) -> bool | None:
    done = subprocess.run(
        ["ip", "-j", "-n", node.ns.node, "link", "show", "dev", name],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if done.returncode != 0:
        return None
    return True if str(json.loads(done.stdout)[0].get("address")) == mac else None


def setup_eni_link(node: VpcNode, eni: AwsEni, subnet_cidr: str, gateway: str) -> None:
    """`setupENINetwork`: once the hypervisor shows the ENI's link (found by its MAC)."""
    link, table = node_link(eni.device_index), str(eni.device_index + 1)
    wait_until(lambda: _link_with_mac(node, link, eni.mac), f"{link} of {eni.eni_id}", 30.0)
    prefixlen = subnet_cidr.partition("/")[2]
    ip_batch(
        node.ns.node,
        [
            f"link set {link} mtu {ENI_MTU}",
            f"link set {link} up",
            f"addr flush dev {link}",
            f"addr add {eni.primary_ip}/{prefixlen} dev {link}",
            f"route del {subnet_cidr} dev {link}",
            f"route add {gateway} dev {link} scope link table {table}",
            f"route add default via {gateway} dev {link} table {table}",
            f"rule add from {eni.primary_ip}/32 lookup {table} priority {PRIORITY_FROM_ENI}",
        ],
    )


def install_snat(node: VpcNode, primary_ip: str, vpc_cidr: str) -> None:
    """`updateHostIptablesRules` with its defaults (SNAT on, `--random-fully`, node-port support),
    in one iptables-restore transaction that keeps whatever else is there."""
    mark = f"{CONNMARK:#x}"
    mangle = "\n".join(
        f"-A {NODE_PORT_CHAIN} {_restore_args(spec)}" for spec in node_port_rules(PRIMARY_LINK)
    )
    script = f"""\
*nat
:AWS-SNAT-CHAIN-0 - [0:0]
:AWS-CONNMARK-CHAIN-0 - [0:0]
-A PREROUTING -i eni+ -m comment --comment "AWS, outbound connections" -j AWS-CONNMARK-CHAIN-0
-A PREROUTING -m comment --comment "AWS, CONNMARK" -j CONNMARK --restore-mark --mask {mark}
-A POSTROUTING -m comment --comment "AWS SNAT CHAIN" -j AWS-SNAT-CHAIN-0
-A AWS-SNAT-CHAIN-0 -d {vpc_cidr} -m comment --comment "AWS SNAT CHAIN" -j RETURN
-A AWS-SNAT-CHAIN-0 ! -o vlan+ -m comment --comment "AWS, SNAT" -m addrtype ! --dst-type LOCAL \
-j SNAT --to-source {primary_ip} --random-fully
-A AWS-CONNMARK-CHAIN-0 -d {vpc_cidr} -m comment --comment "AWS CONNMARK CHAIN, VPC CIDR" -j RETURN
-A AWS-CONNMARK-CHAIN-0 -m comment --comment "AWS, CONNMARK" -j CONNMARK --set-xmark {mark}/{mark}
COMMIT
*mangle
{mangle}
COMMIT
"""
    run(in_netns(node.ns.node, "iptables-restore", "--noflush"), script)
    ip(
        node.ns.node,
        "rule",
        "add",
        "fwmark",
        f"{mark}/{mark}",
        "lookup",
        "main",
        "priority",
        str(PRIORITY_CONNMARK),
    )


def node_port_rules(primary_link: str) -> tuple[tuple[str, ...], ...]:
    """aws-node's mangle PREROUTING rules of node-port support, as VPC CNI spells them with its
    defaults (aws/amazon-vpc-cni-k8s v1.23.1, pkg/networkutils/network.go,
    `buildIptablesSNATRules`: "connmark for primary ENI", "connmark restore for primary ENI" and
    "... from vlan"): a connection to a local address arriving on the primary link is marked, and
    packets from the pods' veths and VLANs take the mark back, so that `fwmark 0x80/0x80 lookup
    main` sends a pod's NodePort and hostPort replies out the primary ENI."""
    mark = f"{CONNMARK:#x}"
    comment = ("-m", "comment", "--comment", "AWS, primary ENI")
    restore = ("-j", "CONNMARK", "--restore-mark", "--mask", mark)
    return (
        (
            *comment,
            *("-i", primary_link, "-m", "addrtype", "--dst-type", "LOCAL", "--limit-iface-in"),
            *("-j", "CONNMARK", "--set-mark", f"{mark}/{mark}"),
        ),
        (*comment, "-i", f"{VETH_PREFIX}+", *restore),
        (*comment, "-i", "vlan+", *restore),
    )


def missing_node_port_rules(node: VpcNode) -> list[str]:
    """Those of `node_port_rules` the node's mangle PREROUTING lacks, each asked as VPC CNI asks
    (`ipt.Exists`: `iptables -C`)."""
    missing = []
    for spec in node_port_rules(PRIMARY_LINK):
        argv = in_netns(node.ns.node, "iptables", "-t", "mangle", "-C", NODE_PORT_CHAIN, *spec)
        done = subprocess.run(argv, capture_output=True, timeout=30, check=False)
        if done.returncode != 0:
            missing.append(_restore_args(spec))
    return missing


def _restore_args(spec: Iterable[str]) -> str:
    """A rule's arguments as iptables-restore reads them (double quotes around a space)."""
    return " ".join(f'"{arg}"' if " " in arg else arg for arg in spec)


def install_plugin(node: VpcNode) -> Path:
    """The stand-in `aws-cni` in containerd's CNI bin dir and `10-aws.conflist` (VPC CNI's, less
    the chained egress-cni, off on an IPv4 node by default) in its conf dir; returns the address
    table's path."""
    bin_dir = node.workdir / "bin"
    table, log = bin_dir / "aws-cni.addresses.json", bin_dir / "aws-cni.log"
    _write_json(table, {})
    plugin = Path(__file__).with_name("aws_cni_plugin.py")
    launcher = bin_dir / "aws-cni"
    launcher.write_text(
        f"#!{sys.executable}\n"
        "import runpy, sys\n"
        f"sys.argv[1:] = [{str(table)!r}, {str(log)!r}]\n"
        f"runpy.run_path({str(plugin)!r}, run_name='__main__')\n"
    )
    launcher.chmod(0o755)
    conf = {
        "cniVersion": "0.4.0",
        "name": NETWORK,
        "disableCheck": True,
        "plugins": [
            {
                "name": NETWORK,
                "type": "aws-cni",
                "vethPrefix": VETH_PREFIX,
                "mtu": str(ENI_MTU),
                "podSGEnforcingMode": "strict",
                "pluginLogFile": str(log),
                "pluginLogLevel": "DEBUG",
                "capabilities": {"io.kubernetes.cri.pod-annotations": True},
            },
            # Last, as in aws/amazon-vpc-cni-k8s v1.23.1 misc/10-aws.conflist: hostPorts.
            {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
        ],
    }
    _write_json(node.workdir / "net.d" / AWS_CONFLIST, conf)
    return table


# -- what is left of aws-node ---------------------------------------------------------------------


def iptables_rules(node: VpcNode) -> str:
    """`iptables-save` of the node (the nft backend's tables, as aws-node made them)."""
    return run(in_netns(node.ns.node, "iptables-save"))


def snat_chains(node: VpcNode) -> set[str]:
    """Which of aws-node's chains exist, or are jumped to, in the node."""
    saved = iptables_rules(node)
    return {chain for chain in SNAT_CHAINS if chain in saved}


def aws_node_iptables(node: VpcNode) -> list[str]:
    """Every line of the node's iptables that is aws-node's: its chains, the jumps to them and its
    connmark rules (all of which carry an "AWS" comment)."""
    return [line for line in iptables_rules(node).splitlines() if "AWS" in line]


def untagged_rules(node: VpcNode, priorities: Iterable[int]) -> list[dict[str, object]]:
    """Rules at `priorities` that are not ipamd's (no protocol 167): VPC CNI's, as `ip -j` lists
    them."""
    wanted = set(priorities)
    listed = json.loads(run(["ip", "-j", "-4", "-n", node.ns.node, "rule", "show"]) or "[]")
    return [
        item
        for item in listed
        if int(str(item["priority"])) in wanted and str(item.get("protocol")) != str(RT_PROTO_IPAMD)
    ]


CNI_CACHE = Path("/var/lib/cni/results")
"""libcni's cache of the runtime's CNI results, in the machine's /var/lib/cni."""
COOLDOWN_S = 30
"""VPC CNI's IP_COOLDOWN_PERIOD, which a node taken over keeps."""


@contextlib.contextmanager
def aws_vpc_node(pause_image: Path) -> Iterator[VpcNode]:
    """The world and containerd in a fresh node, ipamd configured (host networking on) but not
    started; everything gone afterwards, whatever happened."""
    require_root()
    require(
        "containerd",
        "runc",
        "ctr",
        "ip",
        "nsenter",
        "nft",
        "ping",
        "iptables-restore",
        "iptables-save",
        plugins=("loopback",),
    )
    node = VpcNode(make_workdir("takeover"), Namespaces.unique())
    try:
        node.start_world()
        node.start_containerd(pause_image)
        # VPC CNI's cooldown, not the harness's 1 s: the spare addresses are still cooling at ready.
        node.configure_ipamd("on", {"IP_COOLDOWN_PERIOD": str(COOLDOWN_S)})
        yield node
    except BaseException:
        print(node.diagnostics(), file=sys.stderr)
        with contextlib.suppress(Exception):
            print(f"== node iptables\n{iptables_rules(node)}", file=sys.stderr)
        plugin_log = node.workdir / "bin" / "aws-cni.log"
        if plugin_log.exists():
            print(f"== aws-cni log\n{plugin_log.read_text()[-3000:]}", file=sys.stderr)
        raise
    finally:
        sandboxes = []
        with contextlib.suppress(Exception):
            sandboxes = [s.id for s in node.runtime.client.list_sandboxes()]
        try:
            node.close()
        finally:
            forget_cached_results(sandboxes)


def forget_cached_results(sandbox_ids: list[str]) -> None:
    """The runtime's cached CNI results of these sandboxes (libcni's, in the machine's
    /var/lib/cni): a DEL that failed, because ipamd was down when a failed test cleaned up,
    leaves them behind."""
    for sandbox_id in sandbox_ids:
        for cached in CNI_CACHE.glob(f"*-{sandbox_id}-*"):
            cached.unlink(missing_ok=True)


def rules_mismatch(node: VpcNode) -> str:
    """What differs between the node's protocol-167 rules and those ipamd's API implies (read
    before and after the kernel, so that a change meanwhile is allowed either way); empty if
    nothing does."""

    def expected() -> frozenset[KernelRule]:
        items = node.daemon.get("/v1/allocations")["allocations"]
        enis = node.daemon.get("/v1/enis")["enis"]
        assert isinstance(items, list) and isinstance(enis, list)
        return frozenset(expected_rules(items, enis, snat=True))

    first = expected()
    rules = node.ipamd_rules()
    second = expected()
    missing, unexpected = (first & second) - rules, rules - (first | second)
    if not missing and not unexpected:
        return ""
    return f"missing {sorted(map(str, missing))}; unexpected {sorted(map(str, unexpected))}"


def taken_over(node: VpcNode) -> bool:
    return (
        not rules_mismatch(node)
        and not untagged_rules(node, (PRIORITY_TO_POD, PRIORITY_FROM_POD))
        and not aws_node_iptables(node)
    )
