"""kube-proxy as the emulated VPC's node runs it on EKS: the rules it writes for a set of Services, in
iptables mode (iptables-nft) or nftables mode, rendered as text and installed in a node's namespace.

Built from kube-proxy's own code, kubernetes/kubernetes at commit
531be81208e2274ef42e72525a26610a9622bcdf (no release tag is attached to the copy read; it comes after
PR 132456, which moved the nftables filter chains to the filter priority):
- pkg/proxy/iptables/proxier.go: the start-up jumps (`iptablesJumpChains`, the kubelet's KUBE-FIREWALL
  jumps, each ensured with `-I`), the canary chains of its iptables monitor (mangle, nat, filter), and
  the `iptables-restore --noflush` input of `syncProxyRules` (filter, then nat);
- pkg/proxy/iptables/cleanup.go: what removal takes away;
- pkg/proxy/nftables/proxier.go: `setupNFTables` and `syncProxyRules` of `table ip kube-proxy`;
- chain names: `portProtoHash` and `servicePortEndpointChainName` (iptables), `hashAndTruncate` and
  the `servicePort*ChainNameBase` functions (nftables).
Checked against full expected dumps: pkg/proxy/iptables/cleanup_test.go at
679fc5a2f12de263b02cea688b1a4d9b04e81c86 and pkg/proxy/nftables/proxier_test.go at
81810de635aa13aa0a32992f6def3aa9d6025ebc (`baseRules`, `TestOverallNFTablesRules`). Endpoints are
ordered as pkg/proxy/endpointslicecache.go orders them (by "ip:port" text); the local-traffic
detector is `getLocalDetectors` of cmd/kube-proxy/app/server_linux.go; "no --nodeport-addresses" is
`NewNodePortAddresses` of pkg/proxy/util/nodeport_addresses.go.

EKS's kube-proxy configuration, and what follows from it in that code:
- no cluster CIDR: the local-traffic detector is a no-op, so neither the masquerade of cluster-IP
  traffic from outside the cluster (`! -s <cidr> -j KUBE-MARK-MASQ`) nor the short-circuit of pod
  traffic in a Local service's external chain exists (`cluster_cidr` puts them back, as kube-proxy's
  own tests configure it);
- masquerade bit 14: mark 0x4000, written as kube-proxy formats it (`%#08x`, "0x004000"; iptables-save
  and nft list print it back as 0x4000 and 0x00004000);
- `--masquerade-all` off unless asked (`masquerade_all`);
- no nodePortAddresses: NodePorts answer on every local address (`-m addrtype --dst-type LOCAL` at
  the end of KUBE-SERVICES; `fib daddr type local` in nftables mode, where the `nodeport-ips` set is
  deleted); in iptables mode localhost NodePorts stay on, hence `route_localnet=1` and the
  KUBE-FIREWALL rule that guards it;
- nftables mode learns the cluster's ServiceCIDRs (`service_cidr`, EKS's 172.20.0.0/16 for a VPC in
  10.0.0.0/8) and drops traffic to unallocated cluster IPs.

Left out, as EKS's Services and these tests do without them: LoadBalancer ingress IPs (an ELB's
ingress is a hostname: its traffic reaches NodePorts or pods), external IPs, LoadBalancerSourceRanges,
session affinity, internalTrafficPolicy Local, topology hints, terminating endpoints, several ports per
Service (give each port its own `Service`), IPv6, the nfacct counting variants of two rules (metrics),
large-cluster mode (no comments past 1000 endpoints), and kube-proxy's conntrack sysctls. hostPort
is not kube-proxy's (the portmap CNI plugin does it). On a real node kubelet also owns KUBE-FIREWALL;
here the fixture does, and `remove` takes it too.

Every command names the namespace it runs in (`ip -n`, `nsenter --net=`).
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from bench.vpc.fabric import in_netns, ip, nft, run, sysctl

Mode = Literal["iptables", "nftables"]
MODES: Final[tuple[Mode, ...]] = ("iptables", "nftables")
Protocol = Literal["tcp", "udp", "sctp"]
TrafficPolicy = Literal["Cluster", "Local"]

MASQUERADE_BIT: Final = 14
MASQUERADE_MARK: Final = format(1 << MASQUERADE_BIT, "#08x")
SERVICE_CIDR: Final = "172.20.0.0/16"
"""The cluster's service range: of EKS's two defaults (10.100.0.0/16, 172.20.0.0/16), the one it
picks for a VPC in 10.0.0.0/8, as the emulated VPC (10.0.0.0/16) is."""
NFT_TABLE: Final = "kube-proxy"
IPTABLES_RESTORE: Final = "iptables-nft-restore"
IPTABLES_SAVE: Final = "iptables-nft-save"
ROUTE_LOCALNET: Final = "net.ipv4.conf.all.route_localnet"


# -- the model ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Endpoint:
    ip: str
    port: int
    is_local: bool = False
    """On this node (the EndpointSlice's nodeName is this node's)."""

    @property
    def address(self) -> str:
        """ "ip:port", kube-proxy's text of an endpoint (in chain names, DNAT targets, order)."""
        return f"{self.ip}:{self.port}"


