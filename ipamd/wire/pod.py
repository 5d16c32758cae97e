"""What the interface plugin and the daemon share about a pod's interface beyond the allocation:
VPC CNI's host-side interface name, and the request that asks ipamd to tell the network-policy agent
that a pod's interface exists.

The host veth is named as VPC CNI names it, `eni` + the first 11 hex digits of
sha1("<namespace>.<name>"), because the EKS network-policy agent finds a pod's interface by that name
and aws-node, started again after ipamd, keeps only the checkpoint entries whose veth it finds.

The plugin imports this module on every ADD and DEL: standard library C modules only, like
`ipamd.wire`.
"""

from __future__ import annotations

from ipamd.wire.codec import Value, WireError, fields_of
from ipamd.wire.fast import sha1

DEFAULT_VETH_PREFIX = "eni"
MAX_VETH_PREFIX = 4
"""VPC CNI's limit: the prefix and 11 hex digits fit IFNAMSIZ (15 bytes)."""
RESERVED_VETH_PREFIXES = ("eth", "lo", "vlan")

V4_EGRESS_CIDR = "169.254.172.0/22"
"""IPv6 mode: where an IPv6 pod's IPv4 egress interface takes its address (host-local IPAM, per
node), SNATed to the node's IPv4 by the daemon; VPC CNI's egress plugin uses the same range."""
V4_EGRESS_IFNAME = "v4if0"
"""IPv6 mode: the name of that interface inside the pod, VPC CNI's."""
V4_EGRESS_DIR = "v4-egress"
"""IPv6 mode: host-local's data directory for those addresses, beside IPAMD_SOCKET (on a node,
/run/ipamd: a tmpfs, so a reboot, which ends every pod, forgets their reservations too, as VPC
CNI's egress plugin keeps them under /run)."""
POLICY_SEGMENT = "policy"
"""`POST /v1/allocations/{cid}/{ifname}/policy?network=NAME`: the pod's interface exists; ipamd
tells the agent (EnforceNpToPod) or, if the agent refuses or cannot be reached, retracts the
allocation and answers 502 `network_policy_refused`."""

MAX_INTERFACES = 16


def veth_name(prefix: str, namespace: str, name: str) -> str:
    """VPC CNI's host veth name for the pod `namespace/name`."""
    digest: str = sha1(f"{namespace}.{name}".encode()).hexdigest()
    return prefix + digest[:11]


def check_veth_prefix(value: object) -> str:
    """A usable `vethPrefix`: 1-4 characters, alphanumeric, not one the kernel or EC2 uses."""
    if not isinstance(value, str) or not value or not value.isalnum() or not value.isascii():
        raise WireError("vethPrefix must be 1-4 ASCII letters or digits")
    if len(value) > MAX_VETH_PREFIX:
        raise WireError(f"vethPrefix {value!r} is longer than {MAX_VETH_PREFIX} characters")
    if value in RESERVED_VETH_PREFIXES:
        raise WireError(f"vethPrefix {value!r} is reserved (eth, lo, vlan)")
    return value


class PolicyRequest(Value):
    """The body of the policy call: how many interfaces the pod has (VPC CNI's InterfaceCount)."""

    __slots__ = ("interfaces",)

    interfaces: int

    def __init__(self, interfaces: int = 1) -> None:
        self._init(interfaces=interfaces)

    @classmethod
    def from_json(cls, obj: object) -> PolicyRequest:
        fields = fields_of(obj, "body", (), ("interfaces",))
        count = fields.get("interfaces", 1)
        if isinstance(count, bool) or not isinstance(count, int):
            raise WireError("body.interfaces must be an integer")
        if not 1 <= count <= MAX_INTERFACES:
            raise WireError(f"body.interfaces must be 1-{MAX_INTERFACES}")
        return cls(count)

    def to_json(self) -> dict[str, object]:
        return {"interfaces": self.interfaces}
