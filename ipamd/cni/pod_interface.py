"""A pod's interface as the interface plugin makes it: VPC CNI's shape, through `ipamd.cni.rtnl`.

Host side: a veth named by the caller (VPC CNI's `eni` + 11 hex digits), up, with the conf's MTU and
a random locally administered MAC; a main-table route `<pod>/32 dev <veth> scope link` and a
permanent neighbour `<pod> lladdr <pod's MAC> dev <veth>`.
Pod side (the veth's peer, created straight inside the pod's namespace under CNI_IFNAME): the /32
address, up, the same MTU, `169.254.1.1 dev eth0 scope link`, `default via 169.254.1.1 dev eth0`
and a permanent neighbour `169.254.1.1 lladdr <host veth's MAC>`. The pod's next hop is a
link-local address nobody holds: every packet the pod sends goes to the host's veth, which routes
it; no ARP is ever needed either way. The host namespace forwards IPv4 (`net.ipv4.ip_forward`, set
when it is not), as `ptp`, the interface plugin this one replaces, makes sure of on every ADD.

An IPv6 address (VPC CNI's IPv6 mode) gets the same shape with /128 and `fe80::1` as the next hop:
IPv6 is enabled in the pod's namespace (`all` and the interface's `disable_ipv6` = 0: a runtime may
create it disabled), the address is added without duplicate detection, and the host forwards IPv6
(`net.ipv6.conf.all.forwarding`). The host veth's `accept_ra` is 0: a pod must not configure the
node's routes with router advertisements. Its `accept_redirects` is left alone: the kernel ignores
an IPv6 redirect on an interface that forwards, and the only route over the veth, the pod's /128,
has no gateway a redirect could replace. IPv6 needs an MTU of 1280 or more.

`set_up` takes another next hop too: the IPv4 egress pair of an IPv6 pod (`ipamd.cni.egress`) is
this shape with its subnet's first address as the gateway.

`set_up` is idempotent for a retried ADD: a host veth already there under the same name (an
earlier attempt for the pod) is deleted first, which removes its peer, routes and neighbours.
If a step fails, the veth made so far is deleted (its peer, routes and neighbours go with it)
before the error goes up. The policy rules the pod's traffic needs are the daemon's, not this
module's.
"""

from __future__ import annotations

import os

from ipamd.cni.rtnl import EINVAL, Netlink, NetlinkError, Netns, link_index, set_sysctl

POD_GATEWAY = "169.254.1.1"
"""The pod's next hop: link-local, answered by the host veth's MAC through a static neighbour."""
POD_GATEWAY_V6 = "fe80::1"
"""An IPv6 pod's next hop, as VPC CNI's: link-local, answered the same way."""
IP_FORWARD = "net/ipv4/ip_forward"
"""Per network namespace: the plugin's own (the host's) when it opens it."""
IPV6_FORWARD = "net/ipv6/conf/all/forwarding"
MIN_IPV6_MTU = 1280


class PodInterface:
    """What `set_up` made: the names and MACs the CNI result reports."""

    __slots__ = ("host_mac", "host_name", "pod_ifname", "pod_mac")

    def __init__(self, host_name: str, host_mac: str, pod_ifname: str, pod_mac: str) -> None:
        self.host_name = host_name
        self.host_mac = host_mac
        self.pod_ifname = pod_ifname
        self.pod_mac = pod_mac


def random_mac() -> str:
    """A random unicast, locally administered MAC (the kernel's own choice for a veth is too, but
    the plugin needs the pod side's before it can read it back)."""
    raw = bytearray(os.urandom(6))
    raw[0] = (raw[0] & 0xFE) | 0x02
    return ":".join(f"{b:02x}" for b in raw)


def set_up(
    host_name: str,
    netns_path: str,
    ifname: str,
    address: str,
    mtu: int,
    gateway: str | None = None,
) -> PodInterface:
    """The pod's veth pair for `address` (no prefix: a /32 or /128) with next hop `gateway` (by
    default the family's own), as the module says. Raises `NetlinkError` after removing whatever
    it made."""
    v6 = ":" in address
    if v6 and mtu < MIN_IPV6_MTU:
        raise NetlinkError(EINVAL, f"IPv6 needs an MTU of {MIN_IPV6_MTU} or more, not {mtu}")
    made = PodInterface(host_name, random_mac(), ifname, random_mac())
    set_sysctl(IPV6_FORWARD if v6 else IP_FORWARD, "1")
    with Netlink() as host, Netns(netns_path) as netns:
        host.delete_link(host_name)
        host.create_veth(host_name, made.host_mac, mtu, ifname, made.pod_mac, netns.fd)
        try:
            if v6:
                _enable_ipv6(netns, made)
            _configure(
                host, netns, made, address, gateway or (POD_GATEWAY_V6 if v6 else POD_GATEWAY)
            )
        except NetlinkError:
            host.delete_link(host_name)
            raise
    return made


def _enable_ipv6(netns: Netns, made: PodInterface) -> None:
    netns.set_sysctls(
        (
            ("net/ipv6/conf/all/disable_ipv6", "0"),
            (f"net/ipv6/conf/{made.pod_ifname}/disable_ipv6", "0"),
        )
    )
    set_sysctl(f"net/ipv6/conf/{made.host_name}/accept_ra", "0")


def _configure(host: Netlink, netns: Netns, made: PodInterface, address: str, gateway: str) -> None:
    full, default = (128, "::") if ":" in address else (32, "0.0.0.0")
    pod, pod_index = netns.socket_and_index(made.pod_ifname)
    with pod:
        pod.set_up(pod_index)
        pod.add_address(pod_index, address, full)
        pod.add_route(pod_index, gateway, full)
        pod.add_route(pod_index, default, 0, gateway)
        pod.add_neighbour(pod_index, gateway, made.host_mac)
    host_index = link_index(made.host_name)
    host.set_up(host_index)
    host.add_route(host_index, address, full)
    host.add_neighbour(host_index, address, made.pod_mac)


def tear_down(host_name: str) -> bool:
    """Deletes the pod's host veth (the pod's end, routes and neighbours go with it); False when
    there was none. Raises `NetlinkError`."""
    with Netlink() as host:
        return host.delete_link(host_name)


def host_link_exists(host_name: str) -> bool:
    try:
        link_index(host_name)
    except NetlinkError:
        return False
    return True
