"""A DaemonSet container as `podman run` arguments: the image run the way a node runs it.

Everything is read from deploy/daemonset.yaml and deploy/configmap.yaml, never restated here: the
command (which replaces the image's entrypoint and command, as in Kubernetes), the user, the
capabilities, no privilege escalation, the read-only root filesystem (with no tmpfs of Podman's:
Kubernetes gives none), the memory and CPU limits, the mounts, and the environment (the ConfigMap's
`envFrom`, then `env`, which wins, with `fieldRef`s answered and `$(VAR)` references expanded as the
kubelet does). Only these differ from a node:

- a hostPath volume is a directory under `host_root`, the test's stand-in for the node's `/`;
- the pod's host network is the test's network namespace (`netns`), not the machine's;
- `config` overrides ConfigMap values, as an overlay would (the test's EC2 endpoint, its region).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.deploy.repo import find, pod_spec

Doc = dict[str, Any]
_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


NODE_NAME = "ip-10-0-1-17.us-west-2.compute.internal"
"""What `spec.nodeName` answers: the test node's name."""


@dataclass(frozen=True)
class Node:
    host_root: Path
    """The node's `/`: hostPath volumes are directories under it."""
    netns: Path
    """The node's network namespace (/run/netns/<name>), the pod's host network."""
    host_ip: str
    """What `status.hostIP` answers."""


def container_spec(name: str) -> Doc:
    spec = pod_spec()
    (found,) = [c for c in spec["containers"] + spec["initContainers"] if c["name"] == name]
    assert isinstance(found, dict)
    return found


def host_path(node: Node, volume_name: str) -> Path:
    """Where a hostPath volume of the pod is on the test's node (created if the volume says so)."""
    (volume,) = [v for v in pod_spec()["volumes"] if v["name"] == volume_name]
    source = volume["hostPath"]
    path: Path = node.host_root / str(source["path"]).lstrip("/")
    if source.get("type") == "DirectoryOrCreate":
        path.mkdir(parents=True, exist_ok=True)
    assert path.is_dir(), f"hostPath {source['path']} ({source.get('type')}) is not a directory"
    return path


def environment(container: Doc, node: Node, config: Mapping[str, str]) -> dict[str, str]:
    """The container's environment as the kubelet builds it."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        configmap = find("ConfigMap", source["configMapRef"]["name"])
        env.update({k: str(v) for k, v in configmap["data"].items()})
        env.update({k: v for k, v in config.items() if k in configmap["data"]})
    fields = {"status.hostIP": node.host_ip, "spec.nodeName": NODE_NAME}
    for item in container.get("env", []):
        if "valueFrom" in item:
            env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            value = str(item.get("value", ""))
            env[item["name"]] = _REFERENCE.sub(lambda m: env.get(m[1], m[0]), value)
    return env


def _memory(quantity: str) -> str:
    number, unit = re.fullmatch(r"(\d+)(Mi|Gi)", quantity).groups()  # type: ignore[union-attr]
    return f"{number}{unit[0].lower()}"


def _cpus(quantity: str) -> str:
    return str(int(quantity[:-1]) / 1000) if quantity.endswith("m") else quantity


def _security(context: Doc) -> list[str]:
    args = ["--user", f"{context['runAsUser']}:{context['runAsGroup']}"]
    assert not context.get("privileged"), "the smoke test runs no privileged container"
    if context.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    if context.get("readOnlyRootFilesystem"):
        args += ["--read-only", "--read-only-tmpfs=false"]
    capabilities = context.get("capabilities", {})
    args += [f"--cap-drop={c}" for c in capabilities.get("drop", [])]
    args += [f"--cap-add={c}" for c in capabilities.get("add", [])]
    return args


def _mounts(container: Doc, node: Node) -> list[str]:
    volumes = {v["name"]: v for v in pod_spec()["volumes"]}
    args: list[str] = []
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if "emptyDir" in volume:
            assert volume["emptyDir"].get("medium") == "Memory", volume
            size = _memory(volume["emptyDir"]["sizeLimit"])
            args += ["--tmpfs", f"{mount['mountPath']}:rw,size={size}"]
            continue
        source = host_path(node, mount["name"])
        options = "ro" if mount.get("readOnly") else "rw"
        args += ["--volume", f"{source}:{mount['mountPath']}:{options}"]
    return args


def run_args(
    name: str, node: Node, config: Mapping[str, str], extra_env: Mapping[str, str]
) -> list[str]:
    """`podman run` options for DaemonSet container `name` (image and command not included: see
    `command`), with `extra_env` added after the DaemonSet's environment."""
    container = container_spec(name)
    spec = pod_spec()
    assert spec.get("hostNetwork") is True
    args = ["--network", f"ns:{node.netns}"]
    args += _security(container["securityContext"])
    limits = container.get("resources", {}).get("limits", {})
    if "memory" in limits:
        args += ["--memory", _memory(limits["memory"])]
    if "cpu" in limits:
        args += ["--cpus", _cpus(limits["cpu"])]
    args += _mounts(container, node)
    env = environment(container, node, config) | dict(extra_env)
    for key, value in sorted(env.items()):
        args += ["--env", f"{key}={value}"]
    return args


def entrypoint(name: str) -> str:
    """The container's `command` as Podman's `--entrypoint` (JSON): it replaces the image's
    ENTRYPOINT, and with no `args` the image's CMD is dropped too, as in Kubernetes."""
    container = container_spec(name)
    assert "args" not in container
    return json.dumps(container["command"])


def probe(name: str, kind: str) -> list[str]:
    """The exec probe's command (`readinessProbe`, `livenessProbe`, `startupProbe`)."""
    command = container_spec(name)[kind]["exec"]["command"]
    assert isinstance(command, list)
    return [str(word) for word in command]
