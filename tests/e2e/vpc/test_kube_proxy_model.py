"""The emulated VPC's kube-proxy (`kube_proxy`) and TCP probe (`tcp`), tested on their own.

Without root: the renderers against kube-proxy's own expectations (chain names and whole rules from
kubernetes/kubernetes' pkg/proxy/iptables/cleanup_test.go at 679fc5a2f12de263b02cea688b1a4d9b04e81c86
and pkg/proxy/nftables/proxier_test.go at 81810de635aa13aa0a32992f6def3aa9d6025ebc, whose fake
proxiers have the cluster CIDR 10.0.0.0/8), and the EKS configuration's consequences. With root, in
namespaces made and deleted here: `iptables-nft-restore` and `nft -f` accept both modes' text and
`remove` leaves nothing; the probe counts its bytes between two namespaces; and a client reaches a
pod through a node holding each mode's rules, its address kept or masqueraded as the traffic policy
says.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator

import pytest

from bench.vpc.fabric import in_netns, ip, netns_path, run, sysctl
from bench.vpc.processes import add_netns, delete_netns
from tests.e2e.support import require, require_root
from tests.e2e.vpc.kube_proxy import (
    MASQUERADE_MARK,
    MODES,
    Endpoint,
    Mode,
    Service,
    install,
    iptables_chains,
    nftables_chains,
    plan_iptables_removal,
    remove,
    render_iptables,
    render_iptables_sync,
    render_nftables,
)
from tests.e2e.vpc.tcp import TcpServer, payload, probe

# kube-proxy's test services svc1 (ClusterIP) and svc3 (NodePort), each with one remote endpoint.
SVC1 = Service(
    "svc1", "ns1", "172.30.0.41", 80, port_name="p80", endpoints=[Endpoint("10.180.0.1", 80)]
)
SVC3 = Service(
    "svc3",
    "ns3",
    "172.30.0.43",
    80,
    port_name="p80",
    node_port=3003,
    endpoints=[Endpoint("10.180.0.3", 80)],
)
KUBE_PROXY_TESTS_CLUSTER_CIDR = "10.0.0.0/8"

IPTABLES_NAT_OF_SVC1_AND_SVC3 = """\
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-NODEPORTS -m comment --comment ns3/svc3:p80 -m tcp -p tcp --dport 3003 \
-j KUBE-EXT-X27LE4BHSL4DOUIK
-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 \
--dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O
-A KUBE-SERVICES -m comment --comment "ns3/svc3:p80 cluster IP" -m tcp -p tcp -d 172.30.0.43 \
--dport 80 -j KUBE-SVC-X27LE4BHSL4DOUIK
-A KUBE-SERVICES -m comment --comment \
"kubernetes service nodeports; NOTE: this must be the last rule in this chain" \
-m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-EXT-X27LE4BHSL4DOUIK -m comment --comment \
"masquerade traffic for ns3/svc3:p80 external destinations" -j KUBE-MARK-MASQ
-A KUBE-EXT-X27LE4BHSL4DOUIK -j KUBE-SVC-X27LE4BHSL4DOUIK
-A KUBE-SEP-OYPFS5VJICHGATKP -m comment --comment ns3/svc3:p80 -s 10.180.0.3 -j KUBE-MARK-MASQ
-A KUBE-SEP-OYPFS5VJICHGATKP -m comment --comment ns3/svc3:p80 -m tcp -p tcp -j DNAT \
--to-destination 10.180.0.3:80
-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -s 10.180.0.1 -j KUBE-MARK-MASQ
-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT \
--to-destination 10.180.0.1:80
-A KUBE-SVC-X27LE4BHSL4DOUIK -m comment --comment "ns3/svc3:p80 cluster IP" -m tcp -p tcp \
-d 172.30.0.43 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
-A KUBE-SVC-X27LE4BHSL4DOUIK -m comment --comment "ns3/svc3:p80 -> 10.180.0.3:80" \
-j KUBE-SEP-OYPFS5VJICHGATKP
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp \
-d 172.30.0.41 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.1:80" \
-j KUBE-SEP-SXIVWICOYRO3J4NJ
"""
"""cleanup_test.go's nat table, the lines of svc1 and svc3 and the fixed ones."""
IPTABLES_FILTER = """\
-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 \
! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 \
-j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack \
--ctstate RELATED,ESTABLISHED -j ACCEPT
"""
"""cleanup_test.go's filter rules that do not belong to a service."""

