"""Tests for ipamd.config.settings: defaults, parsing of each kind of value, error collection, docs
in sync."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import pytest

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
    LogSettings,
    PoolSettings,
    ReconcileSettings,
    RuntimeSettings,
    SizingSettings,
    StorageSettings,
    SubnetSettings,
)
from ipamd.config.kinds import HostPort, render_settings_table
from ipamd.config.kubelet import DEFAULT_KUBELET_CONFIG, read_kubelet_config
from ipamd.config.rules import RULES, groups_read_by
from ipamd.config.settings import SETTINGS, Config, ConfigError, settings_of

TAGS = (("team", "net"), ("env", "x"))
DOCS = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"


def value_at(config: Config, path: str) -> object:
    """A setting's value by `group.field`."""
    group, name = path.split(".")
    return getattr(getattr(config, group), name)


def problems_of(environ: dict[str, str]) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as caught:
        Config.from_env(environ)
    return caught.value.problems


def test_defaults_from_an_empty_mapping() -> None:
    config = Config.from_env({})

    assert config == Config(
        family=FamilySettings(
            enable_ipv4=True,
            enable_ipv6=False,
        ),
        sizing=SizingSettings(
            warm_eni_target=1,
            warm_ip_target=0,
            minimum_ip_target=0,
            warm_prefix_target=1,
            enable_prefix_delegation=False,
            max_eni=None,
            max_pods_override=None,
            prefix_fallback_to_ips=False,
            min_eni_lifetime_s=60.0,
            # Read from the node's path (no such file on a test machine: the calculator applies).
            kubelet_config=read_kubelet_config(DEFAULT_KUBELET_CONFIG),
        ),
        pool=PoolSettings(
            disable_network_resource_provisioning=False,
            interval_s=5.0,
            shrink_interval_s=30.0,
            release_delay_s=300.0,
        ),
        subnets=SubnetSettings(
            discovery=True,
            scarcity_threshold=64,
            exhausted_cooldown_s=120.0,
            refresh_interval_s=1800.0,
        ),
        custom_networking=CustomNetworkingSettings(
            enabled=False,
            eni_config_label="k8s.amazonaws.com/eniConfig",
            eni_config_annotation="k8s.amazonaws.com/eniConfig",
            eni_config_file=None,
        ),
        enis=EniSettings(
            cluster_name="",
            additional_eni_tags=(),
            disable_leaked_eni_cleanup=False,
            gc_interval_s=3600.0,
            gc_grace_s=300.0,
        ),
        engine=EngineSettings(
            ip_cooldown_period_s=30,
            delete_intent_ttl_s=600.0,
        ),
        reconcile=ReconcileSettings(
            ec2_interval_s=300.0,
            imds_hint_interval_s=5.0,
            grace_s=60.0,
        ),
        runtime=RuntimeSettings(
            cri_socket_path="/run/containerd/containerd.sock",
            leak_gc_interval_s=60.0,
            leak_grace_s=120.0,
        ),
        datapath=DatapathSettings(
            eni_mtu=9001,
            external_snat=False,
            node_port_support=True,
            exclude_snat_cidrs=(),
            randomize_snat="prng",
            host_network="on",
            reconcile_interval_s=60.0,
        ),
        conflist=ConflistSettings(
            pod_mtu=None,
            conf_dir=None,
            template=None,
        ),
        ec2=Ec2Settings(
            region=None,
            endpoint=None,
            http_timeout_s=10,
            call_timeout_s=10.0,
        ),
        endpoints=EndpointSettings(
            disable_metrics=False,
            socket_path="/run/ipamd/ipamd.sock",
            metrics_addr=HostPort("127.0.0.1", 61678),
        ),
        storage=StorageSettings(
            state_dir="/var/lib/ipamd",
        ),
        logging=LogSettings(
            format="auto",
            level="info",
        ),
        embedded=EmbeddedSettings(
            instance_type="m5.large",
            pod_subnet=None,
        ),
    )
    assert config.sizing.kubelet_config is not None
    assert config.sizing.kubelet_config.path == "/etc/kubernetes/kubelet/config.json"


