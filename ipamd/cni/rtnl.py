"""A minimal rtnetlink client for the interface plugin: the few requests that make a pod's veth.

It owns the wire format of those requests (struct-packed `nlmsghdr` + family header + attributes,
each sent with NLM_F_ACK and answered by the kernel's NLMSG_ERROR) and the switch into a pod's
network namespace (and the sysctls written there, `Netns.set_sysctls`); nothing about what a pod's
interface should look like (`ipamd.cni.pod_interface`).

Requests: a veth pair whose peer is created straight inside another namespace (IFLA_LINKINFO /
VETH_INFO_PEER carrying IFLA_NET_NS_FD), a link up, an address, a route (on-link or via a gateway,
always with RTA_OIF), a permanent neighbour, a link deleted by name. Addresses, routes and
neighbours are IPv4 or IPv6, the family read from the address's text; an IPv6 address is added with
IFA_F_NODAD (in IFA_FLAGS): it is the pod's alone, and duplicate address detection would hold it
unusable for a second. Address, route and neighbour use NLM_F_REPLACE, so a retried ADD rewrites
what a first attempt left.

A netlink socket stays in the namespace it was created in, whatever the process enters later: the
host socket is opened before entering the pod's namespace, the pod's socket inside it, and the
process goes back to the host namespace before doing anything else (`Netns.socket_and_index`).

Every failure is a `NetlinkError` carrying the errno (the kernel's answer, or the OSError's).

Cheap to import, as the plugin: `_socket` and `_struct` (the C modules under `socket` and `struct`,
which import `enum` and more), `os`; on a Python without `os.setns` (before 3.12), `_ctypes` (the C
module under `ctypes`, whose package costs every ADD a few milliseconds more), and only when a
namespace is entered.
"""

from __future__ import annotations

import os

from ipamd.wire.fast import pack, unpack_from
from ipamd.wire.fast import socket_core as _socket

NETLINK_ROUTE = 0
CLONE_NEWNET = 0x40000000

NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLM_F_REPLACE = 0x100
NLM_F_EXCL = 0x200
NLM_F_CREATE = 0x400
NLMSG_ERROR = 2
NLMSG_DONE = 3

RTM_NEWLINK = 16
RTM_DELLINK = 17
RTM_NEWADDR = 20
RTM_NEWROUTE = 24
RTM_NEWNEIGH = 28

AF_UNSPEC = 0
AF_INET = 2
AF_INET6 = 10
IFF_UP = 0x1

IFLA_ADDRESS = 1
IFLA_IFNAME = 3
IFLA_MTU = 4
IFLA_LINKINFO = 18
IFLA_NET_NS_FD = 28
IFLA_INFO_KIND = 1
IFLA_INFO_DATA = 2
VETH_INFO_PEER = 1

IFA_ADDRESS = 1
IFA_LOCAL = 2
IFA_FLAGS = 8
IFA_F_NODAD = 0x2

RTA_DST = 1
RTA_OIF = 4
RTA_GATEWAY = 5
RT_TABLE_MAIN = 254
RTPROT_BOOT = 3
"""What `ip route add` writes: a route an administrator (here, the plugin) configured."""
RT_SCOPE_UNIVERSE = 0
RT_SCOPE_LINK = 253
RTN_UNICAST = 1

NDA_DST = 1
NDA_LLADDR = 2
NUD_PERMANENT = 0x80

ENODEV = 19
EINVAL = 22
TIMEOUT_S = 5.0
"""The kernel answers at once; five seconds means a wedged rtnl lock."""
_HEADER = "=IHHII"
_HEADER_BYTES = 16
_RECV_BYTES = 65536


class NetlinkError(Exception):
    """A request the kernel refused, or a socket or namespace operation that failed."""

    def __init__(self, errno: int, what: str) -> None:
        super().__init__(f"{what}: {os.strerror(errno)} (errno {errno})")
        self.errno = errno
        self.what = what


# -- encoding --------------------------------------------------------------------------------------


def attr(kind: int, payload: bytes) -> bytes:
    """One `rtattr`: length, type, payload, padded to 4 bytes."""
    length = 4 + len(payload)
    return pack("=HH", length, kind) + payload + b"\0" * (-length % 4)


def name_attr(kind: int, name: str) -> bytes:
    return attr(kind, name.encode() + b"\0")


def u32_attr(kind: int, value: int) -> bytes:
    return attr(kind, pack("=I", value))


def ifinfomsg(index: int = 0, flags: int = 0, change: int = 0) -> bytes:
    return pack("=BxHiII", AF_UNSPEC, 0, index, flags, change)


def packed(address: str) -> tuple[int, bytes]:
    """The family and the bytes of an IPv4 (dotted quad) or IPv6 address (`NetlinkError` EINVAL
    for anything else)."""
    try:
        if ":" in address:
            return AF_INET6, _socket.inet_pton(AF_INET6, address)
        if address.count(".") == 3:
            return AF_INET, _socket.inet_aton(address)
    except OSError:
        pass
    raise NetlinkError(EINVAL, f"not an IP address: {address!r}")


