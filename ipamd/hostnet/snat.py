"""ipamd's nftables table: SNAT of pod traffic leaving the VPC, and the connmark that routes it.

Owns exactly one table, `table ip ipamd`, and nothing else of the netfilter state: it never lists,
edits or flushes another table, and never the whole ruleset. `render_ruleset` turns a `SnatPlan` into
the nft script that replaces the table in one transaction; `NftSnatTable` applies, compares and
removes it by running the `nft` binary; `SnatTable` is the port the daemon uses (a stateful fake
lives in `ipamd.hostnet.fake`). With AWS_VPC_K8S_CNI_EXTERNALSNAT=true the table has no SNAT and
no mark of outbound connections (`SnatPlan.snat`); with AWS_VPC_CNI_NODE_PORT_SUPPORT=false too, the
daemon calls `remove()`. The policy rule that reads the mark (`fwmark 0x80/0x80 lookup main` at
`PRIORITY_CONNMARK`) and the rule that routes replies to pods belong to the host-network port, not
here. Every error is a `HostNetError` (`KernelUnreadable` when a listing fails).

Inbound connections (AWS_VPC_CNI_NODE_PORT_SUPPORT, `SnatPlan.node_port`), as VPC CNI's mangle
PREROUTING rule `-i <primary> -m addrtype --dst-type LOCAL --limit-iface-in -j CONNMARK --set-mark
0x80/0x80` (aws/amazon-vpc-cni-k8s v1.23.1, pkg/networkutils/network.go): a packet arriving on the
primary ENI's link for an address of that link (a NodePort, a hostPort, an NLB or ALB target of type
instance) sets conntrack mark bit 0x80, in chain `inbound` at mangle priority, before kube-proxy's
and portmap's DNAT turn the destination into a pod's. The pod's replies copy the bit into their
packet mark (chain `prerouting`), so they leave by the primary ENI, where the un-DNAT gives them the
node's address and port.

What the table does, as AWS VPC CNI does with iptables: a connection whose first packet enters the
node from a pod (from no ENI link) towards a destination outside every exempt CIDR (the VPC's and
AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS) that is not a local address gets conntrack mark bit 0x80; every
packet of such a connection, from the pod or arriving on the primary ENI, copies the bit into its
packet mark, so routing sends the flow out the primary ENI; and in postrouting, a packet leaving the
primary ENI's link towards a non-exempt destination from a non-local source is SNATed to the primary
ENI's primary address.

Coexistence with kube-proxy (iptables-nft or nftables mode): its rules live in other tables (`table
ip nat`, `table ip filter`, `table ip kube-proxy`), which ipamd never touches, and the hooks of all
tables run. NAT is decided once per connection, on its first packet: the kernel runs the nat chains
of one hook in priority order, and the first that NATs the connection decides it; later nat chains
never see that connection. kube-proxy's KUBE-POSTROUTING masquerades (packets it marked 0x4000) in
`table ip nat` at `srcnat` priority, and its service DNAT is at `dstnat`. ipamd's SNAT chain sits at
`srcnat + 10`: strictly after kube-proxy's, so which chain decides a connection both would NAT is
fixed instead of depending on registration order, and kube-proxy's masquerade (which picks the same
primary address on the primary link) wins. ipamd's mark chain is a filter chain at `dstnat + 10`,
rather than at mangle priority, because it must see a connection's destination after kube-proxy's
DNAT: a pod's packet to a ClusterIP (outside the VPC CIDRs) that DNATs to a pod on another node
must not be marked, or it would leave by the primary ENI with a secondary ENI's pod address and be
dropped by EC2's source/destination check (VPC CNI gets the same effect from setting the connmark in
nat PREROUTING after KUBE-SERVICES). Any prerouting priority is still before the routing decision
that reads the mark.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from ipamd.hostnet.ports import CONNMARK, HostNetError, KernelUnreadable

__all__ = [
    "CONNMARK",
    "FAMILY",
    "TABLE",
    "NftSnatTable",
    "Randomize",
    "SnatPlan",
    "SnatTable",
    "absent",
    "normalize_listing",
    "render_ruleset",
    "run_tool",
]

TABLE = "ipamd"
FAMILY = "ip"

Randomize = Literal["prng", "hashrandom", "none"]

_RANDOMIZE_FLAG: dict[str, str] = {"prng": " fully-random", "hashrandom": " random", "none": ""}
"""AWS_VPC_K8S_CNI_RANDOMIZESNAT → the nft SNAT flag (iptables' --random-fully / --random)."""

_IFNAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,14}")
"""Linux allows up to 15 bytes of almost anything; ipamd accepts what ENI links are called, and
nothing that could end a quoted nft string or start a wildcard."""