@pytest.mark.parametrize(
    ("env", "text", "field", "expected"),
    [
        ("WARM_ENI_TARGET", "3", "sizing.warm_eni_target", 3),
        ("WARM_ENI_TARGET", "0", "sizing.warm_eni_target", 0),
        ("WARM_IP_TARGET", "5", "sizing.warm_ip_target", 5),
        ("MINIMUM_IP_TARGET", "+10", "sizing.minimum_ip_target", 10),
        ("WARM_PREFIX_TARGET", "2", "sizing.warm_prefix_target", 2),
        ("ENABLE_PREFIX_DELEGATION", "true", "sizing.enable_prefix_delegation", True),
        ("MAX_ENI", "4", "sizing.max_eni", 4),
        ("MAX_ENI", "-1", "sizing.max_eni", None),
        ("IP_COOLDOWN_PERIOD", "0", "engine.ip_cooldown_period_s", 0),
        ("IP_COOLDOWN_PERIOD", "45", "engine.ip_cooldown_period_s", 45),
        ("CLUSTER_NAME", "prod-eu", "enis.cluster_name", "prod-eu"),
        ("AWS_REGION", "eu-west-1", "ec2.region", "eu-west-1"),
        ("AWS_REGION", "us-gov-west-1", "ec2.region", "us-gov-west-1"),
        ("AWS_EC2_ENDPOINT", "https://ec2.example.com", "ec2.endpoint", "https://ec2.example.com"),
        ("AWS_EC2_ENDPOINT", "http://127.0.0.1:5000", "ec2.endpoint", "http://127.0.0.1:5000"),
        ("HTTP_TIMEOUT", "30", "ec2.http_timeout_s", 30),
        ("ADDITIONAL_ENI_TAGS", '{"team": "net", "env": "x"}', "enis.additional_eni_tags", TAGS),
        ("DISABLE_LEAKED_ENI_CLEANUP", "1", "enis.disable_leaked_eni_cleanup", True),
        ("DISABLE_METRICS", "TRUE", "endpoints.disable_metrics", True),
    ],
)
def test_vpc_cni_knobs_are_parsed(env: str, text: str, field: str, expected: object) -> None:
    config = Config.from_env({env: text})

    assert value_at(config, field) == expected


@pytest.mark.parametrize(
    ("env", "text", "field", "expected"),
    [
        ("IPAMD_METRICS_ADDR", "0.0.0.0:9100", "endpoints.metrics_addr", HostPort("0.0.0.0", 9100)),
        ("IPAMD_METRICS_ADDR", "[::1]:61678", "endpoints.metrics_addr", HostPort("::1", 61678)),
        ("IPAMD_METRICS_ADDR", "localhost:1", "endpoints.metrics_addr", HostPort("localhost", 1)),
        (
            "IPAMD_CRI_SOCKET",
            "/run/crio/crio.sock",
            "runtime.cri_socket_path",
            "/run/crio/crio.sock",
        ),
        (
            "IPAMD_EMBEDDED_INSTANCE_TYPE",
            "c7gn.16xlarge",
            "embedded.instance_type",
            "c7gn.16xlarge",
        ),
        ("IPAMD_MAX_PODS", "110", "sizing.max_pods_override", 110),
        ("IPAMD_LOG_FORMAT", "JSON", "logging.format", "json"),
        ("AWS_VPC_K8S_CNI_LOGLEVEL", "Debug", "logging.level", "debug"),
        ("AWS_VPC_K8S_CNI_LOGLEVEL", "WARN", "logging.level", "warn"),
        (
            "AWS_VPC_K8S_CNI_LOG_FILE",
            "/var/log/ipamd/ipamd.log",
            "logging.file",
            "/var/log/ipamd/ipamd.log",
        ),
        ("AWS_VPC_K8S_CNI_LOG_FILE", "stdout", "logging.file", None),
        ("AWS_VPC_K8S_CNI_LOG_FILE", "Stderr", "logging.file", None),
        (
            "AWS_VPC_K8S_PLUGIN_LOG_FILE",
            "/var/log/cni.log",
            "conflist.plugin_log_file",
            "/var/log/cni.log",
        ),
        ("AWS_VPC_K8S_PLUGIN_LOG_FILE", "STDERR", "conflist.plugin_log_file", "stderr"),
        ("AWS_VPC_K8S_PLUGIN_LOG_LEVEL", "Fatal", "conflist.plugin_log_level", "fatal"),
        ("IPAMD_PREFIX_FALLBACK_TO_IPS", "t", "sizing.prefix_fallback_to_ips", True),
        ("IPAMD_SUBNET_SCARCITY_THRESHOLD", "0", "subnets.scarcity_threshold", 0),
        ("IPAMD_SUBNET_SCARCITY_THRESHOLD", "500", "subnets.scarcity_threshold", 500),
    ],
)
def test_ipamd_settings_are_parsed(env: str, text: str, field: str, expected: object) -> None:
    assert value_at(Config.from_env({env: text}), field) == expected


