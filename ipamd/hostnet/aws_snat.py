"""aws-node's SNAT, removed once ipamd's own table is live: VPC CNI's chains, the rules that jump to
them and the connmark rules it adds, wherever VPC CNI put them; every other rule stays.

What VPC CNI leaves (v1.23, `pkg/networkutils`; its default mark 0x80 and interface names):
- table nat: chain `AWS-SNAT-CHAIN-0` (RETURN for the VPC's and excluded CIDRs, then SNAT to the
  primary address), jumped to from POSTROUTING; chain `AWS-CONNMARK-CHAIN-0` (RETURN for the same
  CIDRs, then `CONNMARK --set-xmark 0x80/0x80`), jumped to from PREROUTING for traffic entering from
  the pods' veths (`-i eni+`), and PREROUTING's `CONNMARK --restore-mark --mask 0x80`. Older
  versions had more chains (`AWS-SNAT-CHAIN-1`, ...), and some put the connmark chain in mangle:
  every `AWS-SNAT-CHAIN-<n>` and `AWS-CONNMARK-CHAIN-<n>` of nat and mangle goes.
- table mangle, PREROUTING: `-i <primary> -m addrtype --dst-type LOCAL --limit-iface-in -j CONNMARK
  --set-mark 0x80/0x80` (node ports), and `-i eni+` / `-i vlan+` `-j CONNMARK --restore-mark --mask
  0x80` (replies of marked connections).
- With its nftables connmark backend (newer versions), the connmark side is a table of its own,
  `table ip aws-cni`, which goes whole.

The mangle PREROUTING rules are what makes NodePort and hostPort work for pods on secondary ENIs
(AWS_VPC_CNI_NODE_PORT_SUPPORT): they go only when ipamd's own table marks inbound connections
(`inbound`), so a node taken over keeps serving them; with ipamd's node port support off, they
stay.

Where: iptables-nft keeps nat and mangle as nft tables `ip nat` and `ip mangle`, read and changed
here through the `nft` binary; iptables-legacy keeps them in the kernel's xtables, read and changed
through `iptables-legacy-save` / `iptables-legacy-restore` when those are installed. In the nft
listing iptables' comments do not show (they are xtables matches), so VPC CNI's rules are known by
what they do (`plan_nft_removal`); in the legacy save they are known by VPC CNI's comments
(`plan_legacy_removal`). Each backend removes in one batch (`nft -f -`, one `iptables-restore
--noflush` transaction): the kernel sees all of VPC CNI's rules or none, never a jump to a chain that
is gone. kube-proxy's chains and rules in the same tables are never touched.

A listing that fails removes nothing in that backend; the other still runs. Running again when
nothing of VPC CNI's is left changes nothing and runs no batch.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from ipamd.hostnet.ports import HostNetError, KernelUnreadable
from ipamd.hostnet.snat import FAMILY, absent, run_tool

AWS_CHAIN = re.compile(r"AWS-(?:SNAT|CONNMARK)-CHAIN-\d+")
"""VPC CNI's chain names (validated by this pattern, they are safe to write into a script)."""
IPTABLES_TABLES = ("nat", "mangle")
AWS_CNI_TABLE = "aws-cni"

_JUMP = re.compile(r"\b(?:jump|goto)\s+\"?(AWS-(?:SNAT|CONNMARK)-CHAIN-\d+)\"?(?:\s|$)")
_MARK = r"0x0*80"
_NFT_RESTORE = re.compile(rf"meta mark set ct mark (?:and|&) {_MARK}")
_NFT_RESTORE_FROM = re.compile(rf'iifname "[^"]+\*" meta mark set ct mark (?:and|&) {_MARK}')
_NFT_MARK_LOCAL = re.compile(
    rf'iifname "[^"]+" fib daddr(?: \. iif)? type local ct mark set ct mark (?:or|\|) {_MARK}'
)
_NFT_NOISE = re.compile(r'\bcounter(?: packets \d+ bytes \d+)?|\bcomment "[^"]*"|#.*$')
_CHAIN_LINE = re.compile(r'^\s*chain\s+"?([^"\s{]+)"?\s*\{')
_BLOCK_LINE = re.compile(r"^\s*\S+\s+\S+\s*\{\s*(?:#.*)?$")
_HANDLE = re.compile(r"#\s*handle\s+(\d+)\s*$")

_LEGACY_JUMP = re.compile(r"\s-[jg]\s+(AWS-(?:SNAT|CONNMARK)-CHAIN-\d+)(?:\s|$)")
_LEGACY_CONNMARK = re.compile(r'--comment "?AWS, (?:CONNMARK|primary ENI)"?\s.*-j CONNMARK\b')