NFTABLES_BASE = """\
add table ip kube-proxy { comment "rules for kube-proxy" ; }
add set ip kube-proxy cluster-ips { type ipv4_addr ; comment "Active ClusterIPs" ; }
add map ip kube-proxy firewall-ips { type ipv4_addr . inet_proto . inet_service : verdict ; \
comment "destinations that are subject to LoadBalancerSourceRanges" ; }
add map ip kube-proxy no-endpoint-nodeports { type inet_proto . inet_service : verdict ; \
comment "vmap to drop or reject packets to service nodeports with no endpoints" ; }
add map ip kube-proxy no-endpoint-services { type ipv4_addr . inet_proto . inet_service : verdict ; \
comment "vmap to drop or reject packets to services with no endpoints" ; }
add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; \
comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }
add map ip kube-proxy service-nodeports { type inet_proto . inet_service : verdict ; \
comment "NodePort traffic" ; }
add chain ip kube-proxy cluster-ips-check
add chain ip kube-proxy filter-prerouting-pre-dnat { type filter hook prerouting priority -110 ; }
add chain ip kube-proxy filter-output-pre-dnat { type filter hook output priority -110 ; }
add chain ip kube-proxy filter-forward { type filter hook forward priority 0 ; }
add chain ip kube-proxy filter-input { type filter hook input priority 0 ; }
add chain ip kube-proxy filter-output { type filter hook output priority 0 ; }
add chain ip kube-proxy firewall-check
add chain ip kube-proxy mark-for-masquerade
add chain ip kube-proxy masquerading
add chain ip kube-proxy nat-output { type nat hook output priority -100 ; }
add chain ip kube-proxy nat-postrouting { type nat hook postrouting priority 100 ; }
add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }
add chain ip kube-proxy nodeport-endpoints-check
add chain ip kube-proxy reject-chain { comment "helper for @no-endpoint-services / @no-endpoint-nodeports" ; }
add chain ip kube-proxy services
add chain ip kube-proxy service-endpoints-check
add rule ip kube-proxy cluster-ips-check ip daddr @cluster-ips reject \
comment "Reject traffic to invalid ports of ClusterIPs"
add rule ip kube-proxy cluster-ips-check ip daddr { 172.30.0.0/16 } drop \
comment "Drop traffic to unallocated ClusterIPs"
add rule ip kube-proxy filter-prerouting-pre-dnat ct state new jump firewall-check
add rule ip kube-proxy filter-forward ct state new jump service-endpoints-check
add rule ip kube-proxy filter-forward ct state new jump cluster-ips-check
add rule ip kube-proxy filter-input ct state new jump nodeport-endpoints-check
add rule ip kube-proxy filter-input ct state new jump service-endpoints-check
add rule ip kube-proxy filter-output ct state new jump service-endpoints-check
add rule ip kube-proxy filter-output-pre-dnat ct state new jump firewall-check
add rule ip kube-proxy filter-output ct state new jump cluster-ips-check
add rule ip kube-proxy firewall-check ip daddr . meta l4proto . th dport vmap @firewall-ips
add rule ip kube-proxy mark-for-masquerade mark set mark or 0x4000
add rule ip kube-proxy masquerading mark and 0x4000 == 0 return
add rule ip kube-proxy masquerading mark set mark xor 0x4000
add rule ip kube-proxy masquerading masquerade fully-random
add rule ip kube-proxy nat-output jump services
add rule ip kube-proxy nat-postrouting jump masquerading
add rule ip kube-proxy nat-prerouting jump services
add rule ip kube-proxy reject-chain reject
add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips
add rule ip kube-proxy service-endpoints-check ip daddr . meta l4proto . th dport \
vmap @no-endpoint-services
"""
"""proxier_test.go's `baseRules` less its four lines of the nodeport-ips set, which a node without
nodePortAddresses (EKS) does not have."""
NFTABLES_WITHOUT_NODEPORT_ADDRESSES = """\
add rule ip kube-proxy nodeport-endpoints-check ip daddr != 127.0.0.0/8 meta l4proto . th dport \
vmap @no-endpoint-nodeports
add rule ip kube-proxy services fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . \
th dport vmap @service-nodeports
"""
"""In their place, the `MatchAll()` branches of proxier.go's `setupNFTables`."""
NFTABLES_OF_SVC1_AND_SVC3 = """\
add chain ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80
add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 ip daddr 172.30.0.41 \
ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 numgen random mod 1 \
vmap { 0 : goto endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 }
add chain ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80
add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 ip saddr 10.180.0.1 \
jump mark-for-masquerade
add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 meta l4proto tcp \
dnat to 10.180.0.1:80
add element ip kube-proxy cluster-ips { 172.30.0.41 }
add element ip kube-proxy service-ips { 172.30.0.41 . tcp . 80 : \
goto service-ULMVA6XW-ns1/svc1/tcp/p80 }
add chain ip kube-proxy service-4AT6LBPK-ns3/svc3/tcp/p80
add rule ip kube-proxy service-4AT6LBPK-ns3/svc3/tcp/p80 ip daddr 172.30.0.43 \
ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-4AT6LBPK-ns3/svc3/tcp/p80 numgen random mod 1 \
vmap { 0 : goto endpoint-UEIP74TE-ns3/svc3/tcp/p80__10.180.0.3/80 }
add chain ip kube-proxy external-4AT6LBPK-ns3/svc3/tcp/p80
add rule ip kube-proxy external-4AT6LBPK-ns3/svc3/tcp/p80 jump mark-for-masquerade
add rule ip kube-proxy external-4AT6LBPK-ns3/svc3/tcp/p80 goto service-4AT6LBPK-ns3/svc3/tcp/p80
add chain ip kube-proxy endpoint-UEIP74TE-ns3/svc3/tcp/p80__10.180.0.3/80
add rule ip kube-proxy endpoint-UEIP74TE-ns3/svc3/tcp/p80__10.180.0.3/80 ip saddr 10.180.0.3 \
jump mark-for-masquerade
add rule ip kube-proxy endpoint-UEIP74TE-ns3/svc3/tcp/p80__10.180.0.3/80 meta l4proto tcp \
dnat to 10.180.0.3:80
add element ip kube-proxy cluster-ips { 172.30.0.43 }
add element ip kube-proxy service-ips { 172.30.0.43 . tcp . 80 : \
goto service-4AT6LBPK-ns3/svc3/tcp/p80 }
add element ip kube-proxy service-nodeports { tcp . 3003 : \
goto external-4AT6LBPK-ns3/svc3/tcp/p80 }
"""
"""proxier_test.go's `TestOverallNFTablesRules`, the lines of svc1 and svc3."""