@dataclass(frozen=True, slots=True)
class Service:
    """One port of a Service and its ready endpoints (kept in kube-proxy's order)."""

    name: str
    namespace: str
    cluster_ip: str
    port: int
    protocol: Protocol = "tcp"
    node_port: int | None = None
    external_traffic_policy: TrafficPolicy = "Cluster"
    endpoints: Sequence[Endpoint] = ()
    port_name: str = ""
    health_check_node_port: int | None = None
    """The port a Local LoadBalancer Service's health checks use (iptables mode opens it)."""

    def __post_init__(self) -> None:
        ipaddress.IPv4Address(self.cluster_ip)
        for endpoint in self.endpoints:
            ipaddress.IPv4Address(endpoint.ip)
        if self.external_traffic_policy == "Local" and self.node_port is None:
            raise ValueError(f"{self.port_name_string}: Local traffic policy needs a node port")
        if self.health_check_node_port is not None and self.external_traffic_policy != "Local":
            raise ValueError(f"{self.port_name_string}: a health check port needs Local policy")
        ordered = tuple(sorted(self.endpoints, key=lambda e: e.address))
        object.__setattr__(self, "endpoints", ordered)

    @property
    def port_name_string(self) -> str:
        """`ServicePortName.String()`: "namespace/name", then ":port-name" when the port has one."""
        suffix = f":{self.port_name}" if self.port_name else ""
        return f"{self.namespace}/{self.name}{suffix}"

    @property
    def local_endpoints(self) -> tuple[Endpoint, ...]:
        return tuple(e for e in self.endpoints if e.is_local)


@dataclass(frozen=True, slots=True)
class Chains:
    """The names kube-proxy gives one Service port's chains in one mode."""

    cluster: str
    local: str
    external: str
    endpoints: tuple[str, ...]
    """One per endpoint, in the Service's endpoint order."""


def _b32_sha256(text: str) -> str:
    return base64.b32encode(hashlib.sha256(text.encode()).digest()).decode()


def iptables_chains(service: Service) -> Chains:
    """KUBE-SVC-, KUBE-SVL-, KUBE-EXT- and KUBE-SEP- names: base32 of the SHA-256 of the port name
    and protocol (and endpoint), the first 16 characters."""
    key = service.port_name_string + service.protocol
    digest = _b32_sha256(key)[:16]
    return Chains(
        cluster=f"KUBE-SVC-{digest}",
        local=f"KUBE-SVL-{digest}",
        external=f"KUBE-EXT-{digest}",
        endpoints=tuple(f"KUBE-SEP-{_b32_sha256(key + e.address)[:16]}" for e in service.endpoints),
    )


_NFT_NAME_BASE_MAX: Final = 256 - 16
"""knftables' longest name less kube-proxy's longest prefix."""


def _hash_and_truncate(name: str) -> str:
    name = f"{_b32_sha256(name)[:8]}-{name}"
    return name if len(name) <= _NFT_NAME_BASE_MAX else name[: _NFT_NAME_BASE_MAX - 3] + "..."


def nftables_chains(service: Service) -> Chains:
    """service-, local-, external- and endpoint- names: the readable name, prefixed with 8 characters
    of its hash."""
    base = f"{service.namespace}/{service.name}/{service.protocol}/{service.port_name}"
    named = _hash_and_truncate(base)
    return Chains(
        cluster=f"service-{named}",
        local=f"local-{named}",
        external=f"external-{named}",
        endpoints=tuple(
            f"endpoint-{_hash_and_truncate(f'{base}__{e.ip}/{e.port}')}" for e in service.endpoints
        ),
    )


