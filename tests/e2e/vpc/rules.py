"""ipamd's policy rules as the tests read them from a node's kernel: VPC CNI's numbering (priorities,
the table of each device index, the connmark), one `KernelRule` per `ip -j rule` entry, and the rules
a pod on a given ENI must have."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from bench.vpc.processes import bare

MAIN_TABLE = 254
PRIORITY_TO_POD = 512
PRIORITY_CONNMARK = 1024
PRIORITY_FROM_POD = 1536
PRIORITY_FROM_ENI = 32765
CONNMARK = 0x80

_RULE_KEYS = frozenset(
    {"priority", "table", "src", "srclen", "dst", "dstlen", "fwmark", "fwmask", "protocol"}
)
"""What `ip -j rule show` says of the rules `KernelRule` describes; anything else is `extra`."""


@dataclass(frozen=True, slots=True, order=True)
class KernelRule:
    """One IPv4 policy rule as the kernel lists it. Empty `src` / `dst` = all; `extra` holds any
    other selector (`iif`, `not`, ...), so that an unexpected shape shows in a diff."""

    priority: int
    table: int
    src: str = ""
    dst: str = ""
    fwmark: int = 0
    fwmask: int = 0
    extra: tuple[tuple[str, str], ...] = ()

    def ip_args(self) -> list[str]:
        """The selector and action as `ip rule add` / `del` take them."""
        args = ["from", self.src] if self.src else []
        args += ["to", self.dst] if self.dst else []
        args += ["fwmark", f"{self.fwmark:#x}/{self.fwmask:#x}"] if self.fwmask else []
        assert not self.extra, f"no `ip rule` arguments for {self.extra}"
        return [*args, "lookup", str(self.table), "priority", str(self.priority)]

    @classmethod
    def from_ip_json(cls, item: Mapping[str, object]) -> KernelRule:
        fwmark = int(str(item.get("fwmark", "0")), 0)
        default_mask = 0xFFFFFFFF if fwmark else 0
        return cls(
            priority=int(str(item["priority"])),
            table=_table_number(str(item["table"])),
            src=_cidr(item, "src"),
            dst=_cidr(item, "dst"),
            fwmark=fwmark,
            fwmask=int(str(item.get("fwmask", default_mask)), 0),
            extra=tuple(sorted((k, str(v)) for k, v in item.items() if k not in _RULE_KEYS)),
        )


def _table_number(name: str) -> int:
    return {"main": MAIN_TABLE, "local": 255, "default": 253}.get(name) or int(name)


def _cidr(item: Mapping[str, object], key: str) -> str:
    value = str(item.get(key, "all"))
    if value == "all":
        return ""
    return f"{value}/{item.get(f'{key}len', 32)}"


def host(address: str) -> str:
    return f"{address}/32"


CONNMARK_RULE = KernelRule(PRIORITY_CONNMARK, MAIN_TABLE, fwmark=CONNMARK, fwmask=CONNMARK)


def pod_rules(address: str, device_index: int) -> set[KernelRule]:
    """VPC CNI's per-pod rules: `to A lookup main` at 512; on a secondary ENI, also `from A lookup
    d+1` at 1536 (the route table of device index d is d + 1)."""
    rules = {KernelRule(PRIORITY_TO_POD, MAIN_TABLE, dst=host(address))}
    if device_index >= 1:
        rules.add(KernelRule(PRIORITY_FROM_POD, device_index + 1, src=host(address)))
    return rules


def expected_rules(
    allocations: list[dict[str, object]], enis: list[dict[str, object]], snat: bool
) -> frozenset[KernelRule]:
    """The protocol-167 rules VPC CNI would hold for this state: per pod address its
    `pod_rules`; per secondary ENI whose link is set up, `from <its primary address> lookup d+1`
    at 32765; `fwmark 0x80/0x80 lookup main` at 1024 while SNAT is on."""
    device = {str(e["eni_id"]): int(str(e["device_index"])) for e in enis}
    rules: set[KernelRule] = {CONNMARK_RULE} if snat else set()
    for eni in enis:
        index = int(str(eni["device_index"]))
        if index >= 1 and eni.get("datapath", "ready") == "ready":
            assert eni.get("primary_ip"), f"/v1/enis gives no primary_ip: {eni}"
            rules.add(KernelRule(PRIORITY_FROM_ENI, index + 1, src=host(str(eni["primary_ip"]))))
    for item in allocations:
        ips = item["ips"]
        assert isinstance(ips, list)
        for ip in ips:
            rules |= pod_rules(bare(str(ip["address"])), device[str(ip["eni_id"])])
    return frozenset(rules)
