"""The rtnetlink requests `ipamd.cni.rtnl` sends, decoded field by field as the kernel reads them,
and the acknowledgement it reads back."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from ipamd.cni import rtnl as nl


def attrs(data: bytes) -> dict[int, bytes]:
    """Attribute type -> payload, of a run of rtattrs (each padded to 4 bytes)."""
    found: dict[int, bytes] = {}
    offset = 0
    while offset < len(data):
        length, kind = struct.unpack_from("=HH", data, offset)
        assert length >= 4
        found[kind] = data[offset + 4 : offset + length]
        offset += (length + 3) & ~3
    assert offset == len(data), "padded to the end"
    return found


def test_a_message_carries_its_length_request_and_ack_flags() -> None:
    msg = nl.message(nl.RTM_NEWADDR, nl.NLM_F_CREATE, 7, b"\0" * 8)
    length, kind, flags, seq, pid = struct.unpack_from("=IHHII", msg)
    assert (length, kind, seq, pid) == (24, nl.RTM_NEWADDR, 7, 0)
    assert flags == nl.NLM_F_REQUEST | nl.NLM_F_ACK | nl.NLM_F_CREATE


def test_an_attribute_is_padded_to_four_bytes() -> None:
    assert nl.attr(3, b"abcde") == struct.pack("=HH", 9, 3) + b"abcde\0\0\0"
    assert nl.name_attr(3, "eth0") == struct.pack("=HH", 9, 3) + b"eth0\0\0\0\0"


def test_the_veth_request_puts_the_peer_in_the_namespace_with_its_name_mac_and_mtu() -> None:
    body = nl.veth_body("eni0123456789a", "02:00:00:00:00:01", 9001, "eth0", "02:aa:bb:cc:dd:ee", 5)
    top = attrs(body[16:])
    assert top[nl.IFLA_IFNAME] == b"eni0123456789a\0"
    assert top[nl.IFLA_ADDRESS] == bytes([2, 0, 0, 0, 0, 1])
    assert struct.unpack("=I", top[nl.IFLA_MTU]) == (9001,)
    info = attrs(top[nl.IFLA_LINKINFO])
    assert info[nl.IFLA_INFO_KIND] == b"veth"
    peer = attrs(info[nl.IFLA_INFO_DATA])[nl.VETH_INFO_PEER]
    peer_attrs = attrs(peer[16:])  # the peer's own ifinfomsg first
    assert peer_attrs[nl.IFLA_IFNAME] == b"eth0\0"
    assert peer_attrs[nl.IFLA_ADDRESS] == bytes.fromhex("02aabbccddee")
    assert struct.unpack("=I", peer_attrs[nl.IFLA_NET_NS_FD]) == (5,)
    assert struct.unpack("=I", peer_attrs[nl.IFLA_MTU]) == (9001,)


def test_link_up_sets_and_changes_only_iff_up() -> None:
    family, kind, index, flags, change = struct.unpack(
        "=BxHiII", nl.ifinfomsg(4, nl.IFF_UP, nl.IFF_UP)
    )
    assert (family, kind, index, flags, change) == (nl.AF_UNSPEC, 0, 4, 1, 1)


def test_an_address_is_local_and_peer_with_its_prefix_length() -> None:
    body = nl.address_body(3, "10.0.1.23", 32)
    assert struct.unpack_from("=BBBBI", body) == (nl.AF_INET, 32, 0, nl.RT_SCOPE_UNIVERSE, 3)
    found = attrs(body[8:])
    assert found[nl.IFA_LOCAL] == found[nl.IFA_ADDRESS] == bytes([10, 0, 1, 23])


def test_an_on_link_route_has_scope_link_and_a_gateway_route_scope_universe() -> None:
    on_link = nl.route_body(3, "169.254.1.1", 32)
    head = struct.unpack_from("=BBBBBBBBI", on_link)
    assert head == (nl.AF_INET, 32, 0, 0, nl.RT_TABLE_MAIN, nl.RTPROT_BOOT, nl.RT_SCOPE_LINK, 1, 0)
    assert attrs(on_link[12:]) == {
        nl.RTA_DST: bytes([169, 254, 1, 1]),
        nl.RTA_OIF: struct.pack("=I", 3),
    }
    default = nl.route_body(3, "0.0.0.0", 0, "169.254.1.1")
    assert struct.unpack_from("=BBBBBBBBI", default)[1] == 0
    assert struct.unpack_from("=BBBBBBBBI", default)[6] == nl.RT_SCOPE_UNIVERSE
    assert attrs(default[12:]) == {
        nl.RTA_GATEWAY: bytes([169, 254, 1, 1]),
        nl.RTA_OIF: struct.pack("=I", 3),
    }, "a default route carries no RTA_DST"


def test_a_neighbour_is_permanent() -> None:
    body = nl.neighbour_body(7, "10.0.1.23", "02:00:00:00:00:09")
    family, index, state, flags, kind = struct.unpack_from("=BxxxiHBB", body)
    assert (family, index, state, flags, kind) == (nl.AF_INET, 7, nl.NUD_PERMANENT, 0, 0)
    assert attrs(body[12:]) == {
        nl.NDA_DST: bytes([10, 0, 1, 23]),
        nl.NDA_LLADDR: bytes.fromhex("020000000009"),
    }


def test_a_bad_address_is_refused_before_the_kernel_sees_it() -> None:
    for bad in ("10.0.1", "10.0.1.256", "010.0.1.2x", "fe80::1::2", "2001:db8::g", ""):
        with pytest.raises(nl.NetlinkError) as caught:
            nl.packed(bad)
        assert caught.value.errno == nl.EINVAL


def test_the_family_is_read_from_the_address() -> None:
    assert nl.packed("10.0.1.23") == (nl.AF_INET, bytes([10, 0, 1, 23]))
    assert nl.packed("fe80::1") == (nl.AF_INET6, bytes.fromhex("fe80" + "00" * 13 + "01"))


V6 = "2001:db8:1:2:3::5"
V6_BYTES = bytes.fromhex("20010db8000100020003000000000005")


def test_an_ipv6_address_is_added_without_duplicate_detection() -> None:
    body = nl.address_body(3, V6, 128)
    family, length, flags, scope, index = struct.unpack_from("=BBBBI", body)
    assert (family, length, flags, scope, index) == (nl.AF_INET6, 128, nl.IFA_F_NODAD, 0, 3)
    found = attrs(body[8:])
    assert found[nl.IFA_LOCAL] == found[nl.IFA_ADDRESS] == V6_BYTES
    assert struct.unpack("=I", found[nl.IFA_FLAGS]) == (nl.IFA_F_NODAD,)
    assert nl.IFA_FLAGS not in attrs(nl.address_body(3, "10.0.1.23", 32)[8:]), "IPv4: no flags"


def test_ipv6_routes_on_link_and_via_fe80_1() -> None:
    on_link = nl.route_body(4, "fe80::1", 128)
    head = struct.unpack_from("=BBBBBBBBI", on_link)
    assert head == (
        nl.AF_INET6,
        128,
        0,
        0,
        nl.RT_TABLE_MAIN,
        nl.RTPROT_BOOT,
        nl.RT_SCOPE_LINK,
        1,
        0,
    )
    assert attrs(on_link[12:])[nl.RTA_DST] == nl.packed("fe80::1")[1]
    default = nl.route_body(4, "::", 0, "fe80::1")
    assert struct.unpack_from("=BBBBBBBBI", default)[:2] == (nl.AF_INET6, 0)
    assert attrs(default[12:]) == {
        nl.RTA_GATEWAY: nl.packed("fe80::1")[1],
        nl.RTA_OIF: struct.pack("=I", 4),
    }


def test_a_gateway_of_the_other_family_is_refused() -> None:
    with pytest.raises(nl.NetlinkError) as caught:
        nl.route_body(4, "::", 0, "169.254.1.1")
    assert caught.value.errno == nl.EINVAL


def test_an_ipv6_neighbour_is_permanent() -> None:
    body = nl.neighbour_body(7, V6, "02:00:00:00:00:09")
    family, index, state, _flags, _kind = struct.unpack_from("=BxxxiHBB", body)
    assert (family, index, state) == (nl.AF_INET6, 7, nl.NUD_PERMANENT)
    assert attrs(body[12:]) == {
        nl.NDA_DST: V6_BYTES,
        nl.NDA_LLADDR: bytes.fromhex("020000000009"),
    }


def test_a_sysctl_is_written_only_when_it_differs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    knob = tmp_path / "net" / "ipv4" / "ip_forward"
    knob.parent.mkdir(parents=True)
    knob.write_text("1\n")
    real_open = open
    writes: list[str] = []

    def fake_open(path: str, mode: str = "r") -> object:
        if "w" in mode:
            writes.append(path)
        return real_open(path.replace("/proc/sys", str(tmp_path)), mode)

    monkeypatch.setattr(nl, "open", fake_open, raising=False)  # the module's, not pytest's
    nl.set_sysctl("net/ipv4/ip_forward", "1")
    assert writes == [], "already 1"
    nl.set_sysctl("net/ipv4/ip_forward", "0")
    assert writes == ["/proc/sys/net/ipv4/ip_forward"] and knob.read_text() == "0"
    with pytest.raises(nl.NetlinkError) as caught:
        nl.set_sysctl("net/ipv6/conf/nowhere/accept_ra", "0")
    assert caught.value.errno == 2 and "accept_ra" in str(caught.value)


def ack(seq: int, error: int) -> bytes:
    return (
        struct.pack("=IHHII", 36, nl.NLMSG_ERROR, 0, seq, 0) + struct.pack("=i", error) + b"\0" * 16
    )


def test_the_ack_of_the_request_gives_its_errno() -> None:
    assert nl.ack_errno(ack(4, 0), 4) == 0
    assert nl.ack_errno(ack(4, -17), 4) == 17
    assert nl.ack_errno(ack(3, -17), 4) is None, "another request's answer"
    assert nl.ack_errno(ack(3, 0) + ack(4, -19), 4) == 19, "read past the earlier one"
    assert nl.ack_errno(b"", 4) is None


def test_the_error_names_the_request_and_keeps_the_errno() -> None:
    err = nl.NetlinkError(17, "create veth eni0")
    assert err.errno == 17 and "create veth eni0" in str(err) and "File exists" in str(err)