@dataclass(frozen=True, slots=True)
class _Plan:
    """kube-proxy's decisions for one Service port (`CategorizeEndpoints` and what both proxiers
    derive from it), with internalTrafficPolicy Cluster."""

    service: Service
    chains: Chains
    has_endpoints: bool
    local: bool
    """externalTrafficPolicy Local."""
    has_external_endpoints: bool
    uses_external_chain: bool
    internal_refusal: Literal["", "reject"]
    external_refusal: Literal["", "reject", "drop"]

    @property
    def external_policy_chain(self) -> str:
        return self.chains.local if self.local else self.chains.cluster

    def endpoint_chains(self, local_only: bool = False) -> list[tuple[Endpoint, str]]:
        pairs = zip(self.service.endpoints, self.chains.endpoints, strict=True)
        return [(e, c) for e, c in pairs if e.is_local or not local_only]


def _plan(service: Service, chains: Chains) -> _Plan:
    has = bool(service.endpoints)
    local = service.external_traffic_policy == "Local"
    has_external = has and (not local or bool(service.local_endpoints))
    external_refusal: Literal["", "reject", "drop"] = (
        "reject" if not has else "" if has_external else "drop"
    )
    return _Plan(
        service=service,
        chains=chains,
        has_endpoints=has,
        local=local,
        has_external_endpoints=has_external,
        uses_external_chain=has and service.node_port is not None,
        internal_refusal="" if has else "reject",
        external_refusal=external_refusal,
    )


def _in_order(services: Iterable[Service]) -> list[Service]:
    """kube-proxy walks a map; a fixed order keeps the text comparable between runs."""
    return sorted(services, key=lambda s: (s.port_name_string, s.protocol))


# -- iptables mode --------------------------------------------------------------------------------

_IPTABLES_SETUP: Final = """\
*mangle
:KUBE-PROXY-CANARY - [0:0]
COMMIT
*filter
:KUBE-PROXY-CANARY - [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-FIREWALL - [0:0]
-I INPUT -m conntrack --ctstate NEW \
-m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-I FORWARD -m conntrack --ctstate NEW \
-m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-I INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS
-I FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" \
-j KUBE-SERVICES
-I OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" \
-j KUBE-SERVICES
-I FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-I INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" \
-j KUBE-PROXY-FIREWALL
-I OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" \
-j KUBE-PROXY-FIREWALL
-I FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" \
-j KUBE-PROXY-FIREWALL
-I INPUT -j KUBE-FIREWALL
-I OUTPUT -j KUBE-FIREWALL
COMMIT
*nat
:KUBE-PROXY-CANARY - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
-I OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-I PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-I POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
COMMIT
"""
"""What kube-proxy does before its first sync: its iptables monitor's canary chain in mangle, nat
and filter, then each chain of `iptablesJumpChains` (and the kubelet's KUBE-FIREWALL) ensured and
its jump inserted at the top of the built-in chain, in kube-proxy's order (so the last is on top)."""
_FILTER_CHAINS: Final = (
    "KUBE-SERVICES",
    "KUBE-EXTERNAL-SERVICES",
    "KUBE-FORWARD",
    "KUBE-NODEPORTS",
    "KUBE-PROXY-FIREWALL",
)
_NAT_CHAINS: Final = ("KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-MARK-MASQ")
_OWNED_CHAINS: Final = frozenset(
    {*_FILTER_CHAINS, *_NAT_CHAINS, "KUBE-PROXY-CANARY", "KUBE-FIREWALL"}
)
_SERVICE_CHAIN_PREFIXES: Final = ("KUBE-SVC-", "KUBE-SVL-", "KUBE-FW-", "KUBE-EXT-", "KUBE-SEP-")


def _quoted(comment: str) -> str:
    return f'"{comment}"' if " " in comment else comment


def _chain_line(chain: str) -> str:
    return f":{chain} - [0:0]"