_COUNTER = re.compile(r"\bcounter packets \d+ bytes \d+")


@dataclass(frozen=True, slots=True)
class SnatPlan:
    """What the table must do on this node."""

    primary_ip: str
    """The primary ENI's primary private address: the SNAT source."""
    primary_ifname: str
    """The primary ENI's link: SNAT applies to packets leaving it."""
    eni_ifnames: tuple[str, ...]
    """Every ENI link, the primary included: traffic entering from them is not a pod's."""
    exempt_cidrs: tuple[str, ...]
    """The VPC's CIDRs and AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS: destinations never SNATed."""
    randomize: Randomize = "prng"
    """AWS_VPC_K8S_CNI_RANDOMIZESNAT."""
    snat: bool = True
    """Pods' connections leaving the VPC are marked and SNATed (not AWS_VPC_K8S_CNI_EXTERNALSNAT)."""
    node_port: bool = False
    """AWS_VPC_CNI_NODE_PORT_SUPPORT: connections to the node's own addresses arriving on the primary
    ENI are marked, so that pods' replies leave by the primary ENI."""
    egress_cidr: str = ""
    """IPv6 mode: the range of IPv6 pods' IPv4 egress interfaces (`ipamd.wire.pod.V4_EGRESS_CIDR`).
    The table then only SNATs that range to `primary_ip`, whatever the destination but multicast:
    no connmark and no exempt CIDRs, since an IPv6 pod's own addresses are never NATed and its
    link-local IPv4 is routable nowhere, the VPC included (as VPC CNI's egress plugin does)."""


def _ifname(name: str) -> str:
    if not isinstance(name, str) or not _IFNAME.fullmatch(name):
        raise ValueError(f"not a link name ipamd accepts: {name!r}")
    return name


def _exempt(cidrs: Sequence[str]) -> list[str]:
    networks: list[ipaddress.IPv4Network] = []
    for cidr in cidrs:
        if not isinstance(cidr, str) or not cidr.isascii():
            raise ValueError(f"not an IPv4 CIDR: {cidr!r}")
        try:
            # Host bits are masked, as VPC CNI's net.ParseCIDR does with the excluded CIDRs.
            network = ipaddress.ip_network(cidr, strict=False)
        except ValueError as exc:
            raise ValueError(f"not an IPv4 CIDR: {cidr!r}") from exc
        if not isinstance(network, ipaddress.IPv4Network):
            raise ValueError(f"not an IPv4 CIDR (the table is IPv4-only): {cidr!r}")
        networks.append(network)
    return [str(n) for n in ipaddress.collapse_addresses(networks)]


def _primary_ip(address: str) -> str:
    if not isinstance(address, str) or not address.isascii():
        raise ValueError(f"not an IPv4 address: {address!r}")
    try:
        ip = ipaddress.IPv4Address(address)
    except ValueError as exc:
        raise ValueError(f"not an IPv4 address: {address!r}") from exc
    if ip.is_unspecified or ip.is_multicast or ip.is_loopback:
        raise ValueError(f"not a usable SNAT source: {address!r}")
    return str(ip)