def mac_bytes(mac: str) -> bytes:
    return bytes(int(part, 16) for part in mac.split(":"))


def veth_body(name: str, mac: str, mtu: int, peer: str, peer_mac: str, peer_netns_fd: int) -> bytes:
    """RTM_NEWLINK's body for a veth pair `name` (here) and `peer` (in the namespace of the fd)."""
    peer_info = (
        ifinfomsg()
        + name_attr(IFLA_IFNAME, peer)
        + attr(IFLA_ADDRESS, mac_bytes(peer_mac))
        + u32_attr(IFLA_MTU, mtu)
        + u32_attr(IFLA_NET_NS_FD, peer_netns_fd)
    )
    linkinfo = attr(IFLA_INFO_KIND, b"veth") + attr(IFLA_INFO_DATA, attr(VETH_INFO_PEER, peer_info))
    return (
        ifinfomsg()
        + name_attr(IFLA_IFNAME, name)
        + attr(IFLA_ADDRESS, mac_bytes(mac))
        + u32_attr(IFLA_MTU, mtu)
        + attr(IFLA_LINKINFO, linkinfo)
    )


def address_body(index: int, address: str, prefix_len: int) -> bytes:
    """RTM_NEWADDR's body: an address on link `index`; an IPv6 one without duplicate detection."""
    family, raw = packed(address)
    flags = IFA_F_NODAD if family == AF_INET6 else 0
    head = pack("=BBBBI", family, prefix_len, flags, RT_SCOPE_UNIVERSE, index)
    body = head + attr(IFA_LOCAL, raw) + attr(IFA_ADDRESS, raw)
    return body + (u32_attr(IFA_FLAGS, flags) if flags else b"")


def route_body(index: int, dst: str, dst_len: int, gateway: str | None = None) -> bytes:
    """RTM_NEWROUTE's body: `dst/dst_len` in the main table out of link `index`, on-link (scope
    link) without a gateway, via `gateway` (scope universe, same family) with one."""
    family, raw_dst = packed(dst)
    scope = RT_SCOPE_LINK if gateway is None else RT_SCOPE_UNIVERSE
    head = pack(
        "=BBBBBBBBI", family, dst_len, 0, 0, RT_TABLE_MAIN, RTPROT_BOOT, scope, RTN_UNICAST, 0
    )
    body = head + (attr(RTA_DST, raw_dst) if dst_len else b"")
    if gateway is not None:
        gw_family, raw_gw = packed(gateway)
        if gw_family != family:
            raise NetlinkError(EINVAL, f"gateway {gateway} is not of {dst}'s family")
        body += attr(RTA_GATEWAY, raw_gw)
    return body + u32_attr(RTA_OIF, index)


def neighbour_body(index: int, address: str, mac: str) -> bytes:
    """RTM_NEWNEIGH's body: a permanent neighbour `address` at `mac` on link `index`."""
    family, raw = packed(address)
    head = pack("=BxxxiHBB", family, index, NUD_PERMANENT, 0, 0)
    return head + attr(NDA_DST, raw) + attr(NDA_LLADDR, mac_bytes(mac))


def message(kind: int, flags: int, seq: int, body: bytes) -> bytes:
    """The whole request: `nlmsghdr` (always NLM_F_REQUEST | NLM_F_ACK), then the body."""
    flags |= NLM_F_REQUEST | NLM_F_ACK
    return pack(_HEADER, _HEADER_BYTES + len(body), kind, flags, seq, 0) + body


def ack_errno(data: bytes, seq: int) -> int | None:
    """The errno of the kernel's acknowledgement of request `seq` in `data` (0: done), or None
    when `data` holds no answer to it."""
    offset = 0
    while offset + _HEADER_BYTES <= len(data):
        length, kind, _flags, got, _pid = unpack_from(_HEADER, data, offset)
        if length < _HEADER_BYTES:
            break
        if got == seq and kind == NLMSG_ERROR:
            (error,) = unpack_from("=i", data, offset + _HEADER_BYTES)
            return int(-error)
        if got == seq and kind == NLMSG_DONE:
            return 0
        offset += (length + 3) & ~3
    return None


# -- the socket ------------------------------------------------------------------------------------


