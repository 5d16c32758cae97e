"""Every environment variable of VPC CNI's README (v1.23.1) has a decided answer in ipamd: it is a
setting with VPC CNI's meaning, or is accepted and logged as inert, or is accepted at its default
only, another value being a start-up error in the one error list (`ipamd.config.vpc_cni`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ipamd.config import vpc_cni
from ipamd.config.settings import SETTINGS, Config, ConfigError

IMPLEMENTED = sorted(vpc_cni.README_VARIABLES & {s.env for s in SETTINGS})
REFUSABLE = [v for v in vpc_cni.VARIABLES if v.status == "default only"]
INERT = [v for v in vpc_cni.VARIABLES if v.status == "inert"]
DOCS = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"


def _other(var: vpc_cni.VpcCniVariable) -> str:
    """A value that means something else than the variable's default, as VPC CNI reads it."""
    if var.boolean:
        return "false" if var.default == "true" else "true"
    return "10.9.0.0/16" if var.env.endswith("CIDRS") else f"{var.default}x"


def _errors(environ: dict[str, str]) -> tuple[str, ...]:
    try:
        Config.from_env(environ)
    except ConfigError as err:
        return err.problems
    return ()


def test_every_readme_variable_is_a_setting_or_answered_here_and_none_twice() -> None:
    answered = {v.env for v in vpc_cni.VARIABLES}
    settings = {s.env for s in SETTINGS}
    assert answered <= vpc_cni.README_VARIABLES
    assert not answered & settings, "implemented and answered here at once"
    assert answered | set(IMPLEMENTED) == vpc_cni.README_VARIABLES, "a variable with no answer"
    assert len(vpc_cni.README_VARIABLES) == 50, "the README's 50 headings"


def _implemented_samples(tmp_path: Path) -> dict[str, dict[str, str]]:
    """For each implemented variable, an environment where it alone differs from its default."""
    eniconfig = tmp_path / "eniconfigs.json"
    eniconfig.write_text(json.dumps({"us-west-2a": {"subnet": "subnet-0123456789abcdef0"}}))
    ipv6 = {"ENABLE_IPv4": "false", "ENABLE_PREFIX_DELEGATION": "true"}
    return {
        "ADDITIONAL_ENI_TAGS": {"ADDITIONAL_ENI_TAGS": '{"team": "a"}'},
        "AWS_EC2_ENDPOINT": {"AWS_EC2_ENDPOINT": "https://ec2.example.com"},
        "AWS_VPC_CNI_NODE_PORT_SUPPORT": {"AWS_VPC_CNI_NODE_PORT_SUPPORT": "false"},
        "AWS_VPC_ENI_MTU": {"AWS_VPC_ENI_MTU": "1500"},
        "AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG": {
            "AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG": "true",
            "IPAMD_ENI_CONFIG_FILE": str(eniconfig),
        },
        "AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS": {"AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS": "10.9.0.0/16"},
        "AWS_VPC_K8S_CNI_EXTERNALSNAT": {"AWS_VPC_K8S_CNI_EXTERNALSNAT": "true"},
        "AWS_VPC_K8S_CNI_LOGLEVEL": {"AWS_VPC_K8S_CNI_LOGLEVEL": "DEBUG"},
        "AWS_VPC_K8S_CNI_LOG_FILE": {"AWS_VPC_K8S_CNI_LOG_FILE": "stdout"},
        "AWS_VPC_K8S_CNI_RANDOMIZESNAT": {"AWS_VPC_K8S_CNI_RANDOMIZESNAT": "none"},
        "AWS_VPC_K8S_PLUGIN_LOG_FILE": {"AWS_VPC_K8S_PLUGIN_LOG_FILE": "stderr"},
        "AWS_VPC_K8S_PLUGIN_LOG_LEVEL": {"AWS_VPC_K8S_PLUGIN_LOG_LEVEL": "Debug"},
        "CLUSTER_NAME": {"CLUSTER_NAME": "prod"},
        "DISABLE_INTROSPECTION": {"DISABLE_INTROSPECTION": "true"},
        "DISABLE_LEAKED_ENI_CLEANUP": {"DISABLE_LEAKED_ENI_CLEANUP": "true"},
        "DISABLE_METRICS": {"DISABLE_METRICS": "true"},
        "ENABLE_IPv4": {"ENABLE_IPv4": "false", "ENABLE_IPv6": "true", **ipv6},
        "ENABLE_IPv6": {"ENABLE_IPv6": "true", **ipv6},
        "ENABLE_PREFIX_DELEGATION": {"ENABLE_PREFIX_DELEGATION": "true"},
        "ENABLE_SUBNET_DISCOVERY": {"ENABLE_SUBNET_DISCOVERY": "false"},
        "ENI_CONFIG_LABEL_DEF": {"ENI_CONFIG_LABEL_DEF": "failure-domain.beta.kubernetes.io/zone"},
        "INTROSPECTION_BIND_ADDRESS": {"INTROSPECTION_BIND_ADDRESS": "127.0.0.1:61680"},
        "IP_COOLDOWN_PERIOD": {"IP_COOLDOWN_PERIOD": "45"},
        "MAX_ENI": {"MAX_ENI": "2"},
        "MINIMUM_IP_TARGET": {"MINIMUM_IP_TARGET": "5"},
        "NETWORK_POLICY_ENFORCING_MODE": {"NETWORK_POLICY_ENFORCING_MODE": "strict"},
        "POD_MTU": {"POD_MTU": "1500"},
        "WARM_ENI_TARGET": {"WARM_ENI_TARGET": "2"},
        "WARM_IP_TARGET": {"WARM_IP_TARGET": "3"},
        "WARM_PREFIX_TARGET": {"WARM_PREFIX_TARGET": "2"},
        "DISABLE_NETWORK_RESOURCE_PROVISIONING": {"DISABLE_NETWORK_RESOURCE_PROVISIONING": "true"},
        "ANNOTATE_POD_IP": {"ANNOTATE_POD_IP": "true"},
        "AWS_MANAGE_ENIS_NON_SCHEDULABLE": {"AWS_MANAGE_ENIS_NON_SCHEDULABLE": "true"},
        "ENI_CONFIG_ANNOTATION_DEF": {"ENI_CONFIG_ANNOTATION_DEF": "example.com/eni-config"},
    }


