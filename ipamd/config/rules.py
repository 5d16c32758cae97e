"""Rules between settings groups: pure checks on typed groups that were built, each problem one line
naming the variables involved. `ipamd.config.settings` runs them after every group was read; no I/O,
no asyncio."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, get_type_hints

from ipamd.config.groups import (
    ConflistSettings,
    CustomNetworkingSettings,
    FamilySettings,
    KubeSettings,
    SizingSettings,
)

Texts = Mapping[str, str]
"""The text each setting was read from, by variable: what a problem's line quotes."""


def _custom_networking_needs_eniconfigs(
    custom: CustomNetworkingSettings, kube: KubeSettings, texts: Texts
) -> list[str]:
    if not (custom.enabled and custom.eni_config_file is None and kube.mode == "off"):
        return []
    text = texts["AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG"]
    return [
        f"AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG={text!r}: needs IPAMD_ENI_CONFIG_FILE, the "
        "ENIConfigs of the node's zones, with IPAMD_KUBERNETES=off (no ENIConfig resource "
        "can be read)"
    ]


def _pod_aware_pool_needs_the_api(kube: KubeSettings, texts: Texts) -> list[str]:
    if kube.pod_aware_pool == "on" and kube.mode == "off":
        return [
            "IPAMD_POD_AWARE_POOL='on': needs the Kubernetes API, and IPAMD_KUBERNETES is 'off'"
        ]
    return []


def _conf_dir_needs_a_template(conflist: ConflistSettings, texts: Texts) -> list[str]:
    if conflist.conf_dir and not conflist.template:
        return [
            f"IPAMD_CNI_CONF_DIR={texts['IPAMD_CNI_CONF_DIR']!r}: needs "
            "IPAMD_CNI_CONFLIST_TEMPLATE, the conflist to write"
        ]
    return []


def _prefix_mode_needs_a_target(sizing: SizingSettings, texts: Texts) -> list[str]:
    targets = (sizing.warm_ip_target, sizing.warm_prefix_target, sizing.minimum_ip_target)
    if not sizing.enable_prefix_delegation or any(targets):
        return []
    # VPC CNI's entrypoint refuses this too: prefix mode with no target never grows the pool.
    return [
        f"ENABLE_PREFIX_DELEGATION={texts['ENABLE_PREFIX_DELEGATION']!r}: prefix mode needs "
        "WARM_PREFIX_TARGET, WARM_IP_TARGET or MINIMUM_IP_TARGET > 0 (all are 0)"
    ]


def _one_family(family: FamilySettings, texts: Texts) -> list[str]:
    """VPC CNI's rule: exactly one of IPv4 and IPv6 (no dual stack), looked up in a table keyed by
    the two switches, so that the family is not tested here."""
    both = f"ENABLE_IPv4={texts['ENABLE_IPv4']!r}, ENABLE_IPv6={texts['ENABLE_IPv6']!r}"
    switches = (family.enable_ipv4, family.enable_ipv6)
    return [f"{both}: {wrong}" for wrong in SWITCHES_WRONG.get(switches, ())]


def _family_needs(
    family: FamilySettings,
    sizing: SizingSettings,
    custom: CustomNetworkingSettings,
    texts: Texts,
) -> list[str]:
    """What the family on needs of the other settings (`NEEDS`): IPv6 only with prefix delegation
    and without custom networking."""
    needs = NEEDS.get((family.enable_ipv4, family.enable_ipv6), ())
    return [why(texts) for refused, why in needs if refused(sizing, custom)]


def _ipv6_needs_prefixes(texts: Texts) -> str:
    return (
        f"ENABLE_IPv6={texts['ENABLE_IPv6']!r}: needs ENABLE_PREFIX_DELEGATION=true (is "
        f"{texts['ENABLE_PREFIX_DELEGATION']!r}): IPv6 pods' addresses come from a /80 prefix"
    )


def _ipv6_refuses_custom_networking(texts: Texts) -> str:
    return (
        f"ENABLE_IPv6={texts['ENABLE_IPv6']!r}: cannot be combined with "
        f"AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG={texts['AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG']!r} "
        "(custom networking is IPv4 only)"
    )


