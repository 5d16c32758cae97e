"""The interface plugin's ADD, DEL and CHECK (the conf's `type` is `ipamd-cni`): the allocation as
the IPAM plugin asks for it, plus the pod's veth (`ipamd.cni.pod_interface`) and the policy call.

ADD: allocate -> set up the pod's interface -> for an IPv6 pod under a conf with `v4Egress`, its
IPv4 egress (`ipamd.cni.egress`: host-local's address on a second veth pair) -> when the answer's
`network_policy` is set, `POST /v1/allocations/{cid}/{ifname}/policy?network=` (ipamd tells the
network-policy agent) -> a full CNI result: the host veth (name, MAC), the pod's interface
(CNI_IFNAME, MAC, `sandbox` = CNI_NETNS), the /32 with gateway 169.254.1.1 (or the /128 with
fe80::1) on interface 1, a default route. The egress pair's two ends follow in `interfaces` (the
spec lists every interface an attachment created, and a chained plugin or an operator reading the
cached result finds them there), but its address is in no `ips`: the pod's IP, as the kubelet reads
it, is its IPv6 address alone, as with VPC CNI.

A failure after the allocation removes the interface this ADD made and fails the ADD; it never
asks ipamd to DELETE the allocation:
- the agent refused (502 `network_policy_refused`, CNI 105): ipamd has already retracted the
  allocation (no delete intent, no cooldown: no pod used the address);
- the interface or the egress could not be made (CNI 106; host-local's address is released with
  its DEL), or the policy call did not get through (11): the allocation stays. A DELETE here would
  leave a delete intent that refuses this container ID's next ADD, while a retry of the same ID (a
  runtime or a person running the ADD again) should get the same address back. The kubelet does
  not retry a failed RunPodSandbox under the same sandbox ID: containerd tears the failed
  sandbox's network down with a DEL, which releases the address as any DEL does, and a runtime
  that does not is caught by ipamd's runtime leak GC (the sandbox is absent from two listings past
  the grace period).

DEL: the DELETE as the IPAM plugin makes it, then the pod's veth goes, whatever ipamd answered (a
daemon that cannot be reached still gets the veth removed and DEL succeeds). When CNI_NETNS still
opens, CNI_IFNAME is deleted inside it, which removes exactly this sandbox's pair; otherwise the
host veth is deleted by name. A veth that cannot be removed is a warning, not a failure: the pair
dies with the pod's namespace anyway. With `v4Egress`, DEL also removes the egress pair the same
way and runs host-local's DEL, whatever the family (DEL does not know it; both are no-ops for a
pod without egress); a failure of either is a warning.

CHECK: the IPAM plugin's check, then the host veth must exist (CNI 106 if not), and the egress
pair's host veth too when prevResult's address is IPv6 and the conf has `v4Egress`.

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
from ipamd.cni.invocation import ERR_INVALID_CONFIG, CniError, Invocation
from ipamd.cni.ipam import ERR_IPAMD, allocate, ask
from ipamd.cni.ipam import check as check_allocation
from ipamd.cni.ipam import delete as delete_allocation
from ipamd.cni.rtnl import NetlinkError, Netns
from ipamd.wire import PATH_ALLOCATIONS, Allocation
from ipamd.wire.fast import sha1
from ipamd.wire.pod import POLICY_SEGMENT, PolicyRequest, veth_name

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import IO

    from ipamd.cni.invocation import V4Egress

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
    """The allocation's one address, IPv4 or IPv6, without its prefix length."""
    if len(alloc.ips) != 1:
        raise CniError(ERR_IPAMD, "ipamd's answer holds not exactly one address", repr(alloc.ips))
    return alloc.ips[0].address.partition("/")[0]


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
    conf = inv.conf.interface
    assert conf is not None
    if conf.v4_egress is not None and conf.v4_egress.ifname == inv.ifname:
        raise CniError(
            ERR_INVALID_CONFIG, "v4Egress.ifname must differ from CNI_IFNAME", inv.ifname
        )
    alloc = allocate(inv)
    address = _pod_address(alloc)
    host_name = host_veth_name(inv)
    try:
        made = pod_interface.set_up(host_name, inv.netns, inv.ifname, address, conf.mtu)
    except NetlinkError as err:
        raise CniError(ERR_INTERFACE, "cannot set up the pod's interface", str(err)) from None
    egress = conf.v4_egress if ":" in address else None
    made_egress = None if egress is None else _set_up_egress(inv, host_name, egress, conf.mtu, log)
    if alloc.network_policy is not None:
        try:
            _enforce_policy(inv)
        except CniError:
            if egress is not None:
                _remove_egress(inv, host_name, egress, log, in_netns=False)
            _remove(host_name, log)
            raise
    return interface_result(made, address, inv.netns, inv.conf.cni_version, made_egress)


