"""Max pods as EKS computes it: one pure function from the instance type's limits, the mode, custom
networking and the override to a number and the rule that set it.

The rules, as the EKS AMI's max-pods calculator applies them (its recommended value, the one EKS
managed node groups give kubelet):

1. ENIs for pods: the instance type's ENIs on its default network card, capped by MAX_ENI; one fewer
   with custom networking, whose primary ENI carries no pods.
2. The formula: ENIs x (IPv4 per ENI - 1) + 2 with secondary IPs, ENIs x (IPv4 per ENI - 1) x 16 + 2
   with /28 prefixes. The + 2 are the host-network pods (aws-node, kube-proxy) that take no address.
   Prefixes need the Nitro system: elsewhere the secondary-IP formula applies in prefix mode too.
3. The cap by vCPU count: at most 110 pods with 30 vCPUs or fewer, at most 250 above 30.
4. The kubelet's `maxPods`, when ipamd reads one (IPAMD_KUBELET_CONFIG, `ipamd.config.kubelet`),
   replaces 2 and 3: the kubelet admits that many pods, whatever the calculator says.
5. IPAMD_MAX_PODS, when set, replaces all of this.
6. In IPv6 mode (ENABLE_IPv6), as EKS runs the calculator for an IPv6 cluster: as with prefix
   delegation, over the instance type's ENIs, whatever the pool's mode, MAX_ENI or custom networking
   (which IPv6 refuses): the prefix formula, then the vCPU cap (110 for an m5.large, 34 for a
   t3.nano), although the primary ENI's one /80 holds 2^48 addresses. Rules 4 and 5 win as in IPv4.

Decisions where the published sources differ or say nothing:
- The vCPU cap applies in secondary-IP mode too, as the calculator and EKS managed node groups apply
  it, although VPC CNI's `eni-max-pods.txt` lists the uncapped formula (737 for m5.16xlarge, where
  the calculator says 250). Kubelet on an EKS-recommended node admits no more pods than the cap, and
  addresses held past it would never be used. A kubelet that allows more is followed when ipamd
  reads its config (rule 4: a self-managed node's kubelet, given the uncapped formula by the EKS
  AMI, admits 737 pods there); otherwise the operator sets IPAMD_MAX_PODS to match.
- Bare-metal types count as Nitro (`cloud.ec2_answers.parse_limits`), as VPC CNI counts them for
  prefix delegation; the calculator keys on the reported hypervisor only, which bare metal lacks,
  and so uses the secondary-IP formula there. ipamd does assign prefixes on bare metal, so the prefix
  formula is what its pool can hold. (Every bare-metal type has enough ENIs that both formulas meet
  the vCPU cap unless MAX_ENI is small.)
- An unknown vCPU count (None: a test double, never DescribeInstanceTypes) applies no cap.
- The override is taken as given, above the cap or the formula: it is the operator's statement of
  kubelet's max pods, so it wins over the kubelet config too. The kubelet's value is taken as given
  as well, even above the formula: ipamd's pool still stops at what the ENIs hold, and pods past
  that fail their ADD, as they would with VPC CNI.

Pure; no asyncio, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from ipamd.sizing.inputs import NodeLimits
from ipamd.sizing.modes import PREFIXES, SECONDARY_IPS, UnitStrategy

AddressFamily = Literal["ipv4", "ipv6"]
"""The pods' address family: exactly one of ENABLE_IPv4 and ENABLE_IPv6 is on."""

HOST_NETWORK_PODS = 2
"""Pods on the host network that take no pool address (aws-node and kube-proxy): the `+ 2` of
VPC CNI's and the EKS AMI's max-pods formulas, in both modes."""

LOW_CPU_CEILING = 110
"""Max pods with at most `CPU_THRESHOLD` vCPUs: kubelet's default max pods."""
HIGH_CPU_CEILING = 250
"""Max pods with more than `CPU_THRESHOLD` vCPUs."""
CPU_THRESHOLD = 30
"""vCPUs up to which `LOW_CPU_CEILING` applies."""


class MaxPodsRule(StrEnum):
    """The rule that set the node's max pods, as `/v1/pool` and `ipamctl status` name it."""

    OVERRIDE = "override"
    KUBELET = "kubelet"
    SECONDARY_IP = "secondary-ip-formula"
    PREFIX = "prefix-formula"
    LOW_CPU_CAP = "cap-110-vcpus-30-or-fewer"
    HIGH_CPU_CAP = "cap-250-vcpus-over-30"