def as_kube_proxys_fakes_write(text: str) -> str:
    """kube-proxy's fake proxiers take the mark as "0x4000" where the real one formats it with
    `%#08x`, and the fake iptables has no --random-fully."""
    return text.replace(MASQUERADE_MARK, "0x4000").replace(" --random-fully", "")


def iptables_rules(text: str, table: str) -> dict[str, list[str]]:
    """Chain → its `-A` lines in order, from the blocks of one table of a restore input."""
    rules: dict[str, list[str]] = {}
    current = ""
    for line in text.splitlines():
        if line.startswith("*"):
            current = line[1:]
        elif current == table and line.startswith("-A "):
            rules.setdefault(line.split()[1], []).append(line)
    return rules


def nft_objects(text: str) -> dict[str, list[str]]:
    """What kube-proxy's tests compare: each object's `add` line, each chain's rules in order, each
    set's or map's elements in any order."""
    objects: dict[str, list[str]] = {}
    for line in text.splitlines():
        kind, name = line.split()[1], line.split()[4]
        objects.setdefault(f"{kind} {name}", []).append(line)
    return {k: sorted(v) if k.startswith("element") else v for k, v in objects.items()}


def eks_service(
    policy: str = "Cluster",
    endpoints: tuple[Endpoint, ...] = (),
    health_check_node_port: int | None = None,
) -> Service:
    return Service(
        "web",
        "default",
        "172.20.0.10",
        80,
        node_port=30080,
        external_traffic_policy="Local" if policy == "Local" else "Cluster",
        endpoints=endpoints,
        health_check_node_port=health_check_node_port,
    )


LOCAL_POD = Endpoint("10.0.1.20", 8080, is_local=True)
REMOTE_POD = Endpoint("10.0.1.9", 8080)


# -- without root ---------------------------------------------------------------------------------