def test_metrics_addr_renders_ipv6_in_brackets() -> None:
    assert str(HostPort("::1", 61678)) == "[::1]:61678"
    assert str(HostPort("127.0.0.1", 61678)) == "127.0.0.1:61678"


@pytest.mark.parametrize("text", ["1", "t", "T", "TRUE", "true", "True"])
def test_booleans_accept_go_true_forms(text: str) -> None:
    assert Config.from_env({"DISABLE_METRICS": text}).endpoints.disable_metrics is True


@pytest.mark.parametrize("text", ["0", "f", "F", "FALSE", "false", "False"])
def test_booleans_accept_go_false_forms(text: str) -> None:
    assert Config.from_env({"DISABLE_METRICS": text}).endpoints.disable_metrics is False


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 30.0),
        ("2.5", 2.5),
        (".5", 0.5),
        ("500ms", 0.5),
        ("100ms", 0.1),
        ("10s", 10.0),
        ("10m", 600.0),
        ("1.5m", 90.0),
        ("2h", 7200.0),
    ],
)
def test_duration_forms(text: str, seconds: float) -> None:
    assert Config.from_env({"IPAMD_DELETE_INTENT_TTL": text}).engine.delete_intent_ttl_s == seconds


def test_grace_windows_may_be_zero_but_intervals_may_not() -> None:
    config = Config.from_env({"IPAMD_LEAK_GRACE": "0", "IPAMD_RECONCILE_GRACE": "0s"})
    assert (config.runtime.leak_grace_s, config.reconcile.grace_s) == (0.0, 0.0)

    problems = problems_of({"IPAMD_POOL_INTERVAL": "0", "IPAMD_DELETE_INTENT_TTL": "0ms"})
    in_docs_order = [
        s.env for s in SETTINGS if s.env in ("IPAMD_POOL_INTERVAL", "IPAMD_DELETE_INTENT_TTL")
    ]
    assert [p.split("=")[0] for p in problems] == in_docs_order
    assert all("> 0" in p for p in problems)


def test_embedded_mode_changes_socket_state_log_and_host_network_defaults_only() -> None:
    plain = Config.from_env({})
    embedded = Config.from_env({}, embedded=True)

    assert (embedded.endpoints.socket_path, embedded.storage.state_dir) == (
        "./.run/ipamd.sock",
        "./.run/state",
    )
    assert (
        embedded.network_policy.config_server_socket,
        embedded.network_policy.agent_socket,
        embedded.storage.aws_node_checkpoint,
    ) == ("./.run/aws-node/ipamd.sock", "./.run/aws-node/npa.sock", "./.run/aws-node/ipam.json")
    assert plain.storage.aws_node_checkpoint == "/var/run/aws-node/ipam.json"
    assert (plain.datapath.host_network, embedded.datapath.host_network) == ("on", "off"), (
        "a laptop run never touches the host's routing"
    )
    assert (plain.logging.file, plain.conflist.plugin_log_file) == (
        "/var/log/aws-routed-eni/ipamd.log",
        "/var/log/aws-routed-eni/plugin.log",
    ), "where aws-node writes them"
    assert (embedded.logging.file, embedded.conflist.plugin_log_file) == (
        "./.run/aws-routed-eni/ipamd.log",
        "./.run/aws-routed-eni/plugin.log",
    ), "nor the host's /var/log"
    changed = {"endpoints", "storage", "datapath", "network_policy", "logging", "conflist"}
    for group in changed:
        assert getattr(embedded, group) != getattr(plain, group), group
    rest = dataclasses.replace(embedded, **{group: getattr(plain, group) for group in changed})
    assert rest == plain


