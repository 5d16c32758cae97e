"""A test-only stand-in for VPC CNI's `aws-cni` plugin: what aws-node's plugin leaves on a node, made
without aws-node. `aws_node.install_plugin` writes a launcher named `aws-cni` into the CNI bin dir
that runs this file with two arguments: the address table (JSON, `"<namespace>/<name>"` → `address`,
`device_index`, written by the test before each pod runs) and a log file.

ADD makes VPC CNI's shape (`cmd/routed-eni-cni-plugin/driver`): host veth `<vethPrefix>` +
sha1("<namespace>.<name>")[:11] with its peer made straight in the pod's namespace as CNI_IFNAME,
both at the conf's MTU; in the pod the /32 address, `169.254.1.1 scope link`, `default via
169.254.1.1` and a permanent neighbour for 169.254.1.1 with the host veth's MAC; on the host
`<pod>/32 dev <veth> scope link` in main, `to <pod> lookup main` at 512 and, on a secondary ENI,
`from <pod> lookup <device+1>` at 1536, all without a protocol tag, as VPC CNI adds them. Its result
(CNI 0.4.0) is VPC CNI's: host veth, pod interface, and the `dummy<hash>` interface whose `mac` is
the VLAN (0) and `sandbox` the device number, which VPC CNI reads back on DEL.

DEL removes the two rules and the host veth (which takes its route along) and always succeeds. No
IPAM: the table stands in for ipamd's answer. Stdlib only: a runtime execs it for every pod.
Every command names the pod's namespace (`nsenter --net=`) or runs where the runtime runs it (the
node's namespace).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

GATEWAY = "169.254.1.1"
PRIORITY_TO_POD = 512
PRIORITY_FROM_POD = 1536
DUMMY_PREFIX = "dummy"


def veth_name(prefix: str, namespace: str, name: str) -> str:
    return prefix + hashlib.sha1(f"{namespace}.{name}".encode()).hexdigest()[:11]


class PluginError(Exception):
    pass


def _ip(*args: str, netns: str | None = None, check: bool = True) -> str:
    argv = ["ip", *args]
    if netns is not None:
        argv = ["nsenter", f"--net={netns}", *argv]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if check and done.returncode != 0:
        raise PluginError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout


def _mac(link: str, netns: str | None = None) -> str:
    return str(json.loads(_ip("-j", "link", "show", "dev", link, netns=netns))[0]["address"])


def _k8s_args(raw: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in raw.split(";") if "=" in part)


def _log(path: Path, message: str) -> None:
    with path.open("a") as log:
        log.write(f"{time.time():.3f} {message}\n")


def add(conf: dict[str, object], table: Path) -> dict[str, object]:
    args = _k8s_args(os.environ.get("CNI_ARGS", ""))
    namespace, name = args["K8S_POD_NAMESPACE"], args["K8S_POD_NAME"]
    entry = json.loads(table.read_text())[f"{namespace}/{name}"]
    address, device = str(entry["address"]), int(entry["device_index"])
    netns, ifname = os.environ["CNI_NETNS"], os.environ["CNI_IFNAME"]
    mtu = str(conf.get("mtu", "9001"))
    host = veth_name(str(conf.get("vethPrefix", "eni")), namespace, name)
    dummy = veth_name(DUMMY_PREFIX, namespace, name)

    _ip("link", "del", host, check=False)  # an earlier attempt's
    _ip(
        "link",
        "add",
        host,
        "mtu",
        mtu,
        "type",
        "veth",
        "peer",
        "name",
        ifname,
        "mtu",
        mtu,
        "netns",
        netns,
    )
    _ip("link", "set", host, "up")
    host_mac = _mac(host)
    _ip("link", "set", ifname, "up", netns=netns)
    _ip("addr", "add", f"{address}/32", "dev", ifname, netns=netns)
    _ip("route", "add", GATEWAY, "dev", ifname, "scope", "link", netns=netns)
    _ip("route", "add", "default", "via", GATEWAY, "dev", ifname, netns=netns)
    _ip("neigh", "add", GATEWAY, "lladdr", host_mac, "dev", ifname, "nud", "permanent", netns=netns)
    pod_mac = _mac(ifname, netns=netns)
    _ip("route", "replace", f"{address}/32", "dev", host, "scope", "link")
    _ip("rule", "add", "to", f"{address}/32", "lookup", "main", "priority", str(PRIORITY_TO_POD))
    if device >= 1:
        _ip(
            "rule",
            "add",
            "from",
            f"{address}/32",
            "lookup",
            str(device + 1),
            "priority",
            str(PRIORITY_FROM_POD),
        )
    return {
        "cniVersion": conf.get("cniVersion", "0.4.0"),
        "interfaces": [
            {"name": host, "mac": host_mac},
            {"name": ifname, "mac": pod_mac, "sandbox": netns},
            {"name": dummy, "mac": "0", "sandbox": str(device)},
        ],
        "ips": [{"version": "4", "address": f"{address}/32", "gateway": GATEWAY, "interface": 1}],
        "dns": {},
    }


def delete(conf: dict[str, object], table: Path) -> None:
    args = _k8s_args(os.environ.get("CNI_ARGS", ""))
    namespace, name = args.get("K8S_POD_NAMESPACE", ""), args.get("K8S_POD_NAME", "")
    address = ""
    previous = conf.get("prevResult")
    if isinstance(previous, dict) and previous.get("ips"):
        address = str(previous["ips"][0]["address"]).partition("/")[0]
    elif table.exists():
        address = str(
            json.loads(table.read_text()).get(f"{namespace}/{name}", {}).get("address", "")
        )
    if address:
        for selector, priority in (("to", PRIORITY_TO_POD), ("from", PRIORITY_FROM_POD)):
            for _ in range(8):  # every copy, as VPC CNI deletes every matching rule
                done = subprocess.run(
                    ["ip", "rule", "del", selector, f"{address}/32", "priority", str(priority)],
                    capture_output=True,
                    timeout=30,
                    check=False,
                )
                if done.returncode != 0:
                    break
    if namespace and name:
        _ip(
            "link",
            "del",
            veth_name(str(conf.get("vethPrefix", "eni")), namespace, name),
            check=False,
        )


def main() -> int:
    table, log = Path(sys.argv[1]), Path(sys.argv[2])
    command = os.environ.get("CNI_COMMAND", "")
    conf = json.loads(sys.stdin.read() or "{}")
    version = conf.get("cniVersion", "0.4.0")
    _log(log, f"{command} {os.environ.get('CNI_CONTAINERID', '')} {os.environ.get('CNI_ARGS', '')}")
    try:
        if command == "ADD":
            print(json.dumps(add(conf, table)))
        elif command == "DEL":
            delete(conf, table)
        elif command == "VERSION":
            supported = ["0.3.0", "0.3.1", "0.4.0", "1.0.0"]
            print(json.dumps({"cniVersion": version, "supportedVersions": supported}))
        return 0
    except Exception as err:  # the runtime reads the CNI error from stdout
        _log(log, f"{command} failed: {err!r}")
        print(json.dumps({"cniVersion": version, "code": 999, "msg": f"aws-cni stand-in: {err}"}))
        return 1


if __name__ == "__main__":
    sys.exit(main())