def test_chain_names_are_those_of_kube_proxys_own_tests() -> None:
    svc2 = Service("svc2", "ns2", "172.30.0.42", 80, port_name="p80")
    svc2_endpoint = Service(
        "svc2", "ns2", "172.30.0.42", 80, port_name="p80", endpoints=[Endpoint("10.180.0.2", 80)]
    )
    assert iptables_chains(SVC1).cluster == "KUBE-SVC-XPGD46QRK7WJZT7O"
    assert iptables_chains(SVC1).endpoints == ("KUBE-SEP-SXIVWICOYRO3J4NJ",)
    assert iptables_chains(svc2).external == "KUBE-EXT-GNZBNJ2PO5MGZ6GT"
    assert iptables_chains(svc2_endpoint).endpoints == ("KUBE-SEP-RS4RBKLTHTF2IUXJ",)
    assert iptables_chains(SVC3).endpoints == ("KUBE-SEP-OYPFS5VJICHGATKP",)
    assert nftables_chains(SVC1).cluster == "service-ULMVA6XW-ns1/svc1/tcp/p80"
    assert nftables_chains(SVC1).endpoints == ("endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80",)
    assert nftables_chains(svc2).external == "external-42NFTM6N-ns2/svc2/tcp/p80"
    assert nftables_chains(svc2_endpoint).endpoints == (
        "endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80",
    )
    assert nftables_chains(SVC3).external == "external-4AT6LBPK-ns3/svc3/tcp/p80"


def test_iptables_rules_are_those_of_kube_proxys_own_tests() -> None:
    sync = render_iptables_sync([SVC3, SVC1], cluster_cidr=KUBE_PROXY_TESTS_CLUSTER_CIDR)
    rendered = as_kube_proxys_fakes_write(sync)
    assert iptables_rules(rendered, "nat") == iptables_rules(
        "*nat\n" + IPTABLES_NAT_OF_SVC1_AND_SVC3, "nat"
    )
    assert iptables_rules(rendered, "filter") == iptables_rules(
        "*filter\n" + IPTABLES_FILTER, "filter"
    )


def test_nftables_rules_are_those_of_kube_proxys_own_tests() -> None:
    rendered = render_nftables(
        [SVC1, SVC3], cluster_cidr=KUBE_PROXY_TESTS_CLUSTER_CIDR, service_cidr="172.30.0.0/16"
    )
    expected = NFTABLES_BASE + NFTABLES_WITHOUT_NODEPORT_ADDRESSES + NFTABLES_OF_SVC1_AND_SVC3
    assert nft_objects(as_kube_proxys_fakes_write(rendered)) == nft_objects(expected)


def test_eks_has_no_cluster_cidr_so_no_cluster_ip_masquerade_and_no_pod_short_circuit() -> None:
    service = eks_service("Local", (LOCAL_POD, REMOTE_POD))
    ipt, nft = render_iptables([service]), render_nftables([service])
    assert "KUBE-MARK-MASQ" not in "".join(
        iptables_rules(ipt, "nat")[iptables_chains(service).cluster]
    )
    assert "pod traffic" not in ipt and "short-circuit pod traffic" not in nft
    assert f"ip daddr {service.cluster_ip}" not in nft


def test_masquerade_all_marks_all_cluster_ip_traffic_as_kube_proxy_does() -> None:
    service = eks_service(endpoints=(REMOTE_POD,))
    ipt = render_iptables([service], masquerade_all=True)
    svc_chain = iptables_chains(service).cluster
    assert iptables_rules(ipt, "nat")[svc_chain][0] == (
        f'-A {svc_chain} -m comment --comment "default/web cluster IP" -m tcp -p tcp '
        "-d 172.20.0.10 --dport 80 -j KUBE-MARK-MASQ"
    )
    nft = render_nftables([service], masquerade_all=True)
    cluster = nftables_chains(service).cluster
    assert f"add rule ip kube-proxy {cluster} ip daddr 172.20.0.10 jump mark-for-masquerade" in nft


def test_a_local_nodeport_sends_outside_traffic_to_local_endpoints_only() -> None:
    service = eks_service("Local", (LOCAL_POD, REMOTE_POD))
    names = iptables_chains(service)
    local_sep, remote_sep = names.endpoints  # "10.0.1.20:8080" sorts before "10.0.1.9:8080"
    nat = iptables_rules(render_iptables([service]), "nat")
    assert [rule.split(" -j ")[-1] for rule in nat[names.external]] == [
        "KUBE-MARK-MASQ",  # from the node itself (--src-type LOCAL): masqueraded
        names.cluster,  # ... and sent to any endpoint
        names.local,  # from outside: the client's address kept, local endpoints only
    ]
    assert [rule.split(" -j ")[-1] for rule in nat[names.local]] == [local_sep]
    assert [rule.split(" -j ")[-1] for rule in nat[names.cluster]] == [local_sep, remote_sep]
    assert "--probability 0.5000000000" in nat[names.cluster][0]

    chains = nftables_chains(service)
    nft = nft_objects(render_nftables([service]))
    assert nft[f"rule {chains.external}"][-1].endswith(f"goto {chains.local}")
    assert nft[f"rule {chains.local}"] == [
        f"add rule ip kube-proxy {chains.local} numgen random mod 1 "
        f"vmap {{ 0 : goto {chains.endpoints[0]} }}"
    ]