def _set_up_egress(
    inv: Invocation, host_name: str, egress: V4Egress, mtu: int, log: IO[str]
) -> pod_interface.PodInterface:
    """host-local's address on the egress pair; on a failure, what this ADD made goes (both pairs,
    host-local's address) and the ADD fails with 106."""
    from ipamd.cni.egress import DelegateError, egress_veth_name, host_local_add

    try:
        v4 = host_local_add(inv, egress)
        return pod_interface.set_up(
            egress_veth_name(host_name), inv.netns, egress.ifname, v4, mtu, egress.gateway
        )
    except (NetlinkError, DelegateError) as err:
        _remove_egress(inv, host_name, egress, log, in_netns=False)
        _remove(host_name, log)
        raise CniError(ERR_INTERFACE, "cannot set up the pod's IPv4 egress", str(err)) from None


def _remove_egress(
    inv: Invocation, host_name: str, egress: V4Egress, log: IO[str], in_netns: bool
) -> None:
    """Removes the egress pair (inside the pod's namespace when `in_netns` and it opens, else by
    its host name) and releases host-local's address; a failure of either is a warning."""
    from ipamd.cni.egress import DelegateError, egress_veth_name, host_local_delete

    if not (in_netns and _remove_in_netns(inv.netns, egress.ifname)):
        _remove(egress_veth_name(host_name), log)
    try:
        host_local_delete(inv, egress)
    except DelegateError as err:
        print(f"ipamd-cni: cannot release the IPv4 egress address: {err}", file=log)


def interface_result(
    made: pod_interface.PodInterface,
    address: str,
    netns: str,
    version: str,
    egress: pod_interface.PodInterface | None = None,
) -> dict[str, object]:
    """The CNI result of the interface plugin in `version`'s shape (0.4.0's ips carry `version`);
    the egress pair, when made, listed after the pod's own, in no `ips`."""
    v6 = ":" in address
    gateway = pod_interface.POD_GATEWAY_V6 if v6 else pod_interface.POD_GATEWAY
    ip: dict[str, object] = {
        "address": f"{address}/{128 if v6 else 32}",
        "gateway": gateway,
        "interface": 1,
    }
    if version == "0.4.0":
        ip = {"version": "6" if v6 else "4", **ip}
    interfaces = [
        {"name": made.host_name, "mac": made.host_mac},
        {"name": made.pod_ifname, "mac": made.pod_mac, "sandbox": netns},
    ]
    if egress is not None:
        interfaces += [
            {"name": egress.host_name, "mac": egress.host_mac},
            {"name": egress.pod_ifname, "mac": egress.pod_mac, "sandbox": netns},
        ]
    return {
        "cniVersion": version,
        "interfaces": interfaces,
        "ips": [ip],
        "routes": [{"dst": "::/0" if v6 else "0.0.0.0/0", "gw": gateway}],
    }


def _remove_in_netns(netns_path: str, ifname: str) -> bool:
    """Deletes `ifname` inside the namespace; False when the namespace or the link is not there."""
    if not netns_path:
        return False
    try:
        with Netns(netns_path) as netns:
            pod, _index = netns.socket_and_index(ifname)
            with pod:
                return pod.delete_link(ifname)
    except NetlinkError:
        return False


def delete(inv: Invocation, log: IO[str]) -> None:
    assert inv.conf.interface is not None
    try:
        delete_allocation(inv, log)
    finally:
        host_name = host_veth_name(inv)
        if not _remove_in_netns(inv.netns, inv.ifname):
            _remove(host_name, log)
        egress = inv.conf.interface.v4_egress
        if egress is not None:
            _remove_egress(inv, host_name, egress, log, in_netns=True)


def check(inv: Invocation, log: IO[str]) -> None:
    assert inv.conf.interface is not None
    check_allocation(inv, log)
    host_name = host_veth_name(inv)
    names = [host_name]
    if inv.conf.interface.v4_egress is not None and _lists_ipv6(inv.conf.prev_result):
        from ipamd.cni.egress import egress_veth_name

        names.append(egress_veth_name(host_name))
    for name in names:
        if not pod_interface.host_link_exists(name):
            raise CniError(ERR_INTERFACE, "the pod's host interface is missing", name)


def _lists_ipv6(prev: Mapping[str, object] | None) -> bool:
    ips = prev.get("ips") if prev is not None else None
    return any(
        isinstance(ip, dict) and ":" in str(ip.get("address", ""))
        for ip in (ips if isinstance(ips, list) else [])
    )


COMMANDS: dict[str, Callable[[Invocation, IO[str]], dict[str, object] | None]] = {
    "ADD": add,
    "DEL": delete,
    "CHECK": check,
}
