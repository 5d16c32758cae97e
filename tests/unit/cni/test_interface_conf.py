"""The interface plugin's config and names: the mode is the conf's own `type`; `vethPrefix` and `mtu`
are checked (CNI code 7); the host veth's name comes from CNI_ARGS, prevResult or the container ID;
the CNI result has VPC CNI's shape."""

from __future__ import annotations

import json

import pytest

from ipamd.cni.client import DaemonError
from ipamd.cni.invocation import CniError, Invocation, parse_conf, parse_invocation
from ipamd.cni.ipam import ERR_NETWORK_POLICY, from_daemon
from ipamd.cni.pod_interface import PodInterface
from ipamd.cni.pod_plugin import host_veth_name, interface_result
from ipamd.wire import CODE_NETWORK_POLICY_REFUSED, ErrorBody
from ipamd.wire.pod import veth_name

SOCKET = {"type": "ipamd-cni", "socket": "/run/ipamd/ipamd.sock"}
ENV = {
    "CNI_CONTAINERID": "c1",
    "CNI_IFNAME": "eth0",
    "CNI_NETNS": "/var/run/netns/p1",
    "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web",
}


def conf(**fields: object) -> bytes:
    base: dict[str, object] = {"cniVersion": "1.0.0", "name": "aws-cni", "type": "ipamd-cni"}
    return json.dumps({**base, "ipam": SOCKET, **fields}).encode()


def invocation(command: str, raw: bytes, **env: str) -> Invocation:
    environ = {**ENV, **env}
    return parse_invocation(command, parse_conf(command, raw, environ), environ)


def test_the_interface_plugin_defaults_to_vpc_cnis_prefix_and_mtu() -> None:
    parsed = parse_conf("ADD", conf(), {})
    assert parsed.interface is not None
    assert (parsed.interface.veth_prefix, parsed.interface.mtu) == ("eni", 9001)
    tuned = parse_conf("ADD", conf(vethPrefix="pod", mtu=1500), {}).interface
    assert tuned is not None and (tuned.veth_prefix, tuned.mtu) == ("pod", 1500)


def test_chained_under_ptp_it_stays_the_ipam_plugin() -> None:
    raw = conf(type="ptp", vethPrefix="toolong", mtu="x")  # not its settings to read
    assert parse_conf("ADD", raw, {}).interface is None


@pytest.mark.parametrize(
    "fields",
    [
        {"vethPrefix": "abcde"},
        {"vethPrefix": "eth"},
        {"vethPrefix": "lo"},
        {"vethPrefix": "vlan"},
        {"vethPrefix": ""},
        {"vethPrefix": 7},
        {"mtu": 575},
        {"mtu": 9002},
        {"mtu": "1500"},
        {"mtu": True},
    ],
)
def test_a_bad_interface_setting_is_code_7_in_the_confs_version(fields: dict[str, object]) -> None:
    with pytest.raises(CniError) as caught:
        parse_conf("ADD", conf(**fields), {})
    assert caught.value.code == 7 and caught.value.version == "1.0.0"


def test_the_host_veth_is_named_from_the_pod_as_vpc_cni_names_it() -> None:
    inv = invocation("ADD", conf())
    assert host_veth_name(inv) == veth_name("eni", "ns", "web")
    assert len(host_veth_name(inv)) == 14


def test_without_the_pods_name_the_container_id_names_the_veth() -> None:
    name = host_veth_name(invocation("ADD", conf(), CNI_ARGS="IgnoreUnknown=1"))
    assert name == "eni2f22765d049", "eni + sha1('c1')[:11]"
    other = host_veth_name(invocation("ADD", conf(), CNI_ARGS="", CNI_CONTAINERID="c2"))
    assert other != name, "another container, another veth"


def test_del_takes_the_name_from_prev_result_when_cni_args_do_not_parse() -> None:
    prev = {
        "interfaces": [
            {"name": "eth0", "mac": "02:00:00:00:00:02", "sandbox": "/var/run/netns/p1"},
            {"name": "enirecorded01", "mac": "02:00:00:00:00:01"},
        ]
    }
    inv = invocation("DEL", conf(prevResult=prev), CNI_ARGS="garbage")
    assert inv.pod is None, "a DEL never fails on CNI_ARGS"
    assert host_veth_name(inv) == "enirecorded01"
    named = invocation("DEL", conf(prevResult=prev))
    assert host_veth_name(named) == veth_name("eni", "ns", "web"), "CNI_ARGS first"


def test_the_result_lists_both_ends_and_the_address_on_the_pods() -> None:
    made = PodInterface("eni0123456789a", "02:00:00:00:00:01", "eth0", "02:00:00:00:00:02")
    result = interface_result(made, "10.0.1.23", "/var/run/netns/p1", "1.0.0")
    assert result == {
        "cniVersion": "1.0.0",
        "interfaces": [
            {"name": "eni0123456789a", "mac": "02:00:00:00:00:01"},
            {"name": "eth0", "mac": "02:00:00:00:00:02", "sandbox": "/var/run/netns/p1"},
        ],
        "ips": [{"address": "10.0.1.23/32", "gateway": "169.254.1.1", "interface": 1}],
        "routes": [{"dst": "0.0.0.0/0", "gw": "169.254.1.1"}],
    }
    old = interface_result(made, "10.0.1.23", "/var/run/netns/p1", "0.4.0")
    assert old["ips"] == [
        {"version": "4", "address": "10.0.1.23/32", "gateway": "169.254.1.1", "interface": 1}
    ]


def test_an_agent_refusal_is_code_105_naming_the_agents_answer() -> None:
    body = ErrorBody(CODE_NETWORK_POLICY_REFUSED, "agent: pod has no policy endpoint", False)
    err = from_daemon(DaemonError(502, body))
    assert err.code == ERR_NETWORK_POLICY == 105
    assert "agent: pod has no policy endpoint" in err.msg
