"""The IPv4 egress of an IPv6 pod: the `v4Egress` block (CNI code 7 naming the key), the egress
veth's name, host-local executed as a CNI plugin (its conf, environment and answers), and the
interface plugin's result for an IPv6 pod with and without the egress pair."""

from __future__ import annotations

import io
import json
import stat
from pathlib import Path

import pytest

from ipamd.cni import egress
from ipamd.cni.invocation import (
    CniError,
    Invocation,
    V4Egress,
    parse_conf,
    parse_invocation,
    parse_v4_egress,
)
from ipamd.cni.pod_interface import PodInterface
from ipamd.cni.pod_plugin import add, interface_result

BLOCK = {"ifname": "v4if0", "subnet": "169.254.172.0/22", "dataDir": "/run/ipamd/v4egress"}
ENV = {
    "CNI_CONTAINERID": "c1",
    "CNI_IFNAME": "eth0",
    "CNI_NETNS": "/var/run/netns/p1",
    "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web",
}


def conf(version: str = "1.0.0", **fields: object) -> bytes:
    base: dict[str, object] = {"cniVersion": version, "name": "aws-cni", "type": "ipamd-cni"}
    ipam = {"type": "ipamd-cni", "socket": "/nonexistent/ipamd.sock"}
    return json.dumps({**base, "ipam": ipam, **fields}).encode()


def invocation(command: str, raw: bytes, **env: str) -> Invocation:
    environ = {**ENV, **env}
    return parse_invocation(command, parse_conf(command, raw, environ), environ)


def test_the_block_is_read_with_its_subnets_first_address_as_the_gateway() -> None:
    parsed = parse_conf("ADD", conf(v4Egress=BLOCK), {}).interface
    assert parsed is not None and parsed.v4_egress is not None
    got = parsed.v4_egress
    assert (got.ifname, got.subnet, got.gateway, got.data_dir) == (
        "v4if0",
        "169.254.172.0/22",
        "169.254.172.1",
        "/run/ipamd/v4egress",
    )
    assert parse_v4_egress({**BLOCK, "subnet": "10.9.0.0/30"}).gateway == "10.9.0.1"


def test_without_the_block_there_is_no_egress() -> None:
    parsed = parse_conf("ADD", conf(), {}).interface
    assert parsed is not None and parsed.v4_egress is None


@pytest.mark.parametrize("key", ["ifname", "subnet", "dataDir"])
def test_a_missing_key_is_code_7_naming_it(key: str) -> None:
    block = {k: v for k, v in BLOCK.items() if k != key}
    with pytest.raises(CniError) as caught:
        parse_conf("ADD", conf(v4Egress=block), {})
    assert caught.value.code == 7 and f"v4Egress.{key}" in caught.value.msg
    assert caught.value.version == "1.0.0"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("ifname", ""),
        ("ifname", "v4/if"),
        ("ifname", 4),
        ("subnet", "169.254.172.1/22"),
        ("subnet", "169.254.172.0/31"),
        ("subnet", "169.254.172.0/0"),
        ("subnet", "169.254.172.0"),
        ("subnet", "169.254.172.0/x"),
        ("subnet", "169.254.172.010/22"),
        ("subnet", "fd00::/64"),
        ("subnet", 22),
        ("dataDir", "relative/dir"),
        ("dataDir", ""),
        ("dataDir", None),
    ],
)
def test_a_bad_value_is_code_7_naming_its_key(key: str, value: object) -> None:
    with pytest.raises(CniError) as caught:
        parse_conf("ADD", conf(v4Egress={**BLOCK, key: value}), {})
    assert caught.value.code == 7 and f"v4Egress.{key}" in caught.value.msg


@pytest.mark.parametrize("block", [None, "v4if0", ["v4if0"]])
def test_a_block_that_is_not_an_object_is_code_7(block: object) -> None:
    with pytest.raises(CniError) as caught:
        parse_conf("ADD", conf(v4Egress=block), {})
    assert caught.value.code == 7 and "v4Egress" in caught.value.msg


def test_the_egress_ifname_must_not_be_the_pods_before_ipamd_is_asked() -> None:
    inv = invocation("ADD", conf(v4Egress={**BLOCK, "ifname": "eth0"}))
    with pytest.raises(CniError) as caught:
        add(inv, io.StringIO())
    # Code 11 would mean the (absent) daemon was called first.
    assert caught.value.code == 7 and "v4Egress.ifname" in caught.value.msg


