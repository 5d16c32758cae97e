"""IPAMD_KUBELET_CONFIG: the kubelet's maxPods read at start through the configuration, its
drop-ins, and what a missing, unreadable or malformed file does (`ipamd.config.kubelet`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ipamd.config.kubelet import KubeletConfig, parse_max_pods
from ipamd.config.settings import Config, ConfigError
from ipamd.node.engine_parts import pool_targets

# What nodeadm writes for a c5.18xlarge, trimmed: the uncapped ENI formula.
NODEADM = {
    "kind": "KubeletConfiguration",
    "apiVersion": "kubelet.config.k8s.io/v1beta1",
    "clusterDomain": "cluster.local",
    "maxPods": 737,
    "kubeReserved": {"cpu": "190m", "ephemeral-storage": "1Gi", "memory": "8362Mi"},
}


def write(path: Path, body: object) -> Path:
    path.write_text(body if isinstance(body, str) else json.dumps(body), encoding="utf-8")
    return path


def config_for(path: Path, **env: str) -> Config:
    return Config.from_env({"IPAMD_KUBELET_CONFIG": str(path), **env})


def problems_of(path: Path, **env: str) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as caught:
        config_for(path, **env)
    return caught.value.problems


def test_the_kubelet_max_pods_is_read_at_start(tmp_path: Path) -> None:
    path = write(tmp_path / "config.json", NODEADM)
    config = config_for(path)
    assert config.sizing.kubelet_config == KubeletConfig(str(path), 737, str(path), read=True)
    assert pool_targets(config).kubelet_max_pods == 737
    assert config.describe()["IPAMD_KUBELET_CONFIG"] == str(path)


def test_a_missing_file_leaves_the_calculator(tmp_path: Path) -> None:
    """The default path on a node not built from the EKS AMI: nothing there, nothing to follow."""
    for path in (tmp_path / "config.json", tmp_path / "no-such-dir" / "config.json"):
        config = config_for(path)
        assert config.sizing.kubelet_config == KubeletConfig(str(path))
        assert pool_targets(config).kubelet_max_pods is None
        assert config.sizing.kubelet_config.describe() == f"no file at {path}"


def test_a_file_without_max_pods_leaves_the_calculator(tmp_path: Path) -> None:
    path = write(tmp_path / "config.json", {k: v for k, v in NODEADM.items() if k != "maxPods"})
    config = config_for(path)
    assert config.sizing.kubelet_config == KubeletConfig(str(path), read=True)
    assert pool_targets(config).kubelet_max_pods is None
    assert "no maxPods in" in config.sizing.kubelet_config.describe()


def test_drop_ins_override_in_name_order(tmp_path: Path) -> None:
    """nodeadm writes the operator's kubelet settings to config.json.d/40-nodeadm.conf; kubelet
    applies drop-ins by name over the file, so the last maxPods wins."""
    path = write(tmp_path / "config.json", NODEADM)
    drop_ins = tmp_path / "config.json.d"
    drop_ins.mkdir()
    write(drop_ins / "40-nodeadm.conf", {"maxPods": 110})
    write(drop_ins / "50-other.conf", {"kind": "KubeletConfiguration", "podPidsLimit": 4096})
    write(drop_ins / "90-ignored.json", {"maxPods": 5})  # not a .conf: kubelet skips it too
    got = config_for(path).sizing.kubelet_config
    assert got == KubeletConfig(str(path), 110, str(drop_ins / "40-nodeadm.conf"), read=True)
    assert got.describe() == f"maxPods=110 in {drop_ins / '40-nodeadm.conf'}"


def test_drop_ins_without_the_file(tmp_path: Path) -> None:
    drop_ins = tmp_path / "config.json.d"
    drop_ins.mkdir()
    write(drop_ins / "40-nodeadm.conf", {"maxPods": 58})
    assert config_for(tmp_path / "config.json").sizing.kubelet_config == KubeletConfig(
        str(tmp_path / "config.json"), 58, str(drop_ins / "40-nodeadm.conf"), read=True
    )


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("maxPods: 737\n", "not JSON (Expecting value at line 1 column 1)"),
        ("[737]", "must be a JSON object (a KubeletConfiguration)"),
        ({"kind": "CredentialProviderConfig"}, "is a 'CredentialProviderConfig', not a Kubelet"),
        ({"maxPods": 0}, "maxPods 0 must be a positive integer"),
        ({"maxPods": -3}, "maxPods -3 must be a positive integer"),
        ({"maxPods": "737"}, "maxPods '737' must be a positive integer"),
        ({"maxPods": 737.5}, "maxPods 737.5 must be a positive integer"),
        ({"maxPods": True}, "maxPods True must be a positive integer"),
        ({"maxPods": 2**31}, "maxPods 2147483648 must be a positive integer"),
        (b"\xff\xfe", "not UTF-8 text"),
    ],
)
def test_a_malformed_file_stops_the_start_naming_it(
    tmp_path: Path, body: object, problem: str
) -> None:
    path = tmp_path / "config.json"
    if isinstance(body, bytes):
        path.write_bytes(body)
    else:
        write(path, body)
    (line,) = problems_of(path)
    assert line.startswith(f"IPAMD_KUBELET_CONFIG='{path}': {path}: ")
    assert problem in line


def test_an_unreadable_file_stops_the_start(tmp_path: Path) -> None:
    """A directory where the file should be: opening it fails, whoever ipamd runs as."""
    path = tmp_path / "config.json"
    path.mkdir()
    (line,) = problems_of(path)
    assert f"{path}: cannot read it: Is a directory" in line


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_a_file_ipamd_may_not_read_stops_the_start(tmp_path: Path) -> None:
    path = write(tmp_path / "config.json", NODEADM)
    path.chmod(0)
    (line,) = problems_of(path)
    assert "cannot read it: Permission denied" in line


def test_every_bad_drop_in_is_reported_with_the_other_settings(tmp_path: Path) -> None:
    path = write(tmp_path / "config.json", "{")
    drop_ins = tmp_path / "config.json.d"
    drop_ins.mkdir()
    write(drop_ins / "40-nodeadm.conf", {"maxPods": "many"})
    problems = problems_of(path, WARM_IP_TARGET="-3")
    assert len(problems) == 3
    assert any(p.startswith("WARM_IP_TARGET='-3'") for p in problems)
    assert any(f"{path}: not JSON" in p for p in problems)
    assert any(f"{drop_ins / '40-nodeadm.conf'}: maxPods 'many'" in p for p in problems)


def test_a_relative_path_is_refused(tmp_path: Path) -> None:
    (line,) = problems_of(Path("kubelet/config.json"))
    assert line == "IPAMD_KUBELET_CONFIG='kubelet/config.json': must be an absolute path"


def test_parse_max_pods_takes_a_kubelet_configuration_without_kind() -> None:
    assert parse_max_pods('{"maxPods": 29}') == 29
    assert parse_max_pods("{}") is None
    assert parse_max_pods('{"maxPods": null}') is None