def test_host_network_settings_parse_with_vpc_cni_meanings() -> None:
    config = Config.from_env(
        {
            "IPAMD_HOST_NETWORK": "OFF",
            "AWS_VPC_ENI_MTU": "1500",
            "POD_MTU": "1400",
            "AWS_VPC_K8S_CNI_EXTERNALSNAT": "true",
            "AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS": "192.168.0.0/24, 172.16.0.5/12,,",
            "AWS_VPC_K8S_CNI_RANDOMIZESNAT": "hashrandom",
        },
        embedded=True,
    )
    assert config.datapath.host_network == "off"
    assert (config.datapath.eni_mtu, config.conflist.pod_mtu) == (1500, 1400)
    assert config.datapath.external_snat is True
    assert config.datapath.exclude_snat_cidrs == ("192.168.0.0/24", "172.16.0.0/12")
    assert config.datapath.randomize_snat == "hashrandom"
    assert (
        Config.from_env({"IPAMD_HOST_NETWORK": "on"}, embedded=True).datapath.host_network == "on"
    )


def test_bad_host_network_values_are_reported_together() -> None:
    problems = problems_of(
        {
            "IPAMD_HOST_NETWORK": "maybe",
            "AWS_VPC_ENI_MTU": "9002",
            "POD_MTU": "575",
            "AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS": "10.0.0.0/8,not-a-cidr",
            "AWS_VPC_K8S_CNI_RANDOMIZESNAT": "sometimes",
            "AWS_VPC_CNI_NODE_PORT_SUPPORT": "yes please",
        }
    )
    assert sorted(p.split("=")[0] for p in problems) == [
        "AWS_VPC_CNI_NODE_PORT_SUPPORT",
        "AWS_VPC_ENI_MTU",
        "AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS",
        "AWS_VPC_K8S_CNI_RANDOMIZESNAT",
        "IPAMD_HOST_NETWORK",
        "POD_MTU",
    ]
    assert any("576 to 9001" in p for p in problems)
    assert any("'not-a-cidr'" in p for p in problems)


def test_explicit_values_win_over_embedded_defaults() -> None:
    environ = {"IPAMD_SOCKET": "/tmp/x/ipamd.sock", "IPAMD_STATE_DIR": "/tmp/x/state"}

    config = Config.from_env(environ, embedded=True)

    assert (config.endpoints.socket_path, config.storage.state_dir) == (
        "/tmp/x/ipamd.sock",
        "/tmp/x/state",
    )