def test_every_implemented_variable_changes_the_effective_configuration(tmp_path: Path) -> None:
    samples = _implemented_samples(tmp_path)
    assert sorted(samples) == IMPLEMENTED, "a sample for each implemented variable"
    default = Config.from_env({}).describe()
    for name, environ in samples.items():
        assert _errors(environ) == (), (name, _errors(environ))
        assert Config.from_env(environ).describe()[name] != default[name], name


@pytest.mark.parametrize("var", REFUSABLE, ids=lambda v: v.env)
def test_a_default_only_variable_at_another_value_is_a_start_up_error(
    var: vpc_cni.VpcCniVariable,
) -> None:
    environ = {var.env: _other(var)}
    if var.env == "ENABLE_V4_EGRESS":
        environ |= {
            "ENABLE_IPv4": "false",
            "ENABLE_IPv6": "true",
            "ENABLE_PREFIX_DELEGATION": "true",
        }
    (problem,) = _errors(environ)
    assert problem.startswith(f"{var.env}=") and var.instead in problem
    assert var.env not in {name for name, _, _ in vpc_cni.inert(environ)}
    # At its default it changes nothing, and is said once.
    at_default = {**environ, var.env: var.default} if var.default else environ
    if var.default:
        assert _errors(at_default) == ()
        assert (var.env, var.default, var.instead) in vpc_cni.inert(at_default)


@pytest.mark.parametrize("var", INERT, ids=lambda v: v.env)
def test_an_inert_variable_is_accepted_and_said(var: vpc_cni.VpcCniVariable) -> None:
    environ = {var.env: _other(var)}
    assert _errors(environ) == ()
    assert (var.env, environ[var.env], var.instead) in vpc_cni.inert(environ)


def test_the_migration_settings_an_operator_copies_are_refused_together() -> None:
    problems = _errors(
        {
            "ENABLE_POD_ENI": "true",
            "AWS_VPC_K8S_CNI_VETHPREFIX": "abc",
            "ENI_CONFIG_ANNOTATION_DEF": "not a key",
            "WARM_IP_TARGET": "-1",
        }
    )
    named = sorted(p.split("=")[0] for p in problems)
    assert named == [
        "AWS_VPC_K8S_CNI_VETHPREFIX",
        "ENABLE_POD_ENI",
        "ENI_CONFIG_ANNOTATION_DEF",
        "WARM_IP_TARGET",
    ]
    assert any("pods would run without their security groups" in p for p in problems)


def test_ipv4_egress_off_matters_only_in_ipv6_mode() -> None:
    assert _errors({"ENABLE_V4_EGRESS": "false"}) == ()
    assert ("ENABLE_V4_EGRESS", "false", "every IPv6 pod gets IPv4 egress (v4if0)") in (
        vpc_cni.inert({"ENABLE_V4_EGRESS": "false"})
    )


def test_a_boolean_vpc_cni_could_not_parse_is_an_error_not_its_default() -> None:
    (problem,) = _errors({"ENABLE_POD_ENI": "yes"})
    assert problem.startswith("ENABLE_POD_ENI='yes'")
    assert _errors({"ENABLE_POD_ENI": "FALSE"}) == (), "Go's ParseBool forms are read"


def test_the_docs_table_is_the_modules() -> None:
    begin, end = "<!-- vpc-cni-variables:begin -->", "<!-- vpc-cni-variables:end -->"
    text = DOCS.read_text(encoding="utf-8")
    assert text.count(begin) == 1 and text.count(end) == 1
    table = text.split(begin, 1)[1].split(end, 1)[0]
    assert table.strip() == vpc_cni.render_table(IMPLEMENTED).strip()
