"""Rules between settings: pure checks on values that parsed, each problem one line naming the
variables involved. `ipamd.config.settings` runs them after every setting parsed; no I/O, no asyncio."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def cross_field_problems(values: Mapping[str, Any], texts: Mapping[str, str]) -> list[str]:
    """Rules between settings, each checked only when the settings involved parsed; every rule
    broken is one line."""
    problems: list[str] = []
    no_file = "eni_config_file" in values and values["eni_config_file"] is None
    if values.get("custom_networking") is True and no_file and values.get("kubernetes") == "off":
        text = texts["AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG"]
        problems.append(
            f"AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG={text!r}: needs IPAMD_ENI_CONFIG_FILE, the "
            "ENIConfigs of the node's zones, with IPAMD_KUBERNETES=off (no ENIConfig resource "
            "can be read)"
        )
    if values.get("pod_aware_pool") == "on" and values.get("kubernetes") == "off":
        problems.append(
            "IPAMD_POD_AWARE_POOL='on': needs the Kubernetes API, and IPAMD_KUBERNETES is 'off'"
        )
    if values.get("cni_conf_dir") and not values.get("cni_conflist_template"):
        problems.append(
            f"IPAMD_CNI_CONF_DIR={texts['IPAMD_CNI_CONF_DIR']!r}: needs "
            "IPAMD_CNI_CONFLIST_TEMPLATE, the conflist to write"
        )
    targets = ("warm_ip_target", "warm_prefix_target", "minimum_ip_target")
    if values.get("enable_prefix_delegation") is True and all(values.get(t) == 0 for t in targets):
        # VPC CNI's entrypoint refuses this too: prefix mode with no target never grows the pool.
        text = texts["ENABLE_PREFIX_DELEGATION"]
        problems.append(
            f"ENABLE_PREFIX_DELEGATION={text!r}: prefix mode needs WARM_PREFIX_TARGET, "
            "WARM_IP_TARGET or MINIMUM_IP_TARGET > 0 (all are 0)"
        )
    return problems + address_family_problems(values, texts)


def address_family_problems(values: Mapping[str, Any], texts: Mapping[str, str]) -> list[str]:
    """VPC CNI's rules for the address family: exactly one of IPv4 and IPv6 (no dual stack), and
    IPv6 only with prefix delegation (its pods' addresses come from a /80 prefix) and without
    custom networking (which VPC CNI supports for IPv4 alone). Read from tables keyed by the two
    switches, so that the family is looked up here, not tested."""
    switches = (values.get("enable_ipv4"), values.get("enable_ipv6"))
    if None in switches:
        return []  # one of them did not parse: its own problem says so
    both = f"ENABLE_IPv4={texts['ENABLE_IPv4']!r}, ENABLE_IPv6={texts['ENABLE_IPv6']!r}"
    problems = [f"{both}: {wrong}" for wrong in SWITCHES_WRONG.get(switches, ())]
    for setting, refused, why in NEEDS.get(switches, ()):
        if values.get(setting) is refused:
            problems.append(why(texts))
    return problems


SWITCHES_WRONG: Mapping[tuple[object, object], tuple[str, ...]] = {
    (True, True): ("exactly one address family may be on (there is no dual stack)",),
    (False, False): ("exactly one address family must be on (neither is)",),
}
"""(ENABLE_IPv4, ENABLE_IPv6) → what is wrong with them; one family on is right."""


def _ipv6_needs_prefixes(texts: Mapping[str, str]) -> str:
    return (
        f"ENABLE_IPv6={texts['ENABLE_IPv6']!r}: needs ENABLE_PREFIX_DELEGATION=true (is "
        f"{texts['ENABLE_PREFIX_DELEGATION']!r}): IPv6 pods' addresses come from a /80 prefix"
    )


def _ipv6_refuses_custom_networking(texts: Mapping[str, str]) -> str:
    return (
        f"ENABLE_IPv6={texts['ENABLE_IPv6']!r}: cannot be combined with "
        f"AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG={texts['AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG']!r} "
        "(custom networking is IPv4 only)"
    )


_IPV6_NEEDS: tuple[tuple[str, bool, Callable[[Mapping[str, str]], str]], ...] = (
    ("enable_prefix_delegation", False, _ipv6_needs_prefixes),
    ("custom_networking", True, _ipv6_refuses_custom_networking),
)

NEEDS: Mapping[
    tuple[object, object], tuple[tuple[str, bool, Callable[[Mapping[str, str]], str]], ...]
] = {
    (False, True): _IPV6_NEEDS,
    (True, True): _IPV6_NEEDS,
}
"""(ENABLE_IPv4, ENABLE_IPv6) → (setting, the value refused with it, the problem's line)."""


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