def test_all_bad_values_are_reported_in_one_error() -> None:
    with pytest.raises(ConfigError) as caught:
        Config.from_env({"WARM_IP_TARGET": "-3", "MAX_ENI": "abc"})

    error = caught.value
    assert isinstance(error, ValueError)
    assert error.problems == (
        "WARM_IP_TARGET='-3': must be an integer >= 0",
        "MAX_ENI='abc': must be an integer >= 1, or -1 for no cap",
    )
    assert str(error).splitlines() == list(error.problems)


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"WARM_ENI_TARGET": "abc"}, "WARM_ENI_TARGET='abc': must be an integer >= 0"),
        ({"WARM_PREFIX_TARGET": "1.5"}, "WARM_PREFIX_TARGET='1.5': must be an integer >= 0"),
        ({"IP_COOLDOWN_PERIOD": "30s"}, "IP_COOLDOWN_PERIOD='30s': must be an integer >= 0"),
        ({"ENABLE_PREFIX_DELEGATION": "yes"}, "ENABLE_PREFIX_DELEGATION='yes': must be a boolean"),
        ({"DISABLE_METRICS": " true"}, "DISABLE_METRICS=' true': must be a boolean"),
        ({"IPAMD_LEAK_GRACE": "-1"}, "IPAMD_LEAK_GRACE='-1': must be a duration >= 0"),
        ({"IPAMD_LEAK_GRACE": "10d"}, "IPAMD_LEAK_GRACE='10d': must be a duration >= 0"),
        ({"IPAMD_LEAK_GRACE": "9" * 400}, "must be a duration >= 0"),
        ({"IPAMD_POOL_INTERVAL": "0"}, "IPAMD_POOL_INTERVAL='0': must be a duration > 0"),
        ({"IPAMD_METRICS_ADDR": "127.0.0.1:0"}, "IPAMD_METRICS_ADDR='127.0.0.1:0': must be host"),
        ({"IPAMD_METRICS_ADDR": "127.0.0.1:65536"}, "port 1..65535"),
        ({"IPAMD_METRICS_ADDR": "61678"}, "IPAMD_METRICS_ADDR='61678': must be host:port"),
        ({"IPAMD_METRICS_ADDR": "::1:61678"}, "an IPv6 host in brackets"),
        ({"IPAMD_METRICS_ADDR": "[nope]:61678"}, "IPAMD_METRICS_ADDR='[nope]:61678'"),
        ({"ADDITIONAL_ENI_TAGS": "{bad"}, "ADDITIONAL_ENI_TAGS='{bad': must be a JSON object"),
        ({"ADDITIONAL_ENI_TAGS": '["a"]'}, "must be a JSON object of string keys"),
        ({"ADDITIONAL_ENI_TAGS": '{"a": 1}'}, "the value of tag 'a' must be a string"),
        ({"ADDITIONAL_ENI_TAGS": '{"a": {"b": "c"}}'}, "the value of tag 'a' must be a string"),
        ({"ADDITIONAL_ENI_TAGS": '{"node.k8s.amazonaws.com/x": "y"}'}, "is reserved"),
        ({"ADDITIONAL_ENI_TAGS": '{"aws:owner": "me"}'}, "the aws: prefix belongs to AWS"),
        ({"ADDITIONAL_ENI_TAGS": '{"a": "1", "a": "2"}'}, "tag key 'a' appears twice"),
        ({"ADDITIONAL_ENI_TAGS": '{"a": "' + "v" * 257 + '"}'}, "is too long"),
        ({"HTTP_TIMEOUT": "5"}, "HTTP_TIMEOUT='5': must be an integer >= 10"),
        ({"MAX_ENI": "0"}, "MAX_ENI='0': must be an integer >= 1, or -1 for no cap"),
        ({"MAX_ENI": "-2"}, "MAX_ENI='-2': must be an integer >= 1"),
        ({"IPAMD_MAX_PODS": "0"}, "IPAMD_MAX_PODS='0': must be an integer >= 1"),
        ({"AWS_EC2_ENDPOINT": "ec2.example.com"}, "must be an http:// or https:// URL"),
        ({"AWS_EC2_ENDPOINT": "https://"}, "must be an http:// or https:// URL with a host"),
        ({"AWS_EC2_ENDPOINT": "https://h:port"}, "must be an http:// or https:// URL"),
        ({"AWS_REGION": "US-EAST-1"}, "AWS_REGION='US-EAST-1': must be an AWS region"),
        ({"IPAMD_EMBEDDED_INSTANCE_TYPE": "large"}, "must be an EC2 instance type"),
        ({"IPAMD_LOG_FORMAT": "xml"}, "IPAMD_LOG_FORMAT='xml': must be one of auto, json, text"),
        ({"AWS_VPC_K8S_CNI_LOGLEVEL": "trace"}, "must be one of debug, info, warn, error, fatal"),
        ({"AWS_VPC_K8S_CNI_LOGLEVEL": "warning"}, "must be one of debug, info, warn, error, fatal"),
        ({"AWS_VPC_K8S_PLUGIN_LOG_LEVEL": "verbose"}, "must be one of debug, info, warn, error"),
        ({"AWS_VPC_K8S_PLUGIN_LOG_FILE": "stdout"}, "the plugin's standard output is its answer"),
        (
            {"IPAMD_LOG_LEVEL": "info", "AWS_VPC_K8S_CNI_LOGLEVEL": "debug"},
            "IPAMD_LOG_LEVEL='info': renamed AWS_VPC_K8S_CNI_LOGLEVEL, which is set too",
        ),
        ({"IPAMD_LOG_LEVEL": "loud"}, "AWS_VPC_K8S_CNI_LOGLEVEL='loud': must be one of debug"),
        ({"IPAMD_SOCKET": "/" + "s" * 200}, "must be a unix socket path of at most 107 bytes"),
        (
            {"ENABLE_PREFIX_DELEGATION": "true", "WARM_PREFIX_TARGET": "0"},
            "ENABLE_PREFIX_DELEGATION='true': prefix mode needs WARM_PREFIX_TARGET, "
            "WARM_IP_TARGET or MINIMUM_IP_TARGET > 0 (all are 0)",
        ),
    ],
)
def test_each_kind_of_bad_value_is_reported(environ: dict[str, str], expected: str) -> None:
    problems = problems_of(environ)

    assert len(problems) == 1
    assert expected in problems[0]


