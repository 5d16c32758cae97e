"""What the DaemonSet promises (issue 6), and that its pieces agree with each other and with ipamd:
the socket path of the env, the mount and the conflist; the ConfigMap and env parse as ipamd's
configuration; every path it runs is one the Dockerfile puts in the image."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from ipamd.config.settings import SETTINGS, Config
from ipamd.node import conflist as conflist_file
from ipamd.wire import SUPPORTED_CNI_VERSIONS
from tests.deploy import upstream
from tests.deploy.repo import (
    CONFLIST,
    DOCKERFILE,
    IMAGE_DIR,
    Doc,
    conflist,
    container,
    daemonset,
    env_of,
    find,
    pod_spec,
    project,
)

DOWNWARD_ONLY = frozenset({"HOST_IP"})
"""Variables set for `$(...)` expansion in other values, not read by ipamd."""


def host_paths() -> dict[str, str]:
    return {v["name"]: v["hostPath"]["path"] for v in pod_spec()["volumes"] if "hostPath" in v}


def mounts(c: Doc) -> dict[str, Doc]:
    return {m["name"]: m for m in c.get("volumeMounts", [])}


def env_value(c: Doc, name: str) -> str:
    value: str = env_of(c)[name]["value"]
    return value


def test_runs_on_every_node_as_a_critical_host_network_pod() -> None:
    spec = pod_spec()
    assert spec["hostNetwork"] is True
    assert spec["dnsPolicy"] == "Default", "cluster DNS needs pod networking, which needs ipamd"
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["tolerations"] == [{"operator": "Exists"}], "tolerates every taint"
    assert spec["automountServiceAccountToken"] is False
    assert spec["serviceAccountName"] == find("ServiceAccount", "ipamd")["metadata"]["name"]


def test_runs_on_the_nodes_aws_node_runs_on() -> None:
    """Linux, amd64 or arm64 (the platforms `make image` builds), not a Fargate, hybrid or EKS Auto
    Mode node: aws-node's node affinity, term for term (tests/deploy/fixtures/, v1.23.1)."""
    required = pod_spec()["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    (term,) = required["nodeSelectorTerms"]
    expressions = {e["key"]: (e["operator"], e["values"]) for e in term["matchExpressions"]}
    assert expressions == {
        "kubernetes.io/os": ("In", ["linux"]),
        "kubernetes.io/arch": ("In", ["amd64", "arm64"]),
        "eks.amazonaws.com/compute-type": ("NotIn", ["fargate", "hybrid", "auto"]),
    }
    assert pod_spec()["affinity"] == upstream.pod_spec()["affinity"]
    assert "nodeSelector" not in pod_spec(), "an overlay's nodeSelector narrows it (migration)"


def test_rolls_a_bounded_share_of_nodes_and_never_two_per_node() -> None:
    strategy = daemonset()["spec"]["updateStrategy"]
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"]["maxUnavailable"] not in (0, "0", "0%", None)
    assert strategy["rollingUpdate"]["maxSurge"] == 0


@pytest.mark.parametrize(
    ("name", "capabilities"),
    [
        ("install-cni", {"drop": ["ALL"]}),
        # The datapath: links, route tables and rules over netlink, the SNAT table with nft.
        ("ipamd", {"drop": ["ALL"], "add": ["NET_ADMIN"]}),
    ],
)
def test_containers_have_requests_limits_and_only_the_capabilities_they_need(
    name: str, capabilities: dict[str, list[str]]
) -> None:
    c = container(name)
    assert c["resources"]["requests"].keys() >= {"cpu", "memory"}
    assert "memory" in c["resources"]["limits"]
    sc = c["securityContext"]
    assert sc["capabilities"] == capabilities
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert not sc.get("privileged", False)


def test_only_the_sysctl_init_container_is_privileged_and_it_runs_one_script() -> None:
    spec = pod_spec()
    privileged = [
        c["name"]
        for c in spec["containers"] + spec["initContainers"]
        if c.get("securityContext", {}).get("privileged")
    ]
    assert privileged == ["host-sysctls"]
    sysctls = container("host-sysctls")
    assert sysctls["command"] == ["/bin/sh", "/opt/ipamd/bin/host-sysctls.sh"]
    assert "volumeMounts" not in sysctls, "it needs nothing of the node but /proc/sys"
    assert spec["initContainers"][0]["name"] == "host-sysctls"


def test_host_paths_are_the_node_paths_ipamd_uses() -> None:
    assert host_paths() == {
        "run-ipamd": "/run/ipamd",
        "state": "/var/lib/ipamd",
        "cni-bin": "/opt/cni/bin",
        "cni-conf": "/etc/cni/net.d",
        "containerd": "/run/containerd",
        "aws-node": "/var/run/aws-node",
        "aws-routed-eni": "/var/log/aws-routed-eni",
        "kubelet-config": "/etc/kubernetes/kubelet",
    }
    ipamd = mounts(container("ipamd"))
    assert ipamd["containerd"]["readOnly"] is True
    assert ipamd["kubelet-config"]["readOnly"] is True, "ipamd only reads the kubelet's config"
    assert set(mounts(container("install-cni"))) == {"cni-bin"}, "the installer touches only bin"
    assert "cni-bin" not in ipamd


def test_socket_is_at_the_same_path_in_the_container_the_node_and_the_conflist() -> None:
    """The node's runtime runs ipamd-cni outside the container: the conflist's socket path must be
    the node's path, so ipamd's socket lives in a directory mounted at its own node path."""
    ipamd = container("ipamd")
    socket = env_value(ipamd, "IPAMD_SOCKET")
    mount = mounts(ipamd)["run-ipamd"]["mountPath"]
    assert socket.startswith(mount + "/")
    assert mount == host_paths()["run-ipamd"]
    (plugin,) = [p for p in conflist()["plugins"] if p.get("ipam", {}).get("type") == "ipamd-cni"]
    assert plugin["ipam"]["socket"] == socket
    defaults = {s.env: s.default for s in SETTINGS}
    assert socket == defaults["IPAMD_SOCKET"], "the conflist also works with ipamd's default"


def test_every_path_setting_points_into_its_mount() -> None:
    ipamd = container("ipamd")
    m = {name: mount["mountPath"] for name, mount in mounts(ipamd).items()}
    assert env_value(ipamd, "IPAMD_STATE_DIR") == m["state"]
    assert env_value(ipamd, "IPAMD_CRI_SOCKET").startswith(m["containerd"] + "/")
    assert env_value(ipamd, "IPAMD_CNI_CONF_DIR") == m["cni-conf"]
    # The network-policy agent dials ipamd there and serves there; the checkpoint is aws-node's.
    assert m["aws-node"] == host_paths()["aws-node"], "the agent's DaemonSet mounts the same path"
    for setting in (
        "IPAMD_CONFIG_SERVER_SOCKET",
        "IPAMD_NETWORK_POLICY_AGENT_SOCKET",
        "AWS_VPC_K8S_CNI_BACKING_STORE",
    ):
        assert env_value(ipamd, setting).startswith(m["aws-node"] + "/"), setting
    # The kubelet's config at the node's path, where the EKS AMI writes it and ipamd's default.
    kubelet = env_value(ipamd, "IPAMD_KUBELET_CONFIG")
    assert kubelet.startswith(m["kubelet-config"] + "/")
    assert m["kubelet-config"] == host_paths()["kubelet-config"]
    assert kubelet == {s.env: s.default for s in SETTINGS}["IPAMD_KUBELET_CONFIG"]
    installer = container("install-cni")
    assert env_value(installer, "IPAMD_CNI_BIN_DIR") == mounts(installer)["cni-bin"]["mountPath"]


def test_the_logs_are_where_aws_node_writes_them() -> None:
    """ipamd.log and plugin.log in the node's /var/log/aws-routed-eni, where the EKS log collector
    and every runbook look: ipamd's through its mount, at the same path, the plugin's on the node
    (the runtime runs it there), named by the conflist ipamd writes."""
    ipamd = container("ipamd")
    log_file = env_value(ipamd, "AWS_VPC_K8S_CNI_LOG_FILE")
    mount = mounts(ipamd)["aws-routed-eni"]
    assert log_file == "/var/log/aws-routed-eni/ipamd.log"
    assert log_file.startswith(mount["mountPath"] + "/") and not mount.get("readOnly")
    assert mount["mountPath"] == host_paths()["aws-routed-eni"]
    config = Config.from_env(environment())
    assert config.logging.file == log_file
    assert config.conflist.plugin_log_file == host_paths()["aws-routed-eni"] + "/plugin.log"
    (plugin, _) = json.loads(
        conflist_file.render(
            CONFLIST,
            config.endpoints.socket_path,
            plugin_log=(config.conflist.plugin_log_file, "info"),
        )
    )["plugins"]
    assert plugin["pluginLogFile"] == "/var/log/aws-routed-eni/plugin.log"


def test_probes_get_readyz_and_healthz_on_the_socket() -> None:
    ipamd = container("ipamd")
    readiness = ipamd["readinessProbe"]["exec"]["command"]
    liveness = ipamd["livenessProbe"]["exec"]["command"]
    startup = ipamd["startupProbe"]["exec"]["command"]
    assert readiness[-1] == "/readyz"
    assert liveness[-1] == "/healthz" and startup[-1] == "/healthz"
    assert readiness[:-1] == liveness[:-1] == startup[:-1]
    script = readiness[-2]
    assert script.endswith("/ipamd_probe.py")
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert ipamd[probe]["timeoutSeconds"] > 4, "above the probe script's own 4 s timeout"


def environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The ipamd container's environment as kubelet builds it: ConfigMap, then env (which wins),
    with `$(VAR)` expanded."""
    ipamd = container("ipamd")
    (source,) = ipamd["envFrom"]
    data: dict[str, str] = dict(find("ConfigMap", source["configMapRef"]["name"])["data"])
    downward = {"HOST_IP": "10.0.1.17", "MY_NODE_NAME": "ip-10-0-1-17.us-west-2.compute.internal"}
    for name, entry in env_of(ipamd).items():
        if "value" in entry:
            data[name] = re.sub(r"\$\((\w+)\)", lambda m: downward[m.group(1)], entry["value"])
        else:
            data[name] = downward[name]
    return {**data, **(extra or {})}


def test_configmap_and_env_parse_as_ipamd_configuration() -> None:
    config = Config.from_env(environment())
    assert config.endpoints.socket_path == "/run/ipamd/ipamd.sock"
    assert config.storage.state_dir == "/var/lib/ipamd"
    assert (config.endpoints.metrics_addr.host, config.endpoints.metrics_addr.port) == (
        "10.0.1.17",
        61678,
    )
    assert config.logging.format == "json"


def test_configmap_carries_the_vpc_cni_knobs_and_only_known_settings() -> None:
    known = {s.env for s in SETTINGS}
    data: dict[str, Any] = find("ConfigMap", "ipamd-config")["data"]
    assert set(data) <= known, set(data) - known
    vpc_cni = {s.env for s in SETTINGS if not s.env.startswith("IPAMD_") and s.vpc_cni != "none"}
    from_pod = set(env_of(container("ipamd")))  # the node's name, from the downward API
    assert vpc_cni <= set(data) | from_pod, vpc_cni - set(data) - from_pod
    assert all(isinstance(v, str) for v in data.values())
    env = set(env_of(container("ipamd")))
    assert env <= known | DOWNWARD_ONLY, env - known


def test_prefix_mode_from_the_configmap_parses() -> None:
    """The documented switch to prefix mode is a valid configuration as shipped."""
    config = Config.from_env(environment({"ENABLE_PREFIX_DELEGATION": "true"}))
    assert config.sizing.enable_prefix_delegation is True


def test_conflist_is_a_cni_network_ipamd_cni_accepts() -> None:
    conf = conflist()
    assert conf["cniVersion"] in SUPPORTED_CNI_VERSIONS
    assert conf["name"] and isinstance(conf["plugins"], list)
    assert conf["name"] == "aws-cni", "VPC CNI's: the runtime's cached results of adopted pods"
    assert [p["type"] for p in conf["plugins"]] == ["ipamd-cni", "portmap"], "interface, hostPort"
    # aws-node's conflist chains portmap so (aws/amazon-vpc-cni-k8s v1.23.1, misc/10-aws.conflist):
    # the runtime passes a pod's hostPorts to the plugin that declares the capability.
    assert conf["plugins"][1] == {
        "type": "portmap",
        "capabilities": {"portMappings": True},
        "snat": True,
    }
    assert conf["plugins"][0]["ipam"]["type"] == "ipamd-cni"
    assert conf["plugins"][0]["vethPrefix"] == "eni", "the network-policy agent's name for veths"


def test_conflist_offers_spec_1_1_and_keeps_a_version_for_older_runtimes() -> None:
    """CNI spec 1.1's `cniVersions`: a runtime that speaks 1.1 picks the highest it knows, and
    only at 1.1.0 does it send GC and STATUS; a runtime before 1.1 (containerd 1.6) reads
    `cniVersion` alone, which must be one of the list."""
    conf = conflist()
    versions = conf["cniVersions"]
    assert isinstance(versions, list) and versions, versions
    assert set(versions) <= set(SUPPORTED_CNI_VERSIONS)
    assert "1.1.0" in versions
    assert conf["cniVersion"] in versions


def test_the_conflist_ipamd_writes_keeps_the_version_list() -> None:
    written = json.loads(conflist_file.render(CONFLIST, "/run/ipamd/ipamd.sock"))
    assert written["cniVersions"] == conflist()["cniVersions"]
    assert written["cniVersion"] == conflist()["cniVersion"]


def test_installer_requires_every_plugin_the_conflist_chains() -> None:
    script = (IMAGE_DIR / "install-cni.sh").read_text()
    match = re.search(r"IPAMD_CNI_REQUIRED_PLUGINS-([^}]*)\}", script)
    assert match is not None
    required = set(match.group(1).split())
    # ipamd-cni is the one plugin the installer brings; every other one the conflist runs is the node's.
    assert {p["type"] for p in conflist()["plugins"]} - {"ipamd-cni"} <= required
    assert "loopback" in required, "containerd brings up lo with the loopback plugin"


def image_paths() -> set[str]:
    """Paths the Dockerfile puts in the final image under /opt/ipamd: COPY destinations (a file
    copied into a directory keeps its name) and the venv's console scripts."""
    text = DOCKERFILE.read_text()
    final = text.split("\nFROM ")[-1]
    paths = {"/opt/ipamd/venv/bin/python"}
    paths |= {f"/opt/ipamd/venv/bin/{script}" for script in project()["scripts"]}
    for line in final.splitlines():
        words = line.split()
        if not words or words[0] != "COPY" or any(w.startswith("--from") for w in words):
            continue
        *sources, dest = words[1:]
        if dest.endswith("/"):
            paths |= {dest + src.rsplit("/", 1)[-1] for src in sources}
        else:
            paths.add(dest)
    built = re.findall(r"(/opt/ipamd/cni/(?:bundle|ipamd-cni))\b", text)
    return paths | set(built)


def test_every_image_path_the_daemonset_runs_is_in_the_image() -> None:
    spec = pod_spec()
    referenced: set[str] = set()
    for c in spec["containers"] + spec["initContainers"]:
        words = list(c.get("command", []))
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            words += c.get(probe, {}).get("exec", {}).get("command", [])
        words += [e.get("value", "") for e in c.get("env", [])]
        referenced |= {w for w in words if w.startswith("/opt/ipamd/")}
    assert referenced, "the DaemonSet runs files of the image"
    assert referenced <= image_paths(), referenced - image_paths()


def test_installer_defaults_are_the_image_paths() -> None:
    script = (IMAGE_DIR / "install-cni.sh").read_text()
    defaults = set(re.findall(r"\$\{IPAMD_CNI_(?:BUNDLE|LAUNCHER):-([^}]*)\}", script))
    assert defaults == {"/opt/ipamd/cni/bundle", "/opt/ipamd/cni/ipamd-cni"}
    assert defaults <= image_paths()