@dataclass
class _Restore:
    """The four buffers of `syncProxyRules`."""

    filter_chains: list[str] = field(default_factory=list)
    filter_rules: list[str] = field(default_factory=list)
    nat_chains: list[str] = field(default_factory=list)
    nat_rules: list[str] = field(default_factory=list)

    def text(self) -> str:
        lines = ["*filter", *self.filter_chains, *self.filter_rules, "COMMIT"]
        lines += ["*nat", *self.nat_chains, *self.nat_rules, "COMMIT"]
        return "\n".join(lines) + "\n"


def render_iptables_sync(
    services: Iterable[Service], *, masquerade_all: bool = False, cluster_cidr: str | None = None
) -> str:
    """The `iptables-restore --noflush` input of kube-proxy's full sync: filter, then nat."""
    out = _Restore()
    out.filter_chains += [_chain_line(c) for c in _FILTER_CHAINS]
    out.nat_chains += [_chain_line(c) for c in _NAT_CHAINS]
    mark = f"{MASQUERADE_MARK}/{MASQUERADE_MARK}"
    out.nat_rules += [
        f"-A KUBE-POSTROUTING -m mark ! --mark {mark} -j RETURN",
        f"-A KUBE-POSTROUTING -j MARK --xor-mark {MASQUERADE_MARK}",
        '-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" '
        "-j MASQUERADE --random-fully",
        f"-A KUBE-MARK-MASQ -j MARK --or-mark {MASQUERADE_MARK}",
    ]
    # Localhost NodePorts are on (nodePortAddresses unset matches 127.0.0.1): the guard goes in.
    out.filter_chains.append(_chain_line("KUBE-FIREWALL"))
    out.filter_rules.append(
        '-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" '
        "-d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP"
    )
    for service in _in_order(services):
        plan = _plan(service, iptables_chains(service))
        _ipt_capture(out, plan)
        _ipt_internal(out, plan, masquerade_all, cluster_cidr)
        _ipt_external(out, plan, cluster_cidr)
        _ipt_endpoints(out, plan)
    out.nat_rules.append(
        "-A KUBE-SERVICES -m comment --comment "
        '"kubernetes service nodeports; NOTE: this must be the last rule in this chain" '
        "-m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"
    )
    out.filter_rules += [
        "-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP",
        '-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" '
        f"-m mark --mark {mark} -j ACCEPT",
        '-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" '
        "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
    ]
    return out.text()


def render_iptables(
    services: Iterable[Service], *, masquerade_all: bool = False, cluster_cidr: str | None = None
) -> str:
    """One `iptables-nft-restore --noflush` input that leaves a node as kube-proxy leaves it after
    start-up and its first sync: the set-up, then `render_iptables_sync`."""
    sync = render_iptables_sync(services, masquerade_all=masquerade_all, cluster_cidr=cluster_cidr)
    return _IPTABLES_SETUP + sync


def _ipt_match(service: Service) -> str:
    return f"-m {service.protocol} -p {service.protocol}"


def _ipt_capture(out: _Restore, plan: _Plan) -> None:
    """The cluster IP, the node port and the health check port, or their refusal."""
    svc, name = plan.service, plan.service.port_name_string
    to_cluster_ip = f"{_ipt_match(svc)} -d {svc.cluster_ip} --dport {svc.port}"
    if plan.internal_refusal:
        out.filter_rules.append(
            f'-A KUBE-SERVICES -m comment --comment "{name} has no endpoints" {to_cluster_ip} '
            "-j REJECT"
        )
    else:
        out.nat_rules.append(
            f'-A KUBE-SERVICES -m comment --comment "{name} cluster IP" {to_cluster_ip} '
            f"-j {plan.chains.cluster}"
        )
    if svc.node_port is not None:
        if plan.has_endpoints:
            out.nat_rules.append(
                f"-A KUBE-NODEPORTS -m comment --comment {_quoted(name)} {_ipt_match(svc)} "
                f"--dport {svc.node_port} -j {plan.chains.external}"
            )
        if plan.external_refusal:
            why = (
                "has no endpoints"
                if plan.external_refusal == "reject"
                else "has no local endpoints"
            )
            out.filter_rules.append(
                f'-A KUBE-EXTERNAL-SERVICES -m comment --comment "{name} {why}" '
                f"-m addrtype --dst-type LOCAL {_ipt_match(svc)} --dport {svc.node_port} "
                f"-j {plan.external_refusal.upper()}"
            )
    if svc.health_check_node_port is not None:
        out.filter_rules.append(
            f'-A KUBE-NODEPORTS -m comment --comment "{name} health check node port" '
            f"-m tcp -p tcp --dport {svc.health_check_node_port} -j ACCEPT"
        )


