"""IPv4 egress for an IPv6 pod, as VPC CNI's `egress-cni` gives one in IPv6 mode: the pod reaches
IPv4-only destinations through a second veth pair whose address the node SNATs to its own.

The conf's `v4Egress` block turns it on (the interface plugin's conf, checked by
`ipamd.cni.invocation.parse_v4_egress`): `{"ifname": "v4if0", "subnet": "169.254.172.0/22",
"dataDir": "/run/ipamd/v4egress"}`, all three keys required, a bad one CNI error 7 naming it. The
pod's IPv4 address comes from the Debian `host-local` IPAM plugin found in CNI_PATH, executed as the
CNI spec says (CNI_COMMAND, CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME = the egress ifname, CNI_PATH;
stdin a conf naming the subnet and `dataDir`, where host-local keeps one file per address it handed
out). It is sent cniVersion 1.0.0, or 0.4.0 for a 0.4.0 conf: the IPAM result of 1.1.0 is 1.0.0's,
and Debian's host-local knows no later version. The next hop is the subnet's first address, held by
nobody (as 169.254.1.1 is for an IPv4 pod): `ipamd.cni.pod_interface.set_up` makes the pair with it.

The host veth of the pair is `v4-` + the last 11 characters of the pod's main host veth (the same
digest of the pod's name or container ID): found again from the same input, 14 characters, and
never one of `vethPrefix` + 11 (a prefix is alphanumeric; `-` is not), so the network-policy agent
never mistakes it for the pod's interface.

Only this module's own imports are paid, and only by a conf that has the block: no `subprocess`
(`posix_spawn`, two pipes and `select` do), no `ipaddress`.
"""

from __future__ import annotations

import os

from ipamd.wire import WireError, dumps, parse_object

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ipamd.cni.invocation import Invocation, V4Egress

EGRESS_VETH_PREFIX = "v4-"
HOST_LOCAL = "host-local"
HOST_LOCAL_TIMEOUT_S = 10.0
"""host-local answers in milliseconds; longer means its dataDir lock is held by a wedged peer."""
SIGKILL = 9
"""Linux's; the `signal` module would import `enum`."""
_READ_BYTES = 65536


class DelegateError(Exception):
    """host-local could not be run, or answered with an error."""

    def __init__(self, msg: str, details: str = "") -> None:
        super().__init__(f"{msg}: {details}" if details else msg)
        self.msg = msg
        self.details = details


def egress_veth_name(host_name: str) -> str:
    """The host veth of the pod's egress pair, from the pod's main host veth (module docstring)."""
    return EGRESS_VETH_PREFIX + host_name[-11:]


def host_local_conf(inv: Invocation, egress: V4Egress) -> dict[str, object]:
    """host-local's stdin: the network's name, the subnet as its one range, the dataDir."""
    return {
        "cniVersion": "0.4.0" if inv.conf.cni_version == "0.4.0" else "1.0.0",
        "name": inv.conf.network,
        "ipam": {
            "type": HOST_LOCAL,
            "ranges": [[{"subnet": egress.subnet}]],
            "dataDir": egress.data_dir,
        },
    }


def host_local_add(inv: Invocation, egress: V4Egress) -> str:
    """host-local's ADD: the pod's IPv4 egress address (no prefix). Raises `DelegateError`.

    host-local refuses a second address to an attachment it holds one for, which is what a retried
    ADD asks: a refused ADD is tried once more after host-local's DEL of the attachment (a no-op
    when the refusal was something else, such as a full range, which the second ADD reports)."""
    try:
        answer = _host_local("ADD", inv, egress)
    except DelegateError:
        _host_local("DEL", inv, egress)
        answer = _host_local("ADD", inv, egress)
    ips = answer.get("ips")
    for ip in ips if isinstance(ips, list) else []:
        address = ip.get("address") if isinstance(ip, dict) else None
        if isinstance(address, str) and "." in address:
            return address.partition("/")[0]
    raise DelegateError("host-local's result holds no IPv4 address", dumps(answer))


def host_local_delete(inv: Invocation, egress: V4Egress) -> None:
    """host-local's DEL (of an address it never gave, too: done). Raises `DelegateError`."""
    _host_local("DEL", inv, egress)


def _host_local(command: str, inv: Invocation, egress: V4Egress) -> dict[str, object]:
    path = _find(inv.cni_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CNI_")}
    env.update(
        CNI_COMMAND=command,
        CNI_CONTAINERID=inv.container_id,
        CNI_IFNAME=egress.ifname,
        CNI_PATH=inv.cni_path,
    )
    if inv.netns:
        env["CNI_NETNS"] = inv.netns
    code, out = _run(path, env, dumps(host_local_conf(inv, egress)).encode())
    try:
        answer = parse_object(out) if out.strip() else {}
    except WireError as err:
        raise DelegateError(f"host-local {command}: unexpected output", str(err)) from None
    if code != 0:
        msg, details = answer.get("msg", ""), answer.get("details", "")
        raise DelegateError(f"host-local {command} failed (exit {code}): {msg}", str(details))
    return answer


def _find(cni_path: str) -> str:
    for directory in cni_path.split(":"):
        candidate = os.path.join(directory, HOST_LOCAL)
        if directory and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise DelegateError(f"no {HOST_LOCAL} plugin in CNI_PATH", repr(cni_path))


def _run(path: str, env: dict[str, str], stdin: bytes) -> tuple[int, bytes]:
    """Executes `path` with `stdin` on its standard input; its exit code and standard output (its
    standard error is the plugin's, which the runtime logs). Killed after HOST_LOCAL_TIMEOUT_S."""
    import select
    import time

    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    try:
        try:
            actions = [(os.POSIX_SPAWN_DUP2, in_r, 0), (os.POSIX_SPAWN_DUP2, out_w, 1)]
            pid = os.posix_spawn(path, [path], env, file_actions=actions)
        finally:
            os.close(in_r)
            os.close(out_w)
        # A few hundred bytes: within the pipe's buffer. `contextlib.suppress` would be an import.
        try:  # noqa: SIM105
            os.write(in_w, stdin)
        except OSError:
            pass  # it exited without reading; its exit code says why
        os.close(in_w)
        in_w = -1
        chunks: list[bytes] = []
        deadline = time.monotonic() + HOST_LOCAL_TIMEOUT_S
        while (left := deadline - time.monotonic()) > 0:
            if select.select([out_r], [], [], left)[0]:
                chunk = os.read(out_r, _READ_BYTES)
                if not chunk:
                    break
                chunks.append(chunk)
        else:
            os.kill(pid, SIGKILL)
            os.waitpid(pid, 0)
            raise DelegateError(f"{path} did not finish within {HOST_LOCAL_TIMEOUT_S:.0f} s")
        _, status = os.waitpid(pid, 0)
    except OSError as err:
        raise DelegateError(f"cannot run {path}", str(err)) from None
    finally:
        os.close(out_r)
        if in_w >= 0:
            os.close(in_w)
    return os.waitstatus_to_exitcode(status), b"".join(chunks)