@pytest.mark.parametrize("target", ["WARM_IP_TARGET", "WARM_PREFIX_TARGET", "MINIMUM_IP_TARGET"])
def test_prefix_mode_starts_with_any_one_target(target: str) -> None:
    environ = {"ENABLE_PREFIX_DELEGATION": "true", "WARM_PREFIX_TARGET": "0", target: "1"}

    assert Config.from_env(environ).sizing.enable_prefix_delegation is True


def test_cross_field_rule_is_skipped_when_a_target_did_not_parse() -> None:
    environ = {"ENABLE_PREFIX_DELEGATION": "true", "WARM_PREFIX_TARGET": "0", "WARM_IP_TARGET": "x"}

    assert [p.split("=")[0] for p in problems_of(environ)] == ["WARM_IP_TARGET"]


def test_minimum_ip_target_without_warm_ip_target_is_allowed() -> None:
    config = Config.from_env({"MINIMUM_IP_TARGET": "10"})

    assert (config.sizing.minimum_ip_target, config.sizing.warm_ip_target) == (10, 0)


def test_empty_string_counts_as_unset() -> None:
    everything_empty = {s.env: "" for s in SETTINGS}

    assert Config.from_env(everything_empty) == Config.from_env({})
    assert Config.from_env(everything_empty, embedded=True) == Config.from_env({}, embedded=True)


def test_unrelated_variables_are_ignored() -> None:
    environ = {"PATH": "/bin", "IPAMD_SERVICE_HOST": "10.0.0.1"}

    assert Config.from_env(environ) == Config.from_env({})


def test_describe_names_every_variable_and_round_trips() -> None:
    environ = {
        "WARM_IP_TARGET": "7",
        "MAX_ENI": "3",
        "ENABLE_PREFIX_DELEGATION": "T",
        "AWS_REGION": "eu-central-1",
        "AWS_EC2_ENDPOINT": "http://127.0.0.1:5000",
        "ADDITIONAL_ENI_TAGS": '{"team": "net", "cost-centre": "42"}',
        "IPAMD_METRICS_ADDR": "[::1]:9100",
        "IPAMD_MAX_PODS": "58",
        "AWS_VPC_K8S_CNI_LOGLEVEL": "ERROR",
        "AWS_VPC_K8S_CNI_LOG_FILE": "STDOUT",
        "AWS_VPC_K8S_PLUGIN_LOG_FILE": "stderr",
        "IPAMD_LEAK_GRACE": "0.01ms",
        "IPAMD_POOL_INTERVAL": "2.5",
        "IPAMD_ENI_GC_INTERVAL": "2h",
    }
    for config in (Config.from_env({}), Config.from_env(environ, embedded=True)):
        described = config.describe()

        assert list(described) == [s.env for s in SETTINGS]
        assert Config.from_env(described) == config


def test_describe_shows_values_in_environment_form() -> None:
    described = Config.from_env({"IPAMD_LEAK_GRACE": "500ms", "MAX_ENI": "-1"}).describe()

    assert described["IPAMD_LEAK_GRACE"] == "0.5"
    assert described["IPAMD_ENI_GC_INTERVAL"] == "3600"
    assert described["MAX_ENI"] == "-1"
    assert described["ENABLE_PREFIX_DELEGATION"] == "false"
    assert described["IPAMD_METRICS_ADDR"] == "127.0.0.1:61678"