def _ipt_internal(out: _Restore, plan: _Plan, masquerade_all: bool, cidr: str | None) -> None:
    """Cluster-IP traffic is masqueraded only with --masquerade-all, or from outside a cluster CIDR."""
    svc = plan.service
    if plan.internal_refusal or not (masquerade_all or cidr):
        return
    match = (
        f'-m comment --comment "{svc.port_name_string} cluster IP" {_ipt_match(svc)} '
        f"-d {svc.cluster_ip} --dport {svc.port}"
    )
    outside = "" if masquerade_all else f" ! -s {cidr}"
    out.nat_rules.append(f"-A {plan.chains.cluster} {match}{outside} -j KUBE-MARK-MASQ")


def _ipt_external(out: _Restore, plan: _Plan, cidr: str | None) -> None:
    if not plan.uses_external_chain:
        return
    ext, name = plan.chains.external, plan.service.port_name_string
    out.nat_chains.append(_chain_line(ext))
    if not plan.local:
        out.nat_rules.append(
            f'-A {ext} -m comment --comment "masquerade traffic for {name} external destinations" '
            "-j KUBE-MARK-MASQ"
        )
    else:
        if cidr:
            out.nat_rules.append(
                f'-A {ext} -m comment --comment "pod traffic for {name} external destinations" '
                f"-s {cidr} -j {plan.chains.cluster}"
            )
        out.nat_rules += [
            f'-A {ext} -m comment --comment "masquerade LOCAL traffic for {name} external '
            'destinations" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ',
            f'-A {ext} -m comment --comment "route LOCAL traffic for {name} external '
            f'destinations" -m addrtype --src-type LOCAL -j {plan.chains.cluster}',
        ]
    if plan.has_external_endpoints:
        out.nat_rules.append(f"-A {ext} -j {plan.external_policy_chain}")


def _ipt_endpoints(out: _Restore, plan: _Plan) -> None:
    """KUBE-SVC- over every endpoint, KUBE-SVL- over the local ones (Local policy), a KUBE-SEP- each."""
    if not plan.has_endpoints:
        return
    policies = [(plan.chains.cluster, plan.endpoint_chains())]
    if plan.local and plan.service.local_endpoints:
        policies.append((plan.chains.local, plan.endpoint_chains(local_only=True)))
    name, match = plan.service.port_name_string, _ipt_match(plan.service)
    for chain, pairs in policies:
        out.nat_chains.append(_chain_line(chain))
        for i, (endpoint, sep) in enumerate(pairs):
            # Each rule takes its share of what the ones before it left: 1/n, 1/(n-1), ..., all.
            odds = f" -m statistic --mode random --probability {1 / (len(pairs) - i):.10f}"
            last = i == len(pairs) - 1
            out.nat_rules.append(
                f'-A {chain} -m comment --comment "{name} -> {endpoint.address}"'
                f"{'' if last else odds} -j {sep}"
            )
    for endpoint, sep in plan.endpoint_chains():
        out.nat_chains.append(_chain_line(sep))
        out.nat_rules += [
            f"-A {sep} -m comment --comment {_quoted(name)} -s {endpoint.ip} -j KUBE-MARK-MASQ",
            f"-A {sep} -m comment --comment {_quoted(name)} {match} -j DNAT "
            f"--to-destination {endpoint.address}",
        ]


