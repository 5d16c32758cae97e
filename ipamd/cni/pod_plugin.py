"""The interface plugin's ADD, DEL and CHECK (the conf's `type` is `ipamd-cni`): the allocation as
the IPAM plugin asks for it, plus the pod's veth (`ipamd.cni.pod_interface`) and the policy call.

ADD: allocate -> set up the pod's interface -> when the answer's `network_policy` is set,
`POST /v1/allocations/{cid}/{ifname}/policy?network=` (ipamd tells the network-policy agent) ->
a full CNI result: the host veth (name, MAC), the pod's interface (CNI_IFNAME, MAC,
`sandbox` = CNI_NETNS), the /32 on interface 1 with gateway 169.254.1.1, a default route.

A failure after the allocation removes the interface this ADD made and fails the ADD; it never
asks ipamd to DELETE the allocation:
- the agent refused (502 `network_policy_refused`, CNI 105): ipamd has already retracted the
  allocation (no delete intent, no cooldown: no pod used the address);
- the interface could not be made (CNI 106), or the policy call did not get through (11): the
  allocation stays. A DELETE here would leave a delete intent that refuses this container ID's
  next ADD, while a retry of the same ID (a runtime or a person running the ADD again) should get
  the same address back. The kubelet does not retry a failed RunPodSandbox under the same sandbox
  ID: containerd tears the failed sandbox's network down with a DEL, which releases the address
  as any DEL does, and a runtime that does not is caught by ipamd's runtime leak GC (the sandbox
  is absent from two listings past the grace period).

DEL: the DELETE as the IPAM plugin makes it, then the pod's veth goes, whatever ipamd answered (a
daemon that cannot be reached still gets the veth removed and DEL succeeds). When CNI_NETNS still
opens, CNI_IFNAME is deleted inside it, which removes exactly this sandbox's pair; otherwise the
host veth is deleted by name. A veth that cannot be removed is a warning, not a failure: the pair
dies with the pod's namespace anyway.

CHECK: the IPAM plugin's check, then the host veth must exist (CNI 106 if not).

The host veth's name is VPC CNI's, `vethPrefix` + sha1("<namespace>.<name>")[:11], with the pod
from CNI_ARGS (K8S_POD_NAMESPACE, K8S_POD_NAME): the network-policy agent finds the pod's interface
by it. Without both (a runtime that is not the kubelet's), the name is `vethPrefix` +
sha1(<container ID>)[:11]. DEL and CHECK, which do not insist on CNI_ARGS, take the name from it
when it names the pod, else from prevResult's host interface (the one without `sandbox`), else
from the container ID.
"""

from __future__ import annotations

from ipamd.cni import pod_interface
from ipamd.cni.client import segment
from ipamd.cni.invocation import CniError, Invocation
from ipamd.cni.netlink import NetlinkError, Netns
from ipamd.cni.plugin import ERR_IPAMD, allocate, ask
from ipamd.cni.plugin import check as check_allocation
from ipamd.cni.plugin import delete as delete_allocation
from ipamd.wire import PATH_ALLOCATIONS, Allocation
from ipamd.wire.pod import POLICY_SEGMENT, PolicyRequest, veth_name

# As in `ipamd.wire.pod`: CPython's own SHA-1, not hashlib's OpenSSL (2 ms of every ADD).
try:
    from _sha1 import sha1  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # not CPython
    from hashlib import sha1

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import IO

ERR_INTERFACE = 106
"""The pod's interface cannot be made (ADD) or is missing (CHECK)."""


def host_veth_name(inv: Invocation) -> str:
    """The pod's host veth, named as the module says."""
    assert inv.conf.interface is not None
    prefix = inv.conf.interface.veth_prefix
    pod = inv.pod
    if pod is not None and pod.namespace and pod.name:
        return veth_name(prefix, pod.namespace, pod.name)
    if inv.command != "ADD" and inv.conf.prev_result is not None:
        named = _prev_host_interface(inv.conf.prev_result)
        if named is not None:
            return named
    digest: str = sha1(inv.container_id.encode()).hexdigest()
    return prefix + digest[:11]


