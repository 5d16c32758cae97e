"""Configurations for tests that build a node's parts (`ipamd.parts.open_parts`): the defaults of
`Config.from_env({})`, the state in a test's directory, the pool's knobs given as `PoolTargets`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from ipamd.config.settings import Config
from ipamd.policy.model import PoolTargets


def node_config(
    state_dir: Path,
    targets: PoolTargets | None = None,
    *,
    prefix_mode: bool = False,
    fallback: bool = False,
    cluster_name: str = "test-cluster",
    **values: Any,
) -> Config:
    """The configuration whose pool targets are `targets` (PoolTargets' defaults are the settings'),
    in prefix mode (with the fallback to secondary IPs) or not; `values` sets any other field."""
    t = targets or PoolTargets()
    return replace(
        Config.from_env({}),
        state_dir=str(state_dir),
        warm_eni_target=t.warm_eni_target,
        warm_ip_target=t.warm_ip_target,
        minimum_ip_target=t.minimum_ip_target,
        warm_prefix_target=t.warm_prefix_target,
        max_eni=t.max_eni,
        max_pods_override=t.max_pods,
        min_eni_lifetime_s=t.min_eni_lifetime_s,
        enable_prefix_delegation=prefix_mode,
        prefix_fallback_to_ips=fallback,
        cluster_name=cluster_name,
        **values,
    )
