"""The conflist ipamd writes tells ipamd-cni where to log, in VPC CNI's keys (`pluginLogFile`,
`pluginLogLevel`), as VPC CNI's entrypoint writes them into `10-aws.conflist`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ipamd.config.settings import Config
from ipamd.node import conflist

TEMPLATE = Path(__file__).resolve().parents[3] / "deploy" / "cni" / "10-ipamd.conflist"


def plugins(plugin_log: tuple[str, str] | None = None) -> list[dict[str, Any]]:
    """The rendered conflist's plugins: ipamd-cni, portmap."""
    conf = json.loads(
        conflist.render(TEMPLATE, "/run/ipamd/ipamd.sock", 9001, None, plugin_log=plugin_log)
    )
    found: list[dict[str, Any]] = conf["plugins"]
    return found


def test_the_plugin_is_told_its_log_file_and_level() -> None:
    config = Config.from_env(
        {
            "AWS_VPC_K8S_PLUGIN_LOG_FILE": "/var/log/cni/plugin.log",
            "AWS_VPC_K8S_PLUGIN_LOG_LEVEL": "WARN",
        }
    )
    plugin, portmap = plugins((config.conflist.plugin_log_file, config.conflist.plugin_log_level))
    assert (plugin["pluginLogFile"], plugin["pluginLogLevel"]) == (
        "/var/log/cni/plugin.log",
        "warn",
    )
    assert "pluginLogFile" not in portmap, "only the plugin that is ipamd-cni's"


def test_by_default_where_aws_node_writes_it() -> None:
    config = Config.from_env({})
    plugin, _ = plugins((config.conflist.plugin_log_file, config.conflist.plugin_log_level))
    assert plugin["pluginLogFile"] == "/var/log/aws-routed-eni/plugin.log"
    assert plugin["pluginLogLevel"] == "info"


def test_a_relative_path_is_made_absolute_and_stderr_stays_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    plugin, _ = plugins(("./.run/aws-routed-eni/plugin.log", "debug"))
    assert plugin["pluginLogFile"] == str(tmp_path / ".run" / "aws-routed-eni" / "plugin.log")
    plugin, _ = plugins(("stderr", "debug"))
    assert plugin["pluginLogFile"] == "stderr"


def test_without_it_the_template_is_left_as_it_is() -> None:
    plugin, _ = plugins()
    assert "pluginLogFile" not in plugin and "pluginLogLevel" not in plugin