def test_a_local_nodeport_without_local_endpoints_drops_outside_traffic() -> None:
    service = eks_service("Local", (REMOTE_POD,), health_check_node_port=31000)
    ipt = render_iptables([service])
    filter_rules = iptables_rules(ipt, "filter")
    assert filter_rules["KUBE-EXTERNAL-SERVICES"] == [
        '-A KUBE-EXTERNAL-SERVICES -m comment --comment "default/web has no local endpoints" '
        "-m addrtype --dst-type LOCAL -m tcp -p tcp --dport 30080 -j DROP"
    ]
    assert filter_rules["KUBE-NODEPORTS"][0].endswith("--dport 31000 -j ACCEPT")
    assert iptables_chains(service).local not in ipt
    nft = render_nftables([service])
    assert 'no-endpoint-nodeports { tcp . 30080 comment "default/web" : drop }' in nft
    assert nftables_chains(service).local not in nft


def test_a_service_without_endpoints_is_rejected() -> None:
    service = eks_service()
    filter_rules = iptables_rules(render_iptables([service]), "filter")
    assert filter_rules["KUBE-SERVICES"][0].endswith("-d 172.20.0.10 --dport 80 -j REJECT")
    assert filter_rules["KUBE-EXTERNAL-SERVICES"][0].endswith("--dport 30080 -j REJECT")
    nft = render_nftables([service])
    assert "service-ips {" not in nft.split("add element", 1)[-1]
    assert (
        'no-endpoint-services { 172.20.0.10 . tcp . 80 comment "default/web" : goto reject-chain'
        in nft
    )


def test_a_local_policy_needs_a_node_port() -> None:
    with pytest.raises(ValueError, match="node port"):
        Service("web", "default", "172.20.0.10", 80, external_traffic_policy="Local")


def test_removal_takes_kube_proxys_chains_and_jumps_and_nothing_else() -> None:
    saved = """\
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:KUBE-FORWARD - [0:0]
:OTHER - [0:0]
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A FORWARD -s 1.2.3.4/32 -j OTHER
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
COMMIT
*nat
:POSTROUTING ACCEPT [0:0]
:KUBE-SEP-SXIVWICOYRO3J4NJ - [0:0]
-A POSTROUTING -s 10.0.0.0/8 -j MASQUERADE
COMMIT
*raw
:PREROUTING ACCEPT [0:0]
COMMIT
"""
    assert plan_iptables_removal(saved) == (
        "*filter\n:KUBE-FORWARD - [0:0]\n"
        '-D FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD\n'
        "-X KUBE-FORWARD\nCOMMIT\n"
        "*nat\n:KUBE-SEP-SXIVWICOYRO3J4NJ - [0:0]\n-X KUBE-SEP-SXIVWICOYRO3J4NJ\nCOMMIT\n"
    )
    assert plan_iptables_removal("*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n") == ""


def test_the_probe_payload_is_the_same_every_time() -> None:
    assert payload(300) == payload(300)
    assert len(payload(70000)) == 70000
    assert payload(3)[:3] == b"\x00\x01\x02"


# -- as root, in namespaces made here -------------------------------------------------------------

_names = itertools.count()


@pytest.fixture
def namespaces() -> Iterator[Callable[[], str]]:
    """Makes named network namespaces (loopback up) on demand; deletes them all afterwards."""
    require_root()
    require("ip", "nsenter", "nft", "iptables-nft-restore", "iptables-nft-save")
    made: list[str] = []

    def make() -> str:
        name = f"ipamd-kp-{os.getpid()}-{next(_names)}"
        add_netns(name)
        made.append(name)
        ip(name, "link", "set", "lo", "up")
        return name

    try:
        yield make
    finally:
        for name in made:
            delete_netns(name)


def link(left: str, left_ip: str, right: str, right_ip: str) -> None:
    """A veth pair between two namespaces, with a /24 address at each end."""
    here, there = f"v{next(_names)}", f"v{next(_names)}"
    ip(left, "link", "add", here, "type", "veth", "peer", "name", there, "netns", right)
    for namespace, device, address in ((left, here, left_ip), (right, there, right_ip)):
        ip(namespace, "addr", "add", f"{address}/24", "dev", device)
        ip(namespace, "link", "set", device, "up")