class Netlink:
    """One NETLINK_ROUTE socket, in the namespace the process was in when it was made."""

    def __init__(self) -> None:
        try:
            self._sock = _socket.socket(_socket.AF_NETLINK, _socket.SOCK_RAW, NETLINK_ROUTE)
        except OSError as err:
            raise NetlinkError(err.errno or 0, "netlink socket") from None
        self._sock.settimeout(TIMEOUT_S)
        self._seq = 0

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Netlink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, kind: int, flags: int, body: bytes, what: str) -> None:
        """Sends one request and waits for its acknowledgement; raises `NetlinkError`."""
        self._seq += 1
        try:
            self._sock.send(message(kind, flags, self._seq, body))
            while True:
                errno = ack_errno(self._sock.recv(_RECV_BYTES), self._seq)
                if errno is not None:
                    break
        except OSError as err:
            raise NetlinkError(err.errno or 0, what) from None
        if errno:
            raise NetlinkError(errno, what)

    def create_veth(
        self, name: str, mac: str, mtu: int, peer: str, peer_mac: str, peer_netns_fd: int
    ) -> None:
        body = veth_body(name, mac, mtu, peer, peer_mac, peer_netns_fd)
        self.request(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, body, f"create veth {name}")

    def set_up(self, index: int) -> None:
        body = ifinfomsg(index, IFF_UP, IFF_UP)
        self.request(RTM_NEWLINK, 0, body, f"set link {index} up")

    def add_address(self, index: int, address: str, prefix_len: int) -> None:
        body = address_body(index, address, prefix_len)
        what = f"add address {address}/{prefix_len} to link {index}"
        self.request(RTM_NEWADDR, NLM_F_CREATE | NLM_F_REPLACE, body, what)

    def add_route(self, index: int, dst: str, dst_len: int, gateway: str | None = None) -> None:
        body = route_body(index, dst, dst_len, gateway)
        via = "" if gateway is None else f" via {gateway}"
        what = f"add route {dst}/{dst_len}{via} dev {index}"
        self.request(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_REPLACE, body, what)

    def add_neighbour(self, index: int, address: str, mac: str) -> None:
        body = neighbour_body(index, address, mac)
        what = f"add neighbour {address} lladdr {mac} dev {index}"
        self.request(RTM_NEWNEIGH, NLM_F_CREATE | NLM_F_REPLACE, body, what)

    def delete_link(self, name: str) -> bool:
        """Deletes link `name` (a veth's peer goes with it); False if there was none."""
        try:
            body = ifinfomsg() + name_attr(IFLA_IFNAME, name)
            self.request(RTM_DELLINK, 0, body, f"delete link {name}")
        except NetlinkError as err:
            if err.errno == ENODEV:
                return False
            raise
        return True


def link_index(name: str) -> int:
    """The ifindex of `name` in the namespace the process is in now."""
    try:
        return _socket.if_nametoindex(name)
    except OSError as err:
        raise NetlinkError(err.errno or ENODEV, f"find link {name}") from None


# -- namespaces ------------------------------------------------------------------------------------


def _setns(fd: int, what: str) -> None:
    setns = getattr(os, "setns", None)
    if setns is not None:
        try:
            setns(fd, CLONE_NEWNET)
        except OSError as err:
            raise NetlinkError(err.errno or 0, what) from None
        return
    # Before Python 3.12: libc's setns(2), already loaded by the interpreter, called as
    # `ctypes.CDLL(None, use_errno=True).setns` would call it, through `_ctypes` alone.
    import _ctypes

    class _CInt(_ctypes._SimpleCData):  # type: ignore[type-arg]  # generic in the stubs only
        _type_ = "i"

    class _Function(_ctypes.CFuncPtr):
        _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
        _restype_ = _CInt

    libc = _ctypes.dlopen(None, os.RTLD_NOW)  # type: ignore[arg-type]  # None: the process itself
    libc_setns = _Function(_ctypes.dlsym(libc, "setns"))
    if libc_setns(fd, CLONE_NEWNET) != 0:
        raise NetlinkError(_ctypes.get_errno(), what)


class Netns:
    """A network namespace held open by path (CNI_NETNS), for as long as the plugin needs it."""

    def __init__(self, path: str) -> None:
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as err:
            raise NetlinkError(err.errno or 0, f"open netns {path}") from None
        self.path = path

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> Netns:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def socket_and_index(self, ifname: str) -> tuple[Netlink, int]:
        """A netlink socket inside this namespace and the ifindex of `ifname` there; the process
        is back in its own namespace when this returns, or raises."""
        home = self._enter()
        sock: Netlink | None = None
        try:
            sock = Netlink()
            index = link_index(ifname)
        except NetlinkError:
            if sock is not None:
                sock.close()
            raise
        finally:
            _leave(home)
        return sock, index

    def set_sysctls(self, knobs: tuple[tuple[str, str], ...]) -> None:
        """`set_sysctl` of each (path, value) inside this namespace (/proc/sys/net is the
        namespace of the thread that opens it); back in the process's own when this returns."""
        home = self._enter()
        try:
            for path, value in knobs:
                set_sysctl(path, value)
        finally:
            _leave(home)

    def _enter(self) -> int:
        """Enters this namespace; returns an fd of the one the thread was in (for `_leave`)."""
        try:
            home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as err:
            raise NetlinkError(err.errno or 0, "open the host netns") from None
        try:
            _setns(self.fd, f"enter netns {self.path}")
        except NetlinkError:
            os.close(home)
            raise
        return home


def _leave(home: int) -> None:
    try:
        _setns(home, "return to the host netns")
    finally:
        os.close(home)


def set_sysctl(path: str, value: str) -> None:
    """Writes `value` to `/proc/sys/<path>` when it holds something else, in the namespace the
    thread is in now; raises `NetlinkError`."""
    full = f"/proc/sys/{path}"
    try:
        with open(full, "rb") as knob:
            if knob.read().strip() == value.encode():
                return
        with open(full, "wb") as knob:
            knob.write(value.encode())
    except OSError as err:
        raise NetlinkError(err.errno or 0, f"set {full} to {value}") from None