Need = tuple[Callable[[SizingSettings, CustomNetworkingSettings], bool], Callable[[Texts], str]]

_IPV6_NEEDS: tuple[Need, ...] = (
    (lambda sizing, _: not sizing.enable_prefix_delegation, _ipv6_needs_prefixes),
    (lambda _, custom: custom.enabled, _ipv6_refuses_custom_networking),
)
"""IPv6's pods take their addresses from a /80 prefix; VPC CNI supports custom networking for IPv4
alone."""

NEEDS: Mapping[tuple[bool, bool], tuple[Need, ...]] = {
    (False, True): _IPV6_NEEDS,
    (True, True): _IPV6_NEEDS,
}
"""(ENABLE_IPv4, ENABLE_IPv6) → (what the other settings may not be, the problem's line)."""


SWITCHES_WRONG: Mapping[tuple[bool, bool], tuple[str, ...]] = {
    (True, True): ("exactly one address family may be on (there is no dual stack)",),
    (False, False): ("exactly one address family must be on (neither is)",),
}
"""(ENABLE_IPv4, ENABLE_IPv6) → what is wrong with them; one family on is right."""

Rule = Callable[..., list[str]]
FAMILY = ("ENABLE_IPv4", "ENABLE_IPv6")

RULES: tuple[tuple[Rule, tuple[str, ...]], ...] = (
    (
        _custom_networking_needs_eniconfigs,
        ("AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG", "IPAMD_ENI_CONFIG_FILE", "IPAMD_KUBERNETES"),
    ),
    (_pod_aware_pool_needs_the_api, ("IPAMD_POD_AWARE_POOL", "IPAMD_KUBERNETES")),
    (_conf_dir_needs_a_template, ("IPAMD_CNI_CONF_DIR", "IPAMD_CNI_CONFLIST_TEMPLATE")),
    (
        _prefix_mode_needs_a_target,
        ("ENABLE_PREFIX_DELEGATION", "WARM_IP_TARGET", "WARM_PREFIX_TARGET", "MINIMUM_IP_TARGET"),
    ),
    (_one_family, FAMILY),
    # The family is both switches: its rules wait for both to parse.
    (_family_needs, (*FAMILY, "ENABLE_PREFIX_DELEGATION", "AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG")),
)
"""The rules between settings, in the order their problems are listed, each with the variables it
reads. A rule takes the groups it reads (by their types) and the texts, and returns one line per
rule broken."""


def groups_read_by(rule: Rule) -> tuple[type, ...]:
    """The settings groups a rule takes, from its annotations: every parameter but the texts."""
    hints = get_type_hints(rule)
    names = [n for n in inspect.signature(rule).parameters if n != "texts"]
    return tuple(hints[n] for n in names)


def rule_problems(groups: Iterable[object], texts: Texts, unparsed: Collection[str]) -> list[str]:
    """Every rule broken by `groups`, each rule checked only when every variable it reads parsed
    (`unparsed` names those that did not: their own problems say so). A group holding a value that
    did not parse holds its default there instead, which no rule that runs reads."""
    built: dict[type, Any] = {type(g): g for g in groups}
    problems: list[str] = []
    for rule, reads in RULES:
        if not set(reads) & set(unparsed):
            problems += rule(*(built[t] for t in groups_read_by(rule)), texts)
    return problems


RENAMED = {"IPAMD_LOG_LEVEL": "AWS_VPC_K8S_CNI_LOGLEVEL"}
"""ipamd's variables that VPC CNI's now stand for. The old name is still read, as the new one
(`warning` as `warn`), while the new one is unset; both set is an error naming the successor, never
a setting silently dropped."""


def read_renamed(environ: Mapping[str, str]) -> tuple[Mapping[str, str], list[str]]:
    """`environ` with each old name read as its successor (`RENAMED`), and the problems: an old
    name set beside its successor."""
    problems: list[str] = []
    for old, new in RENAMED.items():
        value = environ.get(old)
        if not value:
            continue
        if environ.get(new):
            problems.append(
                f"{old}={value!r}: renamed {new}, which is set too ({environ[new]!r}): remove {old}"
            )
            continue
        value = "warn" if value.strip().lower() == "warning" else value
        environ = {**environ, new: value}
    return environ, problems
