"""A generation per subnet that moves whenever the addresses the subnet has in use may have changed,
so that its space (`cloud.embedded.eni_rules.subnet_space`) is worked out again only then.

A subnet's space is every address of every ENI in it, every address of their delegated prefixes, and
what moto set aside in `Subnet._subnet_ips`. Working it out reads all of them, and DescribeSubnets
(AvailableIpAddressCount) and every address drawn need it: with many nodes to a VPC, each node's
periodic subnet read cost what the VPC holds. Every place those addresses live is watched here
instead of every place that changes them:

- `NetworkInterface.private_ip_addresses` becomes a property whose value is a `WatchedList`
  (`cloud.embedded.watched`): any change to the list, or a new list, moves the generation of the
  ENI's subnet;
- the ENI's delegated prefixes (`eni_rules.eni_prefixes`) are a `WatchedList` too;
- `Subnet._subnet_ips` becomes a property whose value is a `WatchedDict`;
- an ENI that enters or leaves the account's table (`moto_index.EniTable`) moves its subnet's.

The entries of the address list are moto's `{"Primary", "PrivateIpAddress"}` dicts, which nothing
changes in place once listed. `install()` is called by `cloud.embedded.moto_ext.install`, under its
lock and once per process, before any ENI or subnet exists.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable
from typing import Any

from moto.ec2.models.elastic_network_interfaces import NetworkInterface
from moto.ec2.models.subnets import Subnet

from cloud.embedded.subnet_space import SubnetSpace
from cloud.embedded.watched import WatchedDict, WatchedList

GENERATION_ATTR = "_ipamd_space_generation"
"""On a subnet: how many times its addresses in use may have changed."""
_ADDRESSES = "private_ip_addresses"
_SUBNET_IPS = "_ipamd_subnet_ips"


def generation(subnet: Any) -> int:
    """The subnet's generation: equal at two reads only if nothing in use changed between them."""
    return int(subnet.__dict__.get(GENERATION_ATTR, 0))


Kept = tuple[ipaddress.IPv4Network, frozenset[int], int]
"""A subnet's network, its addresses in use (as integers) and how many it has free."""
_KEPT_ATTR = "_ipamd_space"
"""On a subnet: (generation, CIDR, `Kept`) when its space was last worked out."""


def kept_space(subnet: Any, occupied: Callable[[], set[int]], *, indexed: bool) -> Kept:
    """The subnet's space, from `occupied()` (which reads every address the subnet has in use) only
    when its generation moved since the last time, or its ENIs are not indexed (`indexed`: the
    account's ENI table is what tells the generation of an ENI that comes or goes)."""
    cidr, now = str(subnet.cidr_block), generation(subnet)
    kept = subnet.__dict__.get(_KEPT_ATTR)
    if indexed and kept is not None and kept[0] == now and kept[1] == cidr:
        found: Kept = kept[2]
        return found
    space = SubnetSpace(ipaddress.IPv4Network(cidr), occupied())
    found = (space.network, frozenset(space.occupied), space.free_count())
    subnet.__dict__[_KEPT_ATTR] = (now, cidr, found)
    return found


def touch(subnet: Any) -> None:
    """The subnet's addresses in use may have changed (anything but a moto subnet is ignored: an ENI
    names its subnet by ID for a moment while it is made)."""
    if isinstance(subnet, Subnet):
        subnet.__dict__[GENERATION_ATTR] = generation(subnet) + 1


def _subnet_of(owner: Any) -> Callable[[], None]:
    """The hook of an ENI's list: touch the ENI's subnet at that moment."""
    return lambda: touch(getattr(owner, "subnet", None))


def watched_list(owner: Any, attr: str) -> WatchedList:
    """`owner.__dict__[attr]` as a `WatchedList` (made one if it is not; the subnet is touched if
    that list held anything)."""
    value = owner.__dict__.get(attr)
    if type(value) is not WatchedList:
        held = bool(value)
        value = WatchedList(value or (), _subnet_of(owner))
        owner.__dict__[attr] = value
        if held:
            touch(getattr(owner, "subnet", None))
    return value


def _addresses_get(eni: Any) -> WatchedList:
    if _ADDRESSES not in eni.__dict__:
        raise AttributeError(_ADDRESSES)
    return watched_list(eni, _ADDRESSES)


def _addresses_set(eni: Any, value: Iterable[Any]) -> None:
    eni.__dict__[_ADDRESSES] = WatchedList(value, _subnet_of(eni))
    touch(getattr(eni, "subnet", None))


def _subnet_ips_get(subnet: Any) -> WatchedDict:
    try:
        value: WatchedDict = subnet.__dict__[_SUBNET_IPS]
    except KeyError:
        raise AttributeError("_subnet_ips") from None
    return value


def _subnet_ips_set(subnet: Any, value: dict[str, Any]) -> None:
    subnet.__dict__[_SUBNET_IPS] = WatchedDict(value, lambda: touch(subnet))
    touch(subnet)


def install() -> None:
    """Put the watches in place (see the module docstring)."""
    setattr(NetworkInterface, _ADDRESSES, property(_addresses_get, _addresses_set))
    setattr(Subnet, "_subnet_ips", property(_subnet_ips_get, _subnet_ips_set))  # noqa: B010