def plan_iptables_removal(saved: str) -> str:
    """The `iptables-restore --noflush` input that takes out of an `iptables-save` dump everything
    `render_iptables` put in: every owned chain flushed, every jump into one deleted, the chains
    deleted. "" when there is nothing of it."""
    tables: dict[str, tuple[list[str], list[str]]] = {}
    table = ""
    for line in saved.splitlines():
        if line.startswith("*"):
            table = line[1:]
            tables[table] = ([], [])
        elif line.startswith(":") and _owned(line[1:].split()[0]):
            tables[table][0].append(line[1:].split()[0])
        elif line.startswith("-A "):
            words = line.split()
            target = words[words.index("-j") + 1] if "-j" in words else ""
            if not _owned(words[1]) and _owned(target):
                tables[table][1].append("-D" + line[2:])
    lines: list[str] = []
    for name, (chains, jumps) in tables.items():
        if chains or jumps:
            lines += [f"*{name}", *map(_chain_line, chains), *jumps]
            lines += [f"-X {c}" for c in chains] + ["COMMIT"]
    return "\n".join(lines) + "\n" if lines else ""


def _owned(chain: str) -> bool:
    return chain in _OWNED_CHAINS or chain.startswith(_SERVICE_CHAIN_PREFIXES)


# -- nftables mode --------------------------------------------------------------------------------

_NFT_OBJECTS: Final = """\
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
add chain ip kube-proxy filter-prerouting-pre-dnat { type filter hook prerouting priority -110 ; }
add chain ip kube-proxy filter-output-pre-dnat { type filter hook output priority -110 ; }
add chain ip kube-proxy filter-input { type filter hook input priority 0 ; }
add chain ip kube-proxy filter-forward { type filter hook forward priority 0 ; }
add chain ip kube-proxy filter-output { type filter hook output priority 0 ; }
add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }
add chain ip kube-proxy nat-output { type nat hook output priority -100 ; }
add chain ip kube-proxy nat-postrouting { type nat hook postrouting priority 100 ; }
add chain ip kube-proxy nodeport-endpoints-check
add chain ip kube-proxy service-endpoints-check
add chain ip kube-proxy firewall-check
add chain ip kube-proxy services
add chain ip kube-proxy masquerading
add chain ip kube-proxy cluster-ips-check
add chain ip kube-proxy mark-for-masquerade
add chain ip kube-proxy reject-chain { comment "helper for @no-endpoint-services / @no-endpoint-nodeports" ; }
"""
"""`setupNFTables`' sets, maps and chains on a node without nodePortAddresses (its `nodeport-ips`
set is added and deleted: absent). Priorities as numbers: dstnat-10, filter, dstnat, srcnat."""
_NFT_RULES: Final = f"""\
add rule ip kube-proxy filter-input ct state new jump nodeport-endpoints-check
add rule ip kube-proxy filter-input ct state new jump service-endpoints-check
add rule ip kube-proxy filter-forward ct state new jump service-endpoints-check
add rule ip kube-proxy filter-output ct state new jump service-endpoints-check
add rule ip kube-proxy filter-prerouting-pre-dnat ct state new jump firewall-check
add rule ip kube-proxy filter-output-pre-dnat ct state new jump firewall-check
add rule ip kube-proxy nat-output jump services
add rule ip kube-proxy nat-prerouting jump services
add rule ip kube-proxy nat-postrouting jump masquerading
add rule ip kube-proxy filter-forward ct state new jump cluster-ips-check
add rule ip kube-proxy filter-output ct state new jump cluster-ips-check
add rule ip kube-proxy mark-for-masquerade mark set mark or {MASQUERADE_MARK}
add rule ip kube-proxy masquerading mark and {MASQUERADE_MARK} == 0 return
add rule ip kube-proxy masquerading mark set mark xor {MASQUERADE_MARK}
add rule ip kube-proxy masquerading masquerade fully-random
add rule ip kube-proxy cluster-ips-check ip daddr @cluster-ips reject \
comment "Reject traffic to invalid ports of ClusterIPs"
{{unallocated}}\
add rule ip kube-proxy reject-chain reject
add rule ip kube-proxy service-endpoints-check ip daddr . meta l4proto . th dport \
vmap @no-endpoint-services
add rule ip kube-proxy nodeport-endpoints-check ip daddr != 127.0.0.0/8 meta l4proto . th dport \
vmap @no-endpoint-nodeports
add rule ip kube-proxy firewall-check ip daddr . meta l4proto . th dport vmap @firewall-ips
add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips
add rule ip kube-proxy services fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . \
th dport vmap @service-nodeports
"""
"""`setupNFTables`' rules, in its order; `{unallocated}` is the drop of unallocated cluster IPs,
there when kube-proxy knows the ServiceCIDRs."""