def render_ruleset(plan: SnatPlan) -> str:
    """The nft script that makes `table ip ipamd` exactly the plan's, in one transaction.

    The first line creates the table if it is absent, so that the `delete` after it cannot fail, and
    the whole script is one batch: the kernel sees either the old table or the new one, never no
    table. Deterministic: equal plans (up to order and duplicates) render the same text. Raises
    `ValueError` for an address, CIDR or link name that is invalid or could inject into the script.
    """
    primary_ip = _primary_ip(plan.primary_ip)
    if plan.egress_cidr:
        return _render_egress(plan.egress_cidr, primary_ip, plan.randomize)
    primary = _ifname(plan.primary_ifname)
    links = sorted({_ifname(name) for name in plan.eni_ifnames})
    if primary not in links:
        raise ValueError(f"the primary link {primary!r} is not among the ENI links {links}")
    if plan.randomize not in _RANDOMIZE_FLAG:
        raise ValueError(f"unknown SNAT randomization: {plan.randomize!r}")
    if not (plan.snat or plan.node_port):
        raise ValueError("a plan that neither SNATs nor marks node ports has no table: remove it")
    mark = f"0x{CONNMARK:08x}"
    link_elements = ", ".join(f'"{name}"' for name in links)
    lines = [
        f"table {FAMILY} {TABLE}",
        f"delete table {FAMILY} {TABLE}",
        f"table {FAMILY} {TABLE} {{",
        '\tcomment "ipamd: the connmark routing pod traffic by the primary ENI, and SNAT"',
        *(_exempt_set(plan.exempt_cidrs) if plan.snat else []),
        "\tset eni_links {",
        "\t\ttype ifname",
        '\t\tcomment "every ENI link: traffic entering from one is not a pod\'s"',
        f"\t\telements = {{ {link_elements} }}",
        "\t}",
        *(_inbound_chain(primary, mark) if plan.node_port else []),
        "\tchain prerouting {",
        '\t\tcomment "connmark of pods\' connections and their packets; after kube-proxy DNAT"',
        "\t\ttype filter hook prerouting priority dstnat + 10; policy accept;",
        # Only a connection's first packet decides: the replies of a connection opened towards a
        # pod (say from a client outside the VPC) must keep leaving by the pod's own ENI.
        *(
            [
                f"\t\tiifname != @eni_links ct state new ip daddr != @exempt"
                f" fib daddr type != local ct mark set ct mark | {mark}"
                ' comment "a pod opens a connection leaving the VPC: mark it"'
            ]
            if plan.snat
            else []
        ),
        f"\t\tiifname != @eni_links ct mark & {mark} == {mark} meta mark set meta mark | {mark}"
        ' comment "pod packets of marked connections route via main, out the primary ENI"',
        f'\t\tiifname "{primary}" ct mark & {mark} == {mark} meta mark set meta mark | {mark}'
        ' comment "packets of marked connections arriving on the primary ENI keep the route"',
        "\t}",
        *(_snat_chain(primary, primary_ip, plan.randomize) if plan.snat else []),
        "}",
    ]
    return "\n".join(lines) + "\n"


def _exempt_set(cidrs: Sequence[str]) -> list[str]:
    exempt = _exempt(cidrs)
    # nft rejects an empty `elements = { }`; a set without elements matches nothing, so `!= @exempt`
    # then matches every destination, which is what no exempt CIDR means.
    elements = [f"\t\telements = {{ {', '.join(exempt)} }}"] if exempt else []
    return [
        "\tset exempt {",
        "\t\ttype ipv4_addr",
        "\t\tflags interval",
        # The rendered elements never overlap (collapsed above); auto-merge keeps an overlapping
        # element someone adds later from being refused as a conflicting interval.
        "\t\tauto-merge",
        '\t\tcomment "VPC CIDRs and excluded CIDRs: destinations never SNATed"',
        *elements,
        "\t}",
    ]