_FORMULA_RULES = {"ip": MaxPodsRule.SECONDARY_IP, "prefix": MaxPodsRule.PREFIX}
_FORMULA_NAMES = {
    MaxPodsRule.SECONDARY_IP: "secondary-IP formula",
    MaxPodsRule.PREFIX: "prefix formula",
}


@dataclass(frozen=True, slots=True)
class MaxPods:
    """The node's max pods and how it was reached."""

    value: int
    rule: MaxPodsRule
    """The rule that set `value`: the override, the kubelet's config, a formula, or the vCPU cap
    that lowered it."""
    formula: MaxPodsRule
    """The formula that applies to the node (`SECONDARY_IP` or `PREFIX`), override or not."""
    formula_pods: int
    """What the formula gives, before the cap and the override."""
    enis_for_pods: int
    """ENIs the formula counts: after MAX_ENI and custom networking."""
    addresses_per_eni: int
    """Pod addresses one ENI holds under the formula."""
    vcpus: int | None
    custom_networking: bool = False
    family: AddressFamily = "ipv4"
    """The address family the node's pods get; in IPv6 the formula is prefix mode's (rule 6)."""

    @property
    def reason(self) -> str:
        """One line for operators: the rule and the numbers behind it."""
        primary = ", the primary carrying no pods," if self.custom_networking else ""
        sum_ = (
            f"{_count(self.enis_for_pods, 'ENI')}{primary} x {self.addresses_per_eni} addresses"
            f" + {HOST_NETWORK_PODS} = {self.formula_pods}"
        )
        formula = _FORMULA_NAMES[self.formula]
        if self.family == "ipv6":
            formula = f"{formula} (IPv6 counts as prefix mode)"
        if self.rule is MaxPodsRule.OVERRIDE:
            return f"IPAMD_MAX_PODS={self.value} (the {formula} gives {sum_})"
        if self.rule is MaxPodsRule.KUBELET:
            return f"the kubelet's maxPods={self.value} (the {formula} gives {sum_})"
        if self.vcpus is None:
            return f"{formula}: {sum_}"
        cap = f"the {_ceiling(self.vcpus)} cap for {_count(self.vcpus, 'vCPU')}"
        if self.rule is self.formula:
            return f"{formula}: {sum_}, within {cap}"
        return f"{cap}; the {formula} gives {sum_}"


def compute_node_max_pods(
    limits: NodeLimits,
    strategy: UnitStrategy,
    enis: int,
    *,
    custom_networking: bool = False,
    override: int | None = None,
    kubelet: int | None = None,
    family: AddressFamily = "ipv4",
) -> MaxPods:
    """The node's max pods under the rules of this module's docstring. `enis` is the ENIs ipamd may
    use (the instance type's limit capped by MAX_ENI, `plan.effective_max_enis`); custom networking
    takes the primary away from it. `strategy` is the mode; without Nitro it counts as secondary IPs.
    `kubelet` is the kubelet config's `maxPods`, `override` IPAMD_MAX_PODS. With `family` "ipv6",
    `strategy`, `enis` and `custom_networking` do not count (rule 6)."""
    if family == "ipv6":
        strategy, enis, custom_networking = PREFIXES, limits.max_enis, False
    addressed = strategy if limits.nitro else SECONDARY_IPS
    formula = _FORMULA_RULES[addressed.kind]
    for_pods = max(enis - 1, 0) if custom_networking else enis
    per_eni = addressed.addresses_per_eni(limits)
    formula_pods = for_pods * per_eni + HOST_NETWORK_PODS
    value, rule = formula_pods, formula
    if override is not None:
        value, rule = override, MaxPodsRule.OVERRIDE
    elif kubelet is not None:
        value, rule = kubelet, MaxPodsRule.KUBELET
    elif limits.vcpus is not None and _ceiling(limits.vcpus) < formula_pods:
        value = _ceiling(limits.vcpus)
        rule = MaxPodsRule.HIGH_CPU_CAP if limits.vcpus > CPU_THRESHOLD else MaxPodsRule.LOW_CPU_CAP
    return MaxPods(
        value=value,
        rule=rule,
        formula=formula,
        formula_pods=formula_pods,
        enis_for_pods=for_pods,
        addresses_per_eni=per_eni,
        vcpus=limits.vcpus,
        custom_networking=custom_networking,
        family=family,
    )


def address_family(enable_ipv6: bool) -> AddressFamily:
    """The family ENABLE_IPv6 chooses (the configuration's rules leave exactly one on)."""
    return "ipv6" if enable_ipv6 else "ipv4"


def _ceiling(vcpus: int) -> int:
    return HIGH_CPU_CEILING if vcpus > CPU_THRESHOLD else LOW_CPU_CEILING


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