def test_config_is_frozen() -> None:
    config = Config.from_env({})

    with pytest.raises(dataclasses.FrozenInstanceError):
        config.sizing.warm_ip_target = 5  # type: ignore[misc]
    with pytest.raises((AttributeError, TypeError)):
        config.extra = 1  # type: ignore[attr-defined]


def test_settings_cover_every_field_once() -> None:
    groups = {f.name: f.default_factory for f in dataclasses.fields(Config)}
    declared = [(g, f.name) for g, group in groups.items() for f in dataclasses.fields(group)]  # type: ignore[arg-type]
    assert [(s.group, s.field) for s in SETTINGS] == declared
    assert len({s.env for s in SETTINGS}) == len(SETTINGS)


def test_every_setting_is_documented() -> None:
    for setting in SETTINGS:
        assert setting.doc and setting.vpc_cni, setting.env


def test_docs_table_matches_the_settings() -> None:
    begin, end = "<!-- settings:begin -->", "<!-- settings:end -->"
    text = DOCS.read_text(encoding="utf-8")
    assert text.count(begin) == 1 and text.count(end) == 1

    table = text.split(begin, 1)[1].split(end, 1)[0]

    assert table.strip() == render_settings_table(SETTINGS).strip()


def test_settings_table_has_one_row_per_setting() -> None:
    rows = render_settings_table(SETTINGS).splitlines()[2:]

    assert [row.split(" | ")[0].strip("| `") for row in rows] == [s.env for s in SETTINGS]


# -- the address family: VPC CNI's rules between ENABLE_IPv4, ENABLE_IPv6, prefixes and custom networking


def _family_environ(tmp_path: Path, ipv4: bool, ipv6: bool, pd: bool, cn: bool) -> dict[str, str]:
    """Each of the four settings set explicitly; custom networking with the ENIConfig file it needs,
    so that only the address family's rules can be broken."""
    environ = {
        "ENABLE_IPv4": str(ipv4).lower(),
        "ENABLE_IPv6": str(ipv6).lower(),
        "ENABLE_PREFIX_DELEGATION": str(pd).lower(),
        "AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG": str(cn).lower(),
    }
    if cn:
        path = tmp_path / "eniconfigs.json"
        path.write_text(json.dumps({"us-west-2a": {"subnet": "subnet-0123456789abcdef0"}}))
        environ["IPAMD_ENI_CONFIG_FILE"] = str(path)
    return environ


def _family_problems(ipv4: bool, ipv6: bool, pd: bool, cn: bool) -> list[str]:
    """What the rules must say for one combination, in the order they are reported."""
    family = f"ENABLE_IPv4={str(ipv4).lower()!r}, ENABLE_IPv6={str(ipv6).lower()!r}"
    expected = []
    if ipv4 and ipv6:
        expected.append(f"{family}: exactly one address family may be on (there is no dual stack)")
    if not ipv4 and not ipv6:
        expected.append(f"{family}: exactly one address family must be on (neither is)")
    if ipv6 and not pd:
        expected.append(
            "ENABLE_IPv6='true': needs ENABLE_PREFIX_DELEGATION=true (is 'false'): IPv6 pods' "
            "addresses come from a /80 prefix"
        )
    if ipv6 and cn:
        expected.append(
            "ENABLE_IPv6='true': cannot be combined with AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG='true' "
            "(custom networking is IPv4 only)"
        )
    return expected


@pytest.mark.parametrize(
    ("ipv4", "ipv6", "pd", "cn"),
    list(itertools.product((False, True), repeat=4)),
    ids=lambda on: "on" if on else "off",
)
def test_address_family_rules_in_every_combination(
    tmp_path: Path, ipv4: bool, ipv6: bool, pd: bool, cn: bool
) -> None:
    environ = _family_environ(tmp_path, ipv4, ipv6, pd, cn)
    expected = _family_problems(ipv4, ipv6, pd, cn)

    if expected:
        assert list(problems_of(environ)) == expected
    else:
        config = Config.from_env(environ)
        assert (config.family.enable_ipv4, config.family.enable_ipv6) == (ipv4, ipv6)
        assert (config.sizing.enable_prefix_delegation, config.custom_networking.enabled) == (
            pd,
            cn,
        )