def test_the_egress_veth_is_named_from_the_pods_and_never_by_a_veth_prefix() -> None:
    assert egress.egress_veth_name("eni0123456789a") == "v4-0123456789a"
    assert egress.egress_veth_name("abcd0123456789a") == "v4-0123456789a"
    assert not egress.egress_veth_name("eni0123456789a").isalnum(), "vethPrefix is alphanumeric"


@pytest.mark.parametrize(
    ("version", "sent"), [("0.4.0", "0.4.0"), ("1.0.0", "1.0.0"), ("1.1.0", "1.0.0")]
)
def test_host_local_is_given_the_subnet_and_data_dir(version: str, sent: str) -> None:
    inv = invocation("ADD", conf(version, v4Egress=BLOCK))
    assert inv.conf.interface is not None and inv.conf.interface.v4_egress is not None
    assert egress.host_local_conf(inv, inv.conf.interface.v4_egress) == {
        "cniVersion": sent,
        "name": "aws-cni",
        "ipam": {
            "type": "host-local",
            "ranges": [[{"subnet": "169.254.172.0/22"}]],
            "dataDir": "/run/ipamd/v4egress",
        },
    }


def fake_host_local(directory: Path, body: str) -> Path:
    """A `host-local` in `directory`: a shell script that saves its stdin and environment beside
    itself, then runs `body`."""
    script = directory / "host-local"
    script.write_text(f'#!/bin/sh\ncat > "{directory}/stdin"\nenv > "{directory}/env"\n{body}\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def egress_invocation(command: str, cni_path: str, **env: str) -> tuple[Invocation, V4Egress]:
    inv = invocation(command, conf(v4Egress=BLOCK), CNI_PATH=cni_path, **env)
    assert inv.conf.interface is not None and inv.conf.interface.v4_egress is not None
    return inv, inv.conf.interface.v4_egress


def test_host_local_is_executed_as_a_cni_plugin_and_its_address_read(tmp_path: Path) -> None:
    answer = {
        "cniVersion": "1.0.0",
        "ips": [{"address": "169.254.172.7/22", "gateway": "169.254.172.1"}],
    }
    fake_host_local(tmp_path, f"echo '{json.dumps(answer)}'")
    inv, block = egress_invocation("ADD", f"/nonexistent:{tmp_path}")
    assert egress.host_local_add(inv, block) == "169.254.172.7"
    assert json.loads((tmp_path / "stdin").read_text()) == egress.host_local_conf(inv, block)
    env = dict(
        line.split("=", 1) for line in (tmp_path / "env").read_text().splitlines() if "=" in line
    )
    assert {
        k: env.get(k)
        for k in ("CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH")
    } == {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "c1",
        "CNI_NETNS": "/var/run/netns/p1",
        "CNI_IFNAME": "v4if0",
        "CNI_PATH": f"/nonexistent:{tmp_path}",
    }
    assert "CNI_ARGS" not in env, "the pod's CNI_ARGS are not host-local's"


def test_host_local_del_without_a_netns(tmp_path: Path) -> None:
    fake_host_local(tmp_path, "exit 0")
    inv, block = egress_invocation("DEL", str(tmp_path), CNI_NETNS="")
    egress.host_local_delete(inv, block)
    env = (tmp_path / "env").read_text()
    assert "CNI_COMMAND=DEL" in env and "CNI_NETNS" not in env


def test_host_locals_error_is_a_delegate_error_with_its_message(tmp_path: Path) -> None:
    error = {"cniVersion": "1.0.0", "code": 999, "msg": "no IP addresses available in range set"}
    fake_host_local(tmp_path, f"echo '{json.dumps(error)}'; exit 1")
    inv, block = egress_invocation("ADD", str(tmp_path))
    with pytest.raises(egress.DelegateError) as caught:
        egress.host_local_add(inv, block)
    assert "exit 1" in caught.value.msg and "no IP addresses available" in caught.value.msg


@pytest.mark.parametrize(
    "body",
    ["echo 'not json'", "echo '{\"ips\": []}'", 'echo \'{"ips": [{"address": "fd00::2/64"}]}\''],
)
def test_an_answer_without_an_ipv4_address_is_a_delegate_error(tmp_path: Path, body: str) -> None:
    fake_host_local(tmp_path, body)
    inv, block = egress_invocation("ADD", str(tmp_path))
    with pytest.raises(egress.DelegateError):
        egress.host_local_add(inv, block)


def test_no_host_local_in_cni_path_is_a_delegate_error(tmp_path: Path) -> None:
    (tmp_path / "host-local").write_text("not executable")
    inv, block = egress_invocation("ADD", f"{tmp_path}::/nonexistent")
    with pytest.raises(egress.DelegateError) as caught:
        egress.host_local_add(inv, block)
    assert "no host-local plugin in CNI_PATH" in caught.value.msg


def test_a_host_local_that_hangs_is_killed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_host_local(tmp_path, "exec sleep 60")
    monkeypatch.setattr(egress, "HOST_LOCAL_TIMEOUT_S", 0.3)
    inv, block = egress_invocation("ADD", str(tmp_path))
    with pytest.raises(egress.DelegateError) as caught:
        egress.host_local_add(inv, block)
    assert "did not finish" in caught.value.msg


MADE = PodInterface("eni0123456789a", "02:00:00:00:00:01", "eth0", "02:00:00:00:00:02")
V6 = "2001:db8:1:2:3::5"


def test_an_ipv6_pods_result_has_its_128_and_fe80_1() -> None:
    result = interface_result(MADE, V6, "/var/run/netns/p1", "1.0.0")
    assert result["ips"] == [{"address": f"{V6}/128", "gateway": "fe80::1", "interface": 1}]
    assert result["routes"] == [{"dst": "::/0", "gw": "fe80::1"}]
    assert result["interfaces"] == [
        {"name": "eni0123456789a", "mac": "02:00:00:00:00:01"},
        {"name": "eth0", "mac": "02:00:00:00:00:02", "sandbox": "/var/run/netns/p1"},
    ]
    old = interface_result(MADE, V6, "/var/run/netns/p1", "0.4.0")
    assert old["ips"] == [
        {"version": "6", "address": f"{V6}/128", "gateway": "fe80::1", "interface": 1}
    ]


def test_the_egress_pair_is_listed_after_the_pods_interface_and_in_no_ips() -> None:
    pair = PodInterface("v4-0123456789a", "02:00:00:00:00:03", "v4if0", "02:00:00:00:00:04")
    result = interface_result(MADE, V6, "/var/run/netns/p1", "1.1.0", pair)
    assert result["interfaces"] == [
        {"name": "eni0123456789a", "mac": "02:00:00:00:00:01"},
        {"name": "eth0", "mac": "02:00:00:00:00:02", "sandbox": "/var/run/netns/p1"},
        {"name": "v4-0123456789a", "mac": "02:00:00:00:00:03"},
        {"name": "v4if0", "mac": "02:00:00:00:00:04", "sandbox": "/var/run/netns/p1"},
    ]
    assert result["ips"] == [{"address": f"{V6}/128", "gateway": "fe80::1", "interface": 1}]


def test_a_refused_add_is_tried_again_after_host_locals_del(tmp_path: Path) -> None:
    answer = {"cniVersion": "1.0.0", "ips": [{"address": "169.254.172.9/22"}]}
    refusal = {"cniVersion": "1.0.0", "code": 999, "msg": "duplicate allocation is not allowed"}
    fake_host_local(
        tmp_path,
        f'echo "$CNI_COMMAND" >> "{tmp_path}/commands"\n'
        f'if [ "$CNI_COMMAND" = ADD ] && [ ! -e "{tmp_path}/refused" ]; then\n'
        f"  touch \"{tmp_path}/refused\"; echo '{json.dumps(refusal)}'; exit 1\nfi\n"
        f"[ \"$CNI_COMMAND\" = ADD ] && echo '{json.dumps(answer)}'\nexit 0",
    )
    inv, block = egress_invocation("ADD", str(tmp_path))
    assert egress.host_local_add(inv, block) == "169.254.172.9"
    assert (tmp_path / "commands").read_text().split() == ["ADD", "DEL", "ADD"]