def _add(kind: str, rest: str) -> str:
    return f"add {kind} ip {NFT_TABLE} {rest}"


def _nft_base_rules(service_cidr: str | None) -> str:
    unallocated = (
        _add(
            "rule",
            f"cluster-ips-check ip daddr {{ {service_cidr} }} drop "
            'comment "Drop traffic to unallocated ClusterIPs"',
        )
        + "\n"
        if service_cidr
        else ""
    )
    return _NFT_RULES.format(unallocated=unallocated)


@dataclass
class _Transaction:
    chains: list[str] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)
    elements: list[str] = field(default_factory=list)

    def rule(self, chain: str, rule: str, comment: str = "") -> None:
        self.rules.append(
            _add("rule", f"{chain} {rule}" + (f' comment "{comment}"' if comment else ""))
        )


def render_nftables(
    services: Iterable[Service],
    *,
    masquerade_all: bool = False,
    cluster_cidr: str | None = None,
    service_cidr: str | None = SERVICE_CIDR,
) -> str:
    """An `nft -f` script of `table ip kube-proxy` as kube-proxy's first full sync leaves it, in the
    form of kube-proxy's own test dumps (every object an `add` line, sets and maps and chains before
    the rules and elements that use them)."""
    tx = _Transaction()
    for service in _in_order(services):
        plan = _plan(service, nftables_chains(service))
        _nft_elements(tx, plan)
        _nft_internal(tx, plan, masquerade_all, cluster_cidr)
        _nft_external(tx, plan, cluster_cidr)
        _nft_endpoints(tx, plan)
    chains = "".join(f"{line}\n" for line in tx.chains)
    rules = "".join(f"{line}\n" for line in [*tx.rules, *tx.elements])
    return _NFT_OBJECTS + chains + _nft_base_rules(service_cidr) + rules


def _nft_refusal(refusal: str) -> str:
    return "goto reject-chain" if refusal == "reject" else refusal


def _nft_elements(tx: _Transaction, plan: _Plan) -> None:
    svc, name = plan.service, plan.service.port_name_string
    by_ip = f"{svc.cluster_ip} . {svc.protocol} . {svc.port}"
    tx.elements.append(_add("element", f"cluster-ips {{ {svc.cluster_ip} }}"))
    if plan.internal_refusal:
        verdict = _nft_refusal(plan.internal_refusal)
        tx.elements.append(
            _add("element", f'no-endpoint-services {{ {by_ip} comment "{name}" : {verdict} }}')
        )
    else:
        tx.elements.append(
            _add("element", f"service-ips {{ {by_ip} : goto {plan.chains.cluster} }}")
        )
    if svc.node_port is None:
        return
    by_port = f"{svc.protocol} . {svc.node_port}"
    if plan.has_endpoints:
        tx.elements.append(
            _add("element", f"service-nodeports {{ {by_port} : goto {plan.chains.external} }}")
        )
    if plan.external_refusal:
        verdict = _nft_refusal(plan.external_refusal)
        tx.elements.append(
            _add("element", f'no-endpoint-nodeports {{ {by_port} comment "{name}" : {verdict} }}')
        )


def _nft_internal(tx: _Transaction, plan: _Plan, masquerade_all: bool, cidr: str | None) -> None:
    if plan.internal_refusal or not (masquerade_all or cidr):
        return
    outside = "" if masquerade_all else f" ip saddr != {cidr}"
    tx.rule(
        plan.chains.cluster, f"ip daddr {plan.service.cluster_ip}{outside} jump mark-for-masquerade"
    )


def _nft_external(tx: _Transaction, plan: _Plan, cidr: str | None) -> None:
    if not plan.uses_external_chain:
        return
    ext, cluster = plan.chains.external, plan.chains.cluster
    tx.chains.append(_add("chain", ext))
    if not plan.local:
        tx.rule(ext, "jump mark-for-masquerade")
    else:
        if cidr:
            tx.rule(ext, f"ip saddr {cidr} goto {cluster}", "short-circuit pod traffic")
        tx.rule(ext, "fib saddr type local jump mark-for-masquerade", "masquerade local traffic")
        tx.rule(ext, f"fib saddr type local goto {cluster}", "short-circuit local traffic")
    if plan.has_external_endpoints:
        tx.rule(ext, f"goto {plan.external_policy_chain}")