@dataclass(frozen=True, slots=True)
class Removal:
    """What one pass removed (a line each, for the log) and what it could not do."""

    removed: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()


class AwsNodeSnat(Protocol):
    async def remove(self, *, inbound: bool) -> Removal:
        """Remove VPC CNI's SNAT and connmark chains and rules; its marks of inbound connections
        (mangle PREROUTING) only with `inbound` (ipamd's table marks them now). Never raises: a
        backend that could not be listed or changed is named in `failed` (nothing of it removed)."""
        ...


# -- the nft side (iptables-nft's tables and VPC CNI's own table) ----------------------------------


@dataclass(frozen=True, slots=True)
class NftRule:
    chain: str
    handle: int
    text: str
    """Without counters, comments and the handle, spaces collapsed."""


def parse_nft_table(listing: str) -> tuple[list[str], list[NftRule]]:
    """The chains and rules of `nft -a list table ...`'s output."""
    chains: list[str] = []
    rules: list[NftRule] = []
    chain: str | None = None
    depth = 0  # inside a block that is not a chain (a set, a map)
    for line in listing.splitlines():
        stripped = line.strip()
        if depth:
            depth += stripped.endswith("{") - (stripped == "}")
            continue
        if chain is None:
            found = _CHAIN_LINE.match(line)
            if found:
                chain = found.group(1)
                chains.append(chain)
            elif _BLOCK_LINE.match(line) and not stripped.startswith("table "):
                depth = 1
            continue
        if stripped == "}":
            chain = None
            continue
        handle = _HANDLE.search(line)
        if handle is not None:
            text = " ".join(_NFT_NOISE.sub(" ", line).split())
            rules.append(NftRule(chain, int(handle.group(1)), text))
    return chains, rules


def is_vpc_cni_nft_rule(table: str, rule: NftRule, *, inbound: bool = True) -> bool:
    """Whether an iptables-nft rule outside VPC CNI's chains is one VPC CNI adds (its inbound
    marks in mangle only with `inbound`)."""
    if _JUMP.search(rule.text):
        return True
    if rule.chain != "PREROUTING":
        return False
    if table == "nat":
        return _NFT_RESTORE.fullmatch(rule.text) is not None
    if table == "mangle" and inbound:
        return bool(_NFT_RESTORE_FROM.fullmatch(rule.text) or _NFT_MARK_LOCAL.fullmatch(rule.text))
    return False


def plan_nft_removal(
    table: str, listing: str, *, inbound: bool = True
) -> tuple[list[str], list[str]]:
    """The nft commands that remove VPC CNI's rules and chains from `table ip <table>` (given its
    `nft -a list` output), and a line for each thing removed. The jumps go before their chains;
    VPC CNI's marks of inbound connections only with `inbound`."""
    chains, rules = parse_nft_table(listing)
    script: list[str] = []
    removed: list[str] = []
    for rule in rules:
        if AWS_CHAIN.fullmatch(rule.chain) or not is_vpc_cni_nft_rule(table, rule, inbound=inbound):
            continue
        script.append(f"delete rule {FAMILY} {table} {rule.chain} handle {rule.handle}")
        removed.append(f"{FAMILY} {table} {rule.chain}: {rule.text}")
    for chain in chains:
        if AWS_CHAIN.fullmatch(chain):
            script += [
                f"flush chain {FAMILY} {table} {chain}",
                f"delete chain {FAMILY} {table} {chain}",
            ]
            removed.append(f"{FAMILY} {table} chain {chain}")
    return script, removed


# -- the iptables-legacy side -----------------------------------------------------------------------


def _save_tables(save: str) -> Iterator[tuple[str, list[str]]]:
    table: str | None = None
    lines: list[str] = []
    for line in save.splitlines():
        if line.startswith("*"):
            table, lines = line[1:].strip(), []
        elif line.strip() == "COMMIT" and table is not None:
            yield table, lines
            table = None
        elif table is not None:
            lines.append(line)