def _prev_host_interface(prev: Mapping[str, object]) -> str | None:
    interfaces = prev.get("interfaces")
    for item in interfaces if isinstance(interfaces, list) else []:
        if isinstance(item, dict) and not item.get("sandbox"):
            name = item.get("name")
            if isinstance(name, str) and name:
                return name
    return None


def _pod_address(alloc: Allocation) -> str:
    """The allocation's one IPv4 address, without its prefix length."""
    for ip in alloc.ips:
        address = ip.address.partition("/")[0]
        if ":" not in address:
            return address
    raise CniError(ERR_IPAMD, "ipamd's answer holds no IPv4 address", repr(alloc.ips))


def _remove(host_name: str, log: IO[str]) -> None:
    try:
        pod_interface.tear_down(host_name)
    except NetlinkError as err:
        print(f"ipamd-cni: cannot remove {host_name}: {err}", file=log)


def _enforce_policy(inv: Invocation) -> None:
    path = (
        f"{PATH_ALLOCATIONS}/{segment(inv.container_id)}/{segment(inv.ifname)}/"
        f"{POLICY_SEGMENT}?network={segment(inv.conf.network)}"
    )
    ask(inv, "POST", path, PolicyRequest(1).to_json())


def add(inv: Invocation, log: IO[str]) -> dict[str, object]:
    assert inv.conf.interface is not None
    alloc = allocate(inv)
    address = _pod_address(alloc)
    host_name = host_veth_name(inv)
    try:
        made = pod_interface.set_up(
            host_name, inv.netns, inv.ifname, address, inv.conf.interface.mtu
        )
    except NetlinkError as err:
        raise CniError(ERR_INTERFACE, "cannot set up the pod's interface", str(err)) from None
    if alloc.network_policy is not None:
        try:
            _enforce_policy(inv)
        except CniError:
            _remove(host_name, log)
            raise
    return interface_result(made, address, inv.netns, inv.conf.cni_version)


def interface_result(
    made: pod_interface.PodInterface, address: str, netns: str, version: str
) -> dict[str, object]:
    """The CNI result of the interface plugin in `version`'s shape (0.4.0's ips carry `version`)."""
    ip: dict[str, object] = {
        "address": f"{address}/32",
        "gateway": pod_interface.POD_GATEWAY,
        "interface": 1,
    }
    if version == "0.4.0":
        ip = {"version": "4", **ip}
    return {
        "cniVersion": version,
        "interfaces": [
            {"name": made.host_name, "mac": made.host_mac},
            {"name": made.pod_ifname, "mac": made.pod_mac, "sandbox": netns},
        ],
        "ips": [ip],
        "routes": [{"dst": "0.0.0.0/0", "gw": pod_interface.POD_GATEWAY}],
    }


def _remove_in_netns(inv: Invocation) -> bool:
    """Deletes CNI_IFNAME inside CNI_NETNS; False when the namespace or the link is not there."""
    if not inv.netns:
        return False
    try:
        with Netns(inv.netns) as netns:
            pod, _index = netns.socket_and_index(inv.ifname)
            with pod:
                return pod.delete_link(inv.ifname)
    except NetlinkError:
        return False


def delete(inv: Invocation, log: IO[str]) -> None:
    try:
        delete_allocation(inv, log)
    finally:
        if not _remove_in_netns(inv):
            _remove(host_veth_name(inv), log)


def check(inv: Invocation, log: IO[str]) -> None:
    check_allocation(inv, log)
    host_name = host_veth_name(inv)
    if not pod_interface.host_link_exists(host_name):
        raise CniError(ERR_INTERFACE, "the pod's host interface is missing", host_name)


COMMANDS: dict[str, Callable[[Invocation, IO[str]], dict[str, object] | None]] = {
    "ADD": add,
    "DEL": delete,
    "CHECK": check,
}