def _nft_endpoints(tx: _Transaction, plan: _Plan) -> None:
    """service- over every endpoint, local- over the local ones (Local policy), an endpoint- each:
    one `numgen random mod n` verdict map picks the endpoint."""
    if not plan.has_endpoints:
        return
    tx.chains += [_add("chain", sep) for _, sep in plan.endpoint_chains()]
    policies = [(plan.chains.cluster, plan.endpoint_chains())]
    if plan.local and plan.service.local_endpoints:
        policies.append((plan.chains.local, plan.endpoint_chains(local_only=True)))
    for chain, pairs in policies:
        tx.chains.append(_add("chain", chain))
        picks = " , ".join(f"{i} : goto {sep}" for i, (_, sep) in enumerate(pairs))
        tx.rule(chain, f"numgen random mod {len(pairs)} vmap {{ {picks} }}")
    for endpoint, sep in plan.endpoint_chains():
        tx.rule(sep, f"ip saddr {endpoint.ip} jump mark-for-masquerade")
        tx.rule(sep, f"meta l4proto {plan.service.protocol} dnat to {endpoint.address}")


# -- a node's namespace ---------------------------------------------------------------------------


def install(
    namespace: str,
    mode: Mode,
    services: Sequence[Service],
    node_ip: str,
    masquerade_all: bool = False,
    *,
    cluster_cidr: str | None = None,
    service_cidr: str | None = SERVICE_CIDR,
) -> None:
    """Puts kube-proxy's rules for `services` into the named namespace (the node's), after removing
    whatever either mode left there, as kube-proxy clears the other modes' rules when it starts.
    `node_ip` must be one of the namespace's addresses: kube-proxy's node IP (no rule modelled here
    depends on it; it keeps a test from aiming NodePorts at an address the node does not have)."""
    owned = {a["local"] for link in _addresses(namespace) for a in link.get("addr_info", [])}
    if node_ip not in owned:
        raise ValueError(f"{node_ip} is not an address of namespace {namespace}: {sorted(owned)}")
    remove(namespace)
    if mode == "iptables":
        sysctl(namespace, ROUTE_LOCALNET, "1")  # localhost NodePorts, as kube-proxy sets it
        text = render_iptables(services, masquerade_all=masquerade_all, cluster_cidr=cluster_cidr)
        run(in_netns(namespace, IPTABLES_RESTORE, "--noflush"), text)
    else:
        script = render_nftables(
            services,
            masquerade_all=masquerade_all,
            cluster_cidr=cluster_cidr,
            service_cidr=service_cidr,
        )
        nft(namespace, script)


def remove(namespace: str, mode: Mode | None = None) -> None:
    """Takes out of the namespace what `install` put there in `mode` (None: in either mode). For
    iptables, `route_localnet` goes back to 0 and the iptables-nft tables left empty are deleted."""
    if mode in (None, "nftables"):
        nft(namespace, f"add table ip {NFT_TABLE}\ndelete table ip {NFT_TABLE}\n")
    if mode in (None, "iptables"):
        script = plan_iptables_removal(run(in_netns(namespace, IPTABLES_SAVE)))
        if script:
            run(in_netns(namespace, IPTABLES_RESTORE, "--noflush"), script)
        sysctl(namespace, ROUTE_LOCALNET, "0")
        for table in ("mangle", "nat", "filter"):
            if _is_empty_xtables_table(namespace, table):
                nft(namespace, f"delete table ip {table}\n")


def _addresses(namespace: str) -> list[dict[str, list[dict[str, str]]]]:
    listed = json.loads(ip(namespace, "-j", "-4", "addr", "show") or "[]")
    assert isinstance(listed, list)
    return listed


def _is_empty_xtables_table(namespace: str, table: str) -> bool:
    """True when iptables-nft's table exists holding nothing but its empty built-in chains."""
    done = subprocess.run(
        in_netns(namespace, "nft", "-j", "list", "table", "ip", table),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if done.returncode != 0:
        return False  # no such table
    items = json.loads(done.stdout)["nftables"]
    return not any("rule" in i or ("chain" in i and "hook" not in i["chain"]) for i in items)
