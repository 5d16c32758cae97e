"""Rules between settings: pure checks on values that parsed, each problem one line naming the
variables involved. `ipamd.config.settings` runs them after every setting parsed; no I/O, no asyncio."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def cross_field_problems(values: Mapping[str, Any], texts: Mapping[str, str]) -> list[str]:
    """Rules between settings, checked only when the settings involved parsed."""
    no_file = "eni_config_file" in values and values["eni_config_file"] is None
    if values.get("custom_networking") is True and no_file:
        text = texts["AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG"]
        return [
            f"AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG={text!r}: needs IPAMD_ENI_CONFIG_FILE, the "
            "ENIConfigs of the node's zones (ipamd reads none from the Kubernetes API)"
        ]
    if values.get("cni_conf_dir") and not values.get("cni_conflist_template"):
        return [
            f"IPAMD_CNI_CONF_DIR={texts['IPAMD_CNI_CONF_DIR']!r}: needs "
            "IPAMD_CNI_CONFLIST_TEMPLATE, the conflist to write"
        ]
    targets = ("warm_ip_target", "warm_prefix_target", "minimum_ip_target")
    if values.get("enable_prefix_delegation") is True and all(values.get(t) == 0 for t in targets):
        # VPC CNI's entrypoint refuses this too: prefix mode with no target never grows the pool.
        text = texts["ENABLE_PREFIX_DELEGATION"]
        return [
            f"ENABLE_PREFIX_DELEGATION={text!r}: prefix mode needs WARM_PREFIX_TARGET, "
            "WARM_IP_TARGET or MINIMUM_IP_TARGET > 0 (all are 0)"
        ]
    return []