def plan_legacy_removal(save: str, *, inbound: bool = True) -> tuple[str, list[str]]:
    """The `iptables-restore --noflush` input that removes VPC CNI's rules and chains from nat and
    mangle (given `iptables-save`'s output), and a line for each thing removed; "" when there is
    nothing of VPC CNI's. Its marks of inbound connections (mangle) only with `inbound`."""
    script: list[str] = []
    removed: list[str] = []
    for table, lines in _save_tables(save):
        if table not in IPTABLES_TABLES:
            continue
        chains = [c for c in (ln[1:].split()[0] for ln in lines if ln.startswith(":")) if c]
        ours = [c for c in chains if AWS_CHAIN.fullmatch(c)]
        deletes: list[str] = []
        for line in lines:
            if not line.startswith("-A "):
                continue
            chain = line.split()[1]
            if AWS_CHAIN.fullmatch(chain):
                continue
            spec = f" {line[3:]} "
            if _LEGACY_JUMP.search(spec) or (
                chain == "PREROUTING"
                and (inbound or table != "mangle")
                and _LEGACY_CONNMARK.search(spec)
            ):
                deletes.append(f"-D {line[3:]}")
                removed.append(f"iptables-legacy {table}: {line}")
        if not (deletes or ours):
            continue
        removed += [f"iptables-legacy {table} chain {c}" for c in ours]
        flushes = [f"-F {c}" for c in ours] + [f"-X {c}" for c in ours]
        script += [f"*{table}", *deletes, *flushes, "COMMIT"]
    return ("\n".join(script) + "\n" if script else ""), removed


# -- the adapter --------------------------------------------------------------------------------------


class NftAwsNodeSnat:
    """`AwsNodeSnat` over the `nft` binary (iptables-nft's nat and mangle, `table ip aws-cni`) and,
    when given, `iptables-legacy-save` / `iptables-legacy-restore`; each run as an asyncio
    subprocess with a timeout."""

    def __init__(
        self,
        nft: Sequence[str] = ("nft",),
        legacy_save: Sequence[str] | None = None,
        legacy_restore: Sequence[str] | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        if not nft or (legacy_save is None) != (legacy_restore is None):
            raise ValueError("nft is needed, and the legacy save and restore commands go together")
        self._nft = tuple(nft)
        self._legacy = (
            (tuple(legacy_save), tuple(legacy_restore))
            if legacy_save is not None and legacy_restore is not None
            else None
        )
        self._timeout_s = timeout_s

    @classmethod
    def installed(cls, which: Callable[[str], str | None] = shutil.which) -> NftAwsNodeSnat:
        """nft, and iptables-legacy's save and restore when both are on the PATH."""
        save, restore = which("iptables-legacy-save"), which("iptables-legacy-restore")
        if save is None or restore is None:
            return cls()
        return cls(legacy_save=(save,), legacy_restore=(restore, "--noflush"))

    async def remove(self, *, inbound: bool) -> Removal:
        removed: list[str] = []
        failed: list[str] = []
        steps = [self._remove_nft, *([self._remove_legacy] if self._legacy is not None else [])]
        for step in steps:
            try:
                removed += await step(inbound)
            except HostNetError as err:
                failed.append(str(err))
        return Removal(tuple(removed), tuple(failed))

    async def _remove_nft(self, inbound: bool) -> list[str]:
        script: list[str] = []
        removed: list[str] = []
        for table in IPTABLES_TABLES:
            listing = await self._nft_listing(table)
            if listing is not None:
                lines, what = plan_nft_removal(table, listing, inbound=inbound)
                script += lines
                removed += what
        if await self._nft_listing(AWS_CNI_TABLE) is not None:
            script.append(f"delete table {FAMILY} {AWS_CNI_TABLE}")
            removed.append(f"table {FAMILY} {AWS_CNI_TABLE}")
        if not script:
            return []
        rc, _, err = await self._run((*self._nft, "-f", "-"), "\n".join(script) + "\n")
        if rc != 0:
            raise HostNetError(f"nft refused to remove aws-node's SNAT: {err.strip()}")
        return removed

    async def _nft_listing(self, table: str) -> str | None:
        try:
            rc, out, err = await self._run((*self._nft, "-a", "list", "table", FAMILY, table))
        except HostNetError as exc:
            raise KernelUnreadable(str(exc)) from exc
        if rc == 0:
            return out
        if absent(err):
            return None
        raise KernelUnreadable(f"nft could not list table {FAMILY} {table}: {err.strip()}")

    async def _remove_legacy(self, inbound: bool) -> list[str]:
        assert self._legacy is not None
        save, restore = self._legacy
        try:
            rc, out, err = await self._run(save)
        except HostNetError as exc:
            raise KernelUnreadable(str(exc)) from exc
        if rc != 0:
            raise KernelUnreadable(f"{save[-1]} failed: {err.strip()}")
        script, removed = plan_legacy_removal(out, inbound=inbound)
        if not script:
            return []
        rc, _, err = await self._run(restore, script)
        if rc != 0:
            raise HostNetError(f"iptables-legacy-restore refused: {err.strip()}")
        return removed

    async def _run(self, argv: Sequence[str], stdin: str | None = None) -> tuple[int, str, str]:
        return await run_tool(argv, stdin, self._timeout_s, "packages nftables, iptables")