def _inbound_chain(primary: str, mark: str) -> list[str]:
    """AWS_VPC_CNI_NODE_PORT_SUPPORT. Before kube-proxy's DNAT (mangle priority), while the
    destination is still the node's own address: after it, a NodePort's packet is addressed to the
    pod. The replies then carry the mark (the prerouting chain copies it from the connection), so
    `fwmark 0x80/0x80 lookup main` routes them out the primary ENI, where the un-DNAT gives them the
    node's address; without it a pod on a secondary ENI would answer by its own ENI, with a source
    that ENI does not own, and EC2's source/destination check would drop the reply."""
    return [
        "\tchain inbound {",
        '\t\tcomment "connmark of connections to the node arriving on the primary ENI; before DNAT"',
        "\t\ttype filter hook prerouting priority mangle; policy accept;",
        f'\t\tiifname "{primary}" fib daddr . iif type local ct mark set ct mark | {mark}'
        ' comment "NodePort, hostPort: pods answer by the primary ENI"',
        "\t}",
    ]


def _snat_chain(primary: str, primary_ip: str, randomize: Randomize) -> list[str]:
    return [
        "\tchain postrouting {",
        '\t\tcomment "SNAT of pod traffic leaving the VPC; after kube-proxy masquerade"',
        "\t\ttype nat hook postrouting priority srcnat + 10; policy accept;",
        f'\t\toifname "{primary}" ip daddr != @exempt fib saddr type != local'
        f" snat to {primary_ip}{_RANDOMIZE_FLAG[randomize]}"
        ' comment "pod traffic leaving the VPC takes the primary ENI address"',
        "\t}",
    ]


def _render_egress(cidr: str, primary_ip: str, randomize: Randomize) -> str:
    """IPv6 mode's table (`SnatPlan.egress_cidr`), replaced in one transaction like the other."""
    (egress,) = _exempt([cidr])  # one IPv4 CIDR, host bits masked
    if randomize not in _RANDOMIZE_FLAG:
        raise ValueError(f"unknown SNAT randomization: {randomize!r}")
    lines = [
        f"table {FAMILY} {TABLE}",
        f"delete table {FAMILY} {TABLE}",
        f"table {FAMILY} {TABLE} {{",
        '\tcomment "ipamd: SNAT of IPv6 pods\' IPv4 egress"',
        "\tchain postrouting {",
        '\t\tcomment "IPv4 egress of IPv6 pods takes the node\'s IPv4; after kube-proxy masquerade"',
        "\t\ttype nat hook postrouting priority srcnat + 10; policy accept;",
        f"\t\tip saddr {egress} ip daddr != 224.0.0.0/4"
        f" snat to {primary_ip}{_RANDOMIZE_FLAG[randomize]}"
        ' comment "an IPv6 pod\'s IPv4 connection leaves as the node"',
        "\t}",
        "}",
    ]
    return "\n".join(lines) + "\n"


class SnatTable(Protocol):
    """ipamd's SNAT and connmark table in the node's kernel. Every method raises only
    `HostNetError` subclasses (`KernelUnreadable` when the table cannot be listed)."""

    async def apply(self, plan: SnatPlan) -> bool:
        """Make the kernel's table exactly the plan's, atomically. True if that changed anything."""
        ...

    async def remove(self) -> bool:
        """Remove the table (AWS_VPC_K8S_CNI_EXTERNALSNAT). True if it was there."""
        ...

    async def matches(self, plan: SnatPlan) -> bool:
        """Whether the kernel's table is the plan's, untouched since it was applied."""
        ...


@dataclass(frozen=True, slots=True)
class _Applied:
    script: str
    listing: str


def normalize_listing(text: str) -> str:
    """A table listing without what changes by itself: counters' values, indentation, blank lines.
    A counter someone added stays visible as `counter`."""
    lines = (_COUNTER.sub("counter", line).strip() for line in text.splitlines())
    return "\n".join(line for line in lines if line)


