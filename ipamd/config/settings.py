"""Configuration: every ipamd setting, parsed and validated once, from an environment mapping.

The settings come in groups (`ipamd.config.groups`), each the object one part receives; `Config`
holds one of each. This module reads them from an environment mapping together, runs the rules
between groups (`ipamd.config.rules`) and VPC CNI's variables (`ipamd.config.vpc_cni`), and lists
every setting (`SETTINGS`, group by group) for docs/configuration.md and `describe`. It is the only
code that interprets environment variables: `ipamd.main` passes `os.environ` to `Config.from_env`
at start, and the composition root hands each part its group.

It must not do I/O other than reading the mapping it is given (no sockets, clocks or logging, and no
file but those IPAMD_ENI_CONFIG_FILE and IPAMD_KUBELET_CONFIG name, read once by `config.eniconfig`
and `config.kubelet` so that their problems are reported with the rest) and must not import asyncio.
It never falls back silently: a value that does not parse is an error, reported together with every
other bad value in one `ConfigError`. An empty value counts as unset (manifests often set "").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from ipamd.config import vpc_cni
from ipamd.config.groups import (
    ConflistSettings,
    CustomNetworkingSettings,
    DatapathSettings,
    Ec2Settings,
    EmbeddedSettings,
    EndpointSettings,
    EngineSettings,
    EniSettings,
    FamilySettings,
    KubeSettings,
    LogSettings,
    NetworkPolicySettings,
    PoolSettings,
    ReconcileSettings,
    RuntimeSettings,
    SizingSettings,
    StorageSettings,
    SubnetSettings,
)
from ipamd.config.kinds import SETTING_KEY, Setting, parse_settings
from ipamd.config.rules import read_renamed, rule_problems


class ConfigError(ValueError):
    """Every problem found in the configuration; `str()` gives one per line."""

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems: tuple[str, ...] = tuple(problems)
        super().__init__(self.problems)

    def __str__(self) -> str:
        return "\n".join(self.problems)


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """The effective configuration: one settings group for each part, in the order
    docs/configuration.md lists them. `Config()` is every default; a group given by keyword
    replaces its defaults."""

    family: FamilySettings = field(default_factory=FamilySettings)
    sizing: SizingSettings = field(default_factory=SizingSettings)
    pool: PoolSettings = field(default_factory=PoolSettings)
    subnets: SubnetSettings = field(default_factory=SubnetSettings)
    custom_networking: CustomNetworkingSettings = field(default_factory=CustomNetworkingSettings)
    enis: EniSettings = field(default_factory=EniSettings)
    engine: EngineSettings = field(default_factory=EngineSettings)
    reconcile: ReconcileSettings = field(default_factory=ReconcileSettings)
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    datapath: DatapathSettings = field(default_factory=DatapathSettings)
    conflist: ConflistSettings = field(default_factory=ConflistSettings)
    ec2: Ec2Settings = field(default_factory=Ec2Settings)
    endpoints: EndpointSettings = field(default_factory=EndpointSettings)
    storage: StorageSettings = field(default_factory=StorageSettings)
    network_policy: NetworkPolicySettings = field(default_factory=NetworkPolicySettings)
    kube: KubeSettings = field(default_factory=KubeSettings)
    logging: LogSettings = field(default_factory=LogSettings)
    embedded: EmbeddedSettings = field(default_factory=EmbeddedSettings)

    @classmethod
    def from_env(cls, environ: Mapping[str, str], *, embedded: bool = False) -> Config:
        """Parse every setting from `environ`; raise `ConfigError` listing every problem found.

        `embedded` selects the defaults of `ipamd run --embedded`; a value in `environ` always wins.
        Each rule between groups runs once the settings it reads parsed, so that one bad value
        hides no other problem.
        """
        environ, renamed = read_renamed(environ)
        groups: dict[str, Any] = {}
        texts: dict[str, str] = {}
        problems: list[str] = []
        unparsed: list[str] = []
        for name, group in GROUPS.items():
            declared = settings_of(group)
            values, read, bad = parse_settings(declared, environ, embedded)
            texts.update(read)
            problems += bad
            unparsed += [s.env for s in declared if s.field not in values]
            groups[name] = group(**values)  # a value that did not parse: its default, for the rules
        problems += rule_problems(groups.values(), texts, unparsed)
        problems += vpc_cni.problems(environ)
        problems += renamed
        if problems:
            raise ConfigError(problems)
        return cls(**groups)

    def describe(self) -> dict[str, str]:
        """The effective configuration by variable name, in a form `from_env` accepts back."""
        return {s.env: s.kind.show(s.value_in(self)) for s in SETTINGS}


def settings_of(group: type) -> tuple[Setting, ...]:
    """The settings a group declares, in its order."""
    return tuple(replace(f.metadata[SETTING_KEY], field=f.name) for f in fields(group))


GROUPS: dict[str, type] = {f.name: f.default_factory for f in fields(Config)}  # type: ignore[misc]
"""Each group of `Config` by its field name."""

SETTINGS: tuple[Setting, ...] = tuple(
    replace(s, group=name) for name, group in GROUPS.items() for s in settings_of(group)
)
"""Every setting, group by group: the rows of docs/configuration.md."""