def test_the_only_valid_ipv6_configuration_names_vpc_cnis_settings() -> None:
    config = Config.from_env(
        {"ENABLE_IPv4": "false", "ENABLE_IPv6": "true", "ENABLE_PREFIX_DELEGATION": "true"}
    )

    assert (
        config.family.enable_ipv4,
        config.family.enable_ipv6,
        config.sizing.enable_prefix_delegation,
    ) == (
        False,
        True,
        True,
    )
    described = config.describe()
    assert (described["ENABLE_IPv4"], described["ENABLE_IPv6"]) == ("false", "true")
    assert Config.from_env(described) == config


def test_ipv6_alone_is_refused_because_ipv4_is_on_by_default() -> None:
    assert problems_of({"ENABLE_IPv6": "true", "ENABLE_PREFIX_DELEGATION": "true"}) == (
        "ENABLE_IPv4='true', ENABLE_IPv6='true': exactly one address family may be on (there is "
        "no dual stack)",
    )


def test_address_family_problems_quote_the_text_as_given() -> None:
    problems = problems_of({"ENABLE_IPv4": "0", "ENABLE_IPv6": "F"})

    assert problems == (
        "ENABLE_IPv4='0', ENABLE_IPv6='F': exactly one address family must be on (neither is)",
    )


def test_address_family_rules_are_skipped_when_a_family_did_not_parse() -> None:
    problems = problems_of({"ENABLE_IPv4": "no", "ENABLE_IPv6": "true"})

    assert [p.split("=")[0] for p in problems] == ["ENABLE_IPv4"]


def test_address_family_problems_come_with_every_other_problem() -> None:
    environ = {
        "WARM_IP_TARGET": "-1",
        "ENABLE_IPv4": "false",
        "ENABLE_IPv6": "true",
        "AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG": "true",
        "IPAMD_KUBERNETES": "off",
        "IPAMD_CNI_CONF_DIR": "/etc/cni/net.d",
    }

    problems = problems_of(environ)

    assert [p.split(":")[0] for p in problems] == [
        "WARM_IP_TARGET='-1'",
        "AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG='true'",
        "IPAMD_CNI_CONF_DIR='/etc/cni/net.d'",
        "ENABLE_IPv6='true'",
        "ENABLE_IPv6='true'",
    ]
    assert "ENABLE_PREFIX_DELEGATION=true" in problems[3]
    assert "AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG='true'" in problems[4]


@pytest.mark.parametrize(
    ("old", "level"), [("debug", "debug"), ("warning", "warn"), ("ERROR", "error")]
)
def test_the_old_log_level_variable_is_still_read_as_its_successor(old: str, level: str) -> None:
    assert Config.from_env({"IPAMD_LOG_LEVEL": old}).logging.level == level


def test_each_rule_reads_settings_of_the_groups_it_takes() -> None:
    """A rule runs only once the variables it names parsed: each must be a setting of a group the
    rule takes, or the rule could read a default standing in for a value that did not parse."""
    for rule, reads in RULES:
        taken = {s.env for group in groups_read_by(rule) for s in settings_of(group)}
        assert reads and set(reads) <= taken, rule.__name__


def test_a_rule_waits_for_the_settings_it_reads_and_no_others() -> None:
    # The template does not parse: its group holds the default (none) in its place, which the rule
    # between the two would call missing; the rule waits. The family's rule, which reads neither,
    # runs.
    problems = problems_of(
        {
            "IPAMD_CNI_CONF_DIR": "/etc/cni/net.d",
            "IPAMD_CNI_CONFLIST_TEMPLATE": "relative.conflist",
            "ENABLE_IPv4": "false",
            "ENABLE_IPv6": "true",
        }
    )
    assert [p.split("=")[0] for p in problems] == ["IPAMD_CNI_CONFLIST_TEMPLATE", "ENABLE_IPv6"]
    assert "needs ENABLE_PREFIX_DELEGATION=true" in problems[1]
    assert problems_of({"IPAMD_CNI_CONF_DIR": "/etc/cni/net.d"}) == (
        "IPAMD_CNI_CONF_DIR='/etc/cni/net.d': needs IPAMD_CNI_CONFLIST_TEMPLATE, the conflist to "
        "write",
    ), "with the template unset, the rule runs"