class NftSnatTable:
    """`SnatTable` over the `nft` binary, run as an asyncio subprocess.

    Comparison is by content: after a successful apply it keeps the plan's script and the table's
    normalized listing, and the table matches a plan when the plan renders that script and the
    kernel's listing is still that listing (so a rule added or deleted by hand is seen). A fresh
    instance knows no listing yet: `matches` is False until it applied once, and `apply` then
    replaces the table and reports a change only if the listing differs from the one before.
    """

    def __init__(self, command: Sequence[str] = ("nft",), timeout_s: float = 10.0) -> None:
        if not command:
            raise ValueError("the nft command is empty")
        self._command = tuple(command)
        self._timeout_s = timeout_s
        self._applied: _Applied | None = None
        self._lock = asyncio.Lock()

    async def apply(self, plan: SnatPlan) -> bool:
        script = render_ruleset(plan)
        async with self._lock:
            before = await self._listing()
            applied = self._applied
            if applied is not None and applied.script == script and before == applied.listing:
                return False
            self._applied = None
            rc, _, err = await self._run(("-f", "-"), stdin=script)
            if rc != 0:
                raise HostNetError(f"nft refused ipamd's table: {err.strip()}")
            after = await self._listing()
            if after is None:
                raise HostNetError(f"table {FAMILY} {TABLE} is absent right after it was applied")
            self._applied = _Applied(script, after)
            return before != after

    async def remove(self) -> bool:
        async with self._lock:
            self._applied = None
            if await self._listing() is None:
                return False
            rc, _, err = await self._run(("delete", "table", FAMILY, TABLE))
            if rc == 0:
                return True
            if absent(err):
                return False
            raise HostNetError(f"nft could not delete table {FAMILY} {TABLE}: {err.strip()}")

    async def matches(self, plan: SnatPlan) -> bool:
        script = render_ruleset(plan)
        async with self._lock:
            current = await self._listing()
            applied = self._applied
            return applied is not None and applied.script == script and current == applied.listing

    async def _listing(self) -> str | None:
        """The table's normalized listing, or None if it is absent."""
        try:
            rc, out, err = await self._run(("list", "table", FAMILY, TABLE))
        except HostNetError as exc:
            raise KernelUnreadable(str(exc)) from exc
        if rc == 0:
            return normalize_listing(out)
        if absent(err):
            return None
        raise KernelUnreadable(f"nft could not list table {FAMILY} {TABLE}: {err.strip()}")

    async def _run(self, args: Sequence[str], stdin: str | None = None) -> tuple[int, str, str]:
        return await run_tool((*self._command, *args), stdin, self._timeout_s, "package nftables")


async def run_tool(
    argv: Sequence[str], stdin: str | None, timeout_s: float, package: str
) -> tuple[int, str, str]:
    """Run a kernel tool (`nft`, `iptables-legacy-save`, ...) as an asyncio subprocess: its exit
    code, stdout and stderr. Raises `HostNetError` when it cannot be run (naming `package`) or
    outlives `timeout_s` (it is killed then)."""
    # The C locale keeps the tools' error text (strerror) recognizable; a session of its own lets a
    # timeout kill whatever the command started (`ip netns exec` and the like).
    env = {**os.environ, "LC_ALL": "C"}
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
    except FileNotFoundError as exc:
        raise HostNetError(f"{argv[0]!r} not found: ipamd needs it ({package})") from exc
    except OSError as exc:
        raise HostNetError(f"could not run {argv[0]!r}: {exc}") from exc
    data = stdin.encode() if stdin is not None else None
    try:
        out, err = await asyncio.wait_for(proc.communicate(data), timeout_s)
    except TimeoutError as exc:
        _kill(proc)
        await proc.communicate()
        raise HostNetError(f"{' '.join(argv)} timed out after {timeout_s} s") from exc
    except asyncio.CancelledError:
        # Safe even mid-`nft -f` or `iptables-restore`: the kernel commits a batch whole or not.
        _kill(proc)
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


_ABSENT = re.compile(r"^Error: No such file or directory\b", re.MULTILINE)
"""nft's own ENOENT for the table, as against a wrapper's (`ip netns exec` cannot open the namespace:
"Cannot open network namespace ...: No such file or directory"), which must not read as "absent"."""


def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def absent(stderr: str) -> bool:
    """Whether nft's error says the table it was asked about does not exist."""
    return _ABSENT.search(stderr) is not None
