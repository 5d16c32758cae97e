"""The ENIConfig file and the custom-networking settings: both shapes of the file, every problem of a
bad file reported at once with the other bad settings (each naming the file and the entry), and the
rules between AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG, IPAMD_ENI_CONFIG_FILE and ENI_CONFIG_LABEL_DEF."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ipamd.config.eniconfig import EniConfig, EniConfigFile, parse_eni_configs
from ipamd.config.settings import Config, ConfigError

SUBNET_A = "subnet-0a1b2c3d4e5f60718"
SUBNET_B = "subnet-1a2b3c4d"
SG_1 = "sg-0123456789abcdef0"
SG_2 = "sg-89abcdef"

KUBECTL_LIST = {
    "apiVersion": "v1",
    "kind": "List",
    "metadata": {"resourceVersion": ""},
    "items": [
        {
            "apiVersion": "crd.k8s.amazonaws.com/v1alpha1",
            "kind": "ENIConfig",
            "metadata": {
                "name": "us-west-2a",
                "uid": "5d0a8a1e-0000-4000-8000-000000000001",
                "resourceVersion": "4211",
                "creationTimestamp": "2026-01-01T00:00:00Z",
            },
            "spec": {"subnet": SUBNET_A, "securityGroups": [SG_1, SG_2]},
        },
        {
            "apiVersion": "crd.k8s.amazonaws.com/v1alpha1",
            "kind": "ENIConfig",
            "metadata": {"name": "us-west-2b"},
            "spec": {"subnet": SUBNET_B},
        },
    ],
}
EXPECTED = (
    EniConfig("us-west-2a", SUBNET_A, (SG_1, SG_2)),
    EniConfig("us-west-2b", SUBNET_B, ()),
)


def _write(tmp_path: Path, body: object, name: str = "eniconfigs.json") -> str:
    path = tmp_path / name
    path.write_text(body if isinstance(body, str) else json.dumps(body), encoding="utf-8")
    return str(path)


def _problems(environ: dict[str, str]) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as caught:
        Config.from_env(environ)
    return caught.value.problems


def _file_problems(body: object) -> list[str]:
    with pytest.raises(ValueError) as caught:
        parse_eni_configs(body if isinstance(body, str) else json.dumps(body))
    return str(caught.value).splitlines()


# --- the two shapes -------------------------------------------------------------------------------


def test_what_kubectl_get_eniconfigs_prints_is_read_as_it_is() -> None:
    assert parse_eni_configs(json.dumps(KUBECTL_LIST)) == EXPECTED


def test_a_map_of_zone_to_spec_is_read_too() -> None:
    body = {
        "us-west-2a": {"subnet": SUBNET_A, "securityGroups": [SG_1, SG_2]},
        "us-west-2b": {"subnet": SUBNET_B, "securityGroups": None},
    }

    assert parse_eni_configs(json.dumps(body)) == EXPECTED


def test_custom_networking_takes_the_file_the_setting_names(tmp_path: Path) -> None:
    path = _write(tmp_path, KUBECTL_LIST)

    config = Config.from_env(
        {"AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG": "true", "IPAMD_ENI_CONFIG_FILE": path}
    )

    assert config.custom_networking.enabled is True
    assert config.custom_networking.eni_config_file == EniConfigFile(path, EXPECTED)
    assert config.custom_networking.eni_config_file.find("us-west-2b") == EXPECTED[1]
    assert config.custom_networking.eni_config_file.find("us-west-2c") is None
    assert config.custom_networking.eni_config_label == "k8s.amazonaws.com/eniConfig", (
        "VPC CNI's default"
    )
    described = config.describe()
    assert described["IPAMD_ENI_CONFIG_FILE"] == path
    assert Config.from_env(described) == config


@pytest.mark.parametrize(
    "label", ["topology.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/zone"]
)
def test_either_zone_label_is_accepted(label: str) -> None:
    assert (
        Config.from_env({"ENI_CONFIG_LABEL_DEF": label}).custom_networking.eni_config_label == label
    )


# --- bad files ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("{", "the ENIConfig file is not JSON: Expecting property name enclosed in double quotes"),
        ("[]", "must be a JSON object"),
        ({}, "the ENIConfig file names no ENIConfig"),
        ({"items": []}, "the ENIConfig file names no ENIConfig"),
        ({"items": {"a": 1}}, "'items' must be a list of ENIConfig resources"),
        ({"items": ["us-west-2a"]}, "entry items[0]: must be an ENIConfig (an object)"),
        ({"items": [{"spec": {"subnet": SUBNET_A}}]}, "entry items[0]: name None must be the zone"),
        (
            {"items": [{"kind": "ConfigMap", "metadata": {"name": "us-west-2a"}}]},
            "entry 'us-west-2a' (items[0]): is a 'ConfigMap', not an ENIConfig",
        ),
        (
            {"items": [{"metadata": {"name": "us-west-2a"}, "specs": {}}]},
            "entry 'us-west-2a' (items[0]): unknown fields ['specs']",
        ),
        ({"us-west-2a": SUBNET_A}, "entry 'us-west-2a': needs a spec"),
        ({"US West 2a": {"subnet": SUBNET_A}}, "entry 'US West 2a': name 'US West 2a' must be"),
        ({"us-west-2a": {}}, "entry 'us-west-2a': needs a subnet: a subnet ID"),
        ({"us-west-2a": {"subnet": "subnet-xyz"}}, "subnet 'subnet-xyz' must be a subnet ID"),
        ({"us-west-2a": {"subnet": "subnet-0A1B2C3D"}}, "must be a subnet ID: subnet- and 8 or 17"),
        ({"us-west-2a": {"subnet": SG_1}}, f"subnet {SG_1!r} must be a subnet ID"),
        (
            {"us-west-2a": {"subnet": SUBNET_A, "securityGroup": [SG_1]}},
            "entry 'us-west-2a': unknown fields ['securityGroup']",
        ),
        (
            {"us-west-2a": {"subnet": SUBNET_A, "securityGroups": SG_1}},
            "must be a list of security group IDs",
        ),
        (
            {"us-west-2a": {"subnet": SUBNET_A, "securityGroups": ["default"]}},
            "security group 'default' must be a security group ID",
        ),
        (
            {"us-west-2a": {"subnet": SUBNET_A, "securityGroups": [SG_1, SG_1]}},
            f"entry 'us-west-2a': security group {SG_1!r} appears twice",
        ),
        (
            {
                "us-west-2a": {
                    "subnet": SUBNET_A,
                    "securityGroups": [f"sg-{i:08x}" for i in range(17)],
                }
            },
            "names 17 security groups; EC2 allows at most 16",
        ),
        (
            f'{{"us-west-2a": {{"subnet": "{SUBNET_A}"}}, "us-west-2a": {{"subnet": "{SUBNET_B}"}}}}',
            "the key 'us-west-2a' appears twice in one JSON object",
        ),
        (
            {
                "items": [
                    {"metadata": {"name": "us-west-2a"}, "spec": {"subnet": SUBNET_A}},
                    {"metadata": {"name": "us-west-2a"}, "spec": {"subnet": SUBNET_B}},
                ]
            },
            "ENIConfig 'us-west-2a' appears more than once: one per zone",
        ),
    ],
)
def test_each_kind_of_bad_file_is_one_clear_line(body: object, expected: str) -> None:
    problems = _file_problems(body)

    assert len(problems) == 1, problems
    assert expected in problems[0]


def test_every_problem_of_a_file_is_found_at_once_each_naming_its_entry() -> None:
    body = {
        "us-west-2a": {"subnet": "subnet-nope", "securityGroups": ["sg-1"]},
        "us-west-2b": {"subnet": SUBNET_B},
        "us-west-2c": {"subnet": SUBNET_A, "extra": 1},
    }

    problems = _file_problems(body)

    assert [p.split(":")[0] for p in problems] == [
        "entry 'us-west-2a'",
        "entry 'us-west-2a'",
        "entry 'us-west-2c'",
    ]


def test_a_bad_file_is_reported_with_every_other_bad_setting(tmp_path: Path) -> None:
    path = _write(tmp_path, {"us-west-2a": {"subnet": "subnet-nope", "securityGroups": ["sg-1"]}})

    problems = _problems(
        {
            "WARM_IP_TARGET": "-1",
            "AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG": "true",
            "IPAMD_ENI_CONFIG_FILE": path,
        }
    )

    assert problems[0] == "WARM_IP_TARGET='-1': must be an integer >= 0"
    assert len(problems) == 3, problems
    for line in problems[1:]:
        assert line.startswith(f"IPAMD_ENI_CONFIG_FILE={path!r}: entry 'us-west-2a': "), line
    assert "subnet 'subnet-nope'" in problems[1] and "security group 'sg-1'" in problems[2]


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        ("missing", "cannot read the ENIConfig file: No such file or directory"),
        ("directory", "cannot read the ENIConfig file: Is a directory"),
        ("binary", "cannot read the ENIConfig file: it is not UTF-8 text"),
    ],
)
def test_a_file_that_cannot_be_read_is_one_line(tmp_path: Path, setup: str, expected: str) -> None:
    path = tmp_path / "eniconfigs.json"
    if setup == "directory":
        path.mkdir()
    elif setup == "binary":
        path.write_bytes(b"\xff\xfe{}")

    assert _problems({"IPAMD_ENI_CONFIG_FILE": str(path)}) == (
        f"IPAMD_ENI_CONFIG_FILE={str(path)!r}: {expected}",
    )


def test_the_file_path_must_be_absolute() -> None:
    assert _problems({"IPAMD_ENI_CONFIG_FILE": "eniconfigs.json"}) == (
        "IPAMD_ENI_CONFIG_FILE='eniconfigs.json': must be an absolute path",
    )


# --- the rules between the settings ---------------------------------------------------------------


def test_custom_networking_without_a_file_or_the_api_is_an_error() -> None:
    environ = {"AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG": "true", "IPAMD_KUBERNETES": "off"}
    assert _problems(environ) == (
        "AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG='true': needs IPAMD_ENI_CONFIG_FILE, the ENIConfigs of "
        "the node's zones, with IPAMD_KUBERNETES=off (no ENIConfig resource can be read)",
    )
    # With the API possible, the ENIConfig resource is read at start (or the start says why not).
    assert Config.from_env({"AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG": "true"}).custom_networking.enabled


def test_a_file_that_did_not_parse_is_not_reported_missing_too() -> None:
    problems = _problems(
        {"AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG": "true", "IPAMD_ENI_CONFIG_FILE": "relative.json"}
    )

    assert [p.split("=")[0] for p in problems] == ["IPAMD_ENI_CONFIG_FILE"]


def test_a_file_is_checked_even_with_custom_networking_off(tmp_path: Path) -> None:
    path = _write(tmp_path, {"us-west-2a": {}})

    assert len(_problems({"IPAMD_ENI_CONFIG_FILE": path})) == 1
    good = _write(tmp_path, KUBECTL_LIST, "good.json")
    assert Config.from_env({"IPAMD_ENI_CONFIG_FILE": good}).custom_networking.enabled is False


@pytest.mark.parametrize("label", ["TOPOLOGY.KUBERNETES.IO/ZONE", "a b", "x/" + "n" * 64])
def test_a_label_def_that_is_no_label_key_is_an_error(label: str) -> None:
    assert _problems({"ENI_CONFIG_LABEL_DEF": label}) == (
        f"ENI_CONFIG_LABEL_DEF={label!r}: must be a label key: [prefix/]name, like "
        "k8s.amazonaws.com/eniConfig",
    )