def ruleset(namespace: str) -> str:
    return run(in_netns(namespace, "nft", "list", "ruleset"))


@pytest.mark.parametrize("mode", MODES)
def test_each_mode_installs_and_removal_leaves_nothing(
    namespaces: Callable[[], str], mode: Mode
) -> None:
    node, peer = namespaces(), namespaces()
    link(node, "10.9.0.1", peer, "10.9.0.2")
    services = [
        eks_service("Local", (LOCAL_POD, REMOTE_POD), health_check_node_port=31000),
        Service("dns", "kube-system", "172.20.0.53", 53, protocol="udp", endpoints=[REMOTE_POD]),
        Service("idle", "default", "172.20.0.11", 80, node_port=30081),
    ]
    other: Mode = "nftables" if mode == "iptables" else "iptables"
    install(node, other, services, "10.9.0.1", masquerade_all=True)
    install(node, mode, services, "10.9.0.1")  # clears the other mode's rules first

    listed, saved = ruleset(node), run(in_netns(node, "iptables-nft-save"))
    names = (iptables_chains if mode == "iptables" else nftables_chains)(services[0])
    assert all(chain in listed for chain in (names.local, names.external, *names.endpoints))
    assert ("table ip kube-proxy" in listed) == (mode == "nftables")
    assert ("KUBE-" in saved) == (mode == "iptables")

    remove(node)
    assert ruleset(node) == ""
    assert run(in_netns(node, "sysctl", "-n", "net.ipv4.conf.all.route_localnet")).strip() == "0"
    with pytest.raises(ValueError, match="not an address"):
        install(node, mode, services, "10.9.9.9")


def test_the_probe_counts_bytes_both_ways_between_two_namespaces(
    namespaces: Callable[[], str],
) -> None:
    client, server_ns = namespaces(), namespaces()
    link(client, "10.9.0.2", server_ns, "10.9.0.1")
    with TcpServer(netns_path(server_ns), name="far") as server:
        process = server.process
        assert process is not None and server.port > 0
        for size in (0, 1, 300_000):
            result = probe(netns_path(client), "10.9.0.1", server.port, size)
            assert result.ok, result
            assert (result.bytes_sent, result.bytes_received) == (size, size)
            assert (result.peer_ip, result.server) == ("10.9.0.2", "far")
        refused = probe(netns_path(client), "10.9.0.1", server.port + 1, 10)
        assert not refused.ok and refused.error is not None and "Refused" in refused.error
    assert server.process is None and process.poll() is not None, "the server outlived its block"


@pytest.mark.parametrize("mode", MODES)
def test_a_client_reaches_a_pod_through_the_rules_of_each_mode(
    namespaces: Callable[[], str], mode: Mode
) -> None:
    """client (10.9.0.2) — node (10.9.0.1 | 10.9.1.1, forwarding) — pod (10.9.1.2:8080)."""
    client, node, pod = namespaces(), namespaces(), namespaces()
    link(node, "10.9.0.1", client, "10.9.0.2")
    link(node, "10.9.1.1", pod, "10.9.1.2")
    ip(client, "route", "add", "default", "via", "10.9.0.1")
    ip(pod, "route", "add", "default", "via", "10.9.1.1")
    sysctl(node, "net.ipv4.ip_forward", "1")
    endpoint = Endpoint("10.9.1.2", 8080, is_local=True)
    seen: dict[tuple[str, str], str | None] = {}
    with TcpServer(netns_path(pod), 8080, name="pod"):
        for policy in ("Cluster", "Local"):
            install(node, mode, [eks_service(policy, (endpoint,))], "10.9.0.1")
            for target, port in (("10.9.0.1", 30080), ("172.20.0.10", 80)):
                result = probe(netns_path(client), target, port, 50_000)
                assert result.ok and result.server == "pod", (policy, target, result)
                seen[policy, target] = result.peer_ip
    remove(node)
    assert seen == {
        ("Cluster", "10.9.0.1"): "10.9.1.1",  # a Cluster NodePort masquerades ...
        ("Local", "10.9.0.1"): "10.9.0.2",  # ... a Local one keeps the client's address
        ("Cluster", "172.20.0.10"): "10.9.0.2",  # no cluster CIDR: cluster IPs never masquerade
        ("Local", "172.20.0.10"): "10.9.0.2",
    }
