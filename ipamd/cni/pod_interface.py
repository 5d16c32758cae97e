"""A pod's interface as the interface plugin makes it: VPC CNI's shape, through `ipamd.cni.netlink`.

Host side: a veth named by the caller (VPC CNI's `eni` + 11 hex digits), up, with the conf's MTU and
a random locally administered MAC; a main-table route `<pod>/32 dev <veth> scope link` and a
permanent neighbour `<pod> lladdr <pod's MAC> dev <veth>`.
Pod side (the veth's peer, created straight inside the pod's namespace under CNI_IFNAME): the /32
address, up, the same MTU, `169.254.1.1 dev eth0 scope link`, `default via 169.254.1.1 dev eth0`
and a permanent neighbour `169.254.1.1 lladdr <host veth's MAC>`. The pod's next hop is a
link-local address nobody holds: every packet the pod sends goes to the host's veth, which routes
it; no ARP is ever needed either way. The host namespace forwards IPv4 (`net.ipv4.ip_forward`, set
when it is not), as `ptp`, the interface plugin this one replaces, makes sure of on every ADD.

`set_up` is idempotent for a retried ADD: a host veth already there under the same name (an
earlier attempt for the pod) is deleted first, which removes its peer, routes and neighbours.
If a step fails, the veth made so far is deleted (its peer, routes and neighbours go with it)
before the error goes up. The policy rules the pod's traffic needs are the daemon's, not this
module's.
"""

from __future__ import annotations

import os

from ipamd.cni.netlink import Netlink, NetlinkError, Netns, link_index

POD_GATEWAY = "169.254.1.1"
"""The pod's next hop: link-local, answered by the host veth's MAC through a static neighbour."""
IP_FORWARD = "/proc/sys/net/ipv4/ip_forward"
"""Per network namespace: the plugin's own (the host's) when it opens it."""


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


def set_up(host_name: str, netns_path: str, ifname: str, address: str, mtu: int) -> PodInterface:
    """The pod's veth pair for IPv4 `address` (no prefix: a /32), as the module says. Raises
    `NetlinkError` after removing whatever it made."""
    made = PodInterface(host_name, random_mac(), ifname, random_mac())
    _forward_ipv4()
    with Netlink() as host, Netns(netns_path) as netns:
        host.delete_link(host_name)
        host.create_veth(host_name, made.host_mac, mtu, ifname, made.pod_mac, netns.fd)
        try:
            _configure(host, netns, made, address)
        except NetlinkError:
            host.delete_link(host_name)
            raise
    return made


def _forward_ipv4() -> None:
    try:
        with open(IP_FORWARD, "rb") as knob:
            on = knob.read(1) == b"1"
        if not on:
            with open(IP_FORWARD, "wb") as knob:
                knob.write(b"1")
    except OSError as err:
        raise NetlinkError(err.errno or 0, f"enable {IP_FORWARD}") from None


def _configure(host: Netlink, netns: Netns, made: PodInterface, address: str) -> None:
    pod, pod_index = netns.socket_and_index(made.pod_ifname)
    with pod:
        pod.set_up(pod_index)
        pod.add_address(pod_index, address, 32)
        pod.add_route(pod_index, POD_GATEWAY, 32)
        pod.add_route(pod_index, "0.0.0.0", 0, POD_GATEWAY)
        pod.add_neighbour(pod_index, POD_GATEWAY, made.host_mac)
    host_index = link_index(made.host_name)
    host.set_up(host_index)
    host.add_route(host_index, address, 32)
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
