"""The kubelet's config file: the node's max pods as the kubelet it serves will apply it
(IPAMD_KUBELET_CONFIG).

ipamd sizes its pool up to the node's max pods. EKS computes that number more than one way: the
managed node groups' max-pods calculator caps it at 110 or 250 by vCPU count, while the EKS AMI on a
self-managed node gives kubelet the uncapped ENI formula (737 on a c5.18xlarge), and operators set
their own. The kubelet's `maxPods` is the one that counts: a pod past it is never admitted, and a
pod under it that finds no address fails. So ipamd reads it where the EKS AMI writes it,
`/etc/kubernetes/kubelet/config.json` (a `KubeletConfiguration` as JSON), then the drop-ins of
`<file>.d/` (`*.conf`, in name order, each overriding the last: kubelet's `--config-dir`, where
nodeadm writes the operator's own settings), and takes the last `maxPods` found.

What each outcome means (the operator's view; `ipamd.config.settings` reports a problem with every other bad
setting, so ipamd does not start on it):
- no file at the path (or no directory): the node's kubelet is not configured there, so the
  calculator's value applies, as without the setting;
- a file without `maxPods`: the calculator's value (kubelet's own default would be 110);
- a file that cannot be read, is not JSON, or whose `maxPods` is no positive integer: an error. The
  operator pointed ipamd at the kubelet's settings; guessing instead would warm for a number the
  kubelet does not use, the disagreement this file exists to end.

The only I/O is reading these files, once, when `ipamd.config.settings` parses the setting at start. No
asyncio.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace

from ipamd.config.kinds import Kind

DEFAULT_KUBELET_CONFIG = "/etc/kubernetes/kubelet/config.json"
"""Where the EKS AMI (nodeadm) writes the kubelet's config file."""

_DROP_IN_SUFFIX = ".conf"
_MAX_BYTES = 1 << 20
"""A kubelet config is a few KiB; more is not one."""


@dataclass(frozen=True, slots=True)
class KubeletConfig:
    """What the kubelet's config says of max pods, and where it was read."""

    path: str
    max_pods: int | None = None
    """The last `maxPods` of the file and its drop-ins; None = no file, or none sets it."""
    source: str | None = None
    """The file that set `max_pods`: the config itself or one of its drop-ins."""
    read: bool = False
    """Whether any file was there to read (the config or a drop-in)."""

    def describe(self) -> str:
        """One line for operators: what the kubelet's config said, and where."""
        if self.max_pods is not None:
            return f"maxPods={self.max_pods} in {self.source}"
        if self.read:
            return f"no maxPods in {self.path} or its drop-ins"
        return f"no file at {self.path}"


def read_kubelet_config(path: str) -> KubeletConfig | None:
    """The kubelet's max pods from the file at `path` (absolute; empty = not read) and its drop-ins.
    Raises `ValueError`, one line per problem, each naming its file."""
    if not path:
        return None
    if not path.startswith("/"):
        raise ValueError("must be an absolute path")
    found = KubeletConfig(path)
    problems: list[str] = []
    for file in (path, *_drop_ins(path + ".d", problems)):
        try:
            max_pods = _max_pods(file)
        except FileNotFoundError:
            continue  # the main file absent: no kubelet config here; a drop-in gone since listed
        except ValueError as err:
            problems.append(f"{file}: {err}")
            continue
        if max_pods is not None:
            found = KubeletConfig(path, max_pods, file, read=True)
        else:
            found = replace(found, read=True)
    if problems:
        raise ValueError("\n".join(problems))
    return found


def show_kubelet_config(value: KubeletConfig | None) -> str:
    return value.path if value is not None else ""


KUBELET_CONFIG = Kind(read_kubelet_config, show_kubelet_config)
"""The setting's kind: the path in, the file's max pods out, the path shown back."""


def parse_max_pods(text: str) -> int | None:
    """`maxPods` of a `KubeletConfiguration` in JSON; None when it has none. Raises `ValueError`."""
    try:
        body = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(
            f"not JSON ({err.msg} at line {err.lineno} column {err.colno}); ipamd reads the "
            "kubelet config as the EKS AMI writes it, a KubeletConfiguration in JSON"
        ) from None
    if not isinstance(body, dict):
        raise ValueError("must be a JSON object (a KubeletConfiguration)")
    kind = body.get("kind", "KubeletConfiguration")
    if kind != "KubeletConfiguration":
        raise ValueError(f"is a {kind!r}, not a KubeletConfiguration")
    value = body.get("maxPods")
    if value is None:
        return None
    # bool is an int in Python; kubelet's maxPods is an int32 > 0.
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**31:
        raise ValueError(f"maxPods {value!r} must be a positive integer")
    return value


def _max_pods(file: str) -> int | None:
    try:
        with open(file, "rb") as stream:
            data = stream.read(_MAX_BYTES + 1)
    except FileNotFoundError:
        raise
    except OSError as err:
        raise ValueError(f"cannot read it: {err.strerror or err}") from None
    if len(data) > _MAX_BYTES:
        raise ValueError(f"larger than {_MAX_BYTES} bytes: not a kubelet config")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None
    return parse_max_pods(text)


def _drop_ins(directory: str, problems: list[str]) -> list[str]:
    """The drop-in files of `directory` in the order kubelet applies them (by name); none when
    there is no such directory."""
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as err:
        problems.append(f"{directory}: cannot list the drop-ins: {err.strerror or err}")
        return []
    return [os.path.join(directory, n) for n in sorted(names) if n.endswith(_DROP_IN_SUFFIX)]
