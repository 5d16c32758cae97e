"""A subnet's space is kept while nothing it is made of changed (`cloud.embedded.space_watch`), and
worked out again after any change to where its addresses live: an ENI's address list or prefixes,
moto's `Subnet._subnet_ips`, an ENI that comes or goes. (That the kept space equals a fresh scan
through every EC2 call that changes addresses: `test_moto_index`.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from cloud.embedded import eni_rules, space_watch
from cloud.embedded.watched import WatchedList
from cloud.embedded.world import World
from tests.contract.conftest import NO_RETRIES


def _kept(subnet: Any) -> frozenset[int]:
    return eni_rules._kept_space(subnet)[1]


def test_the_space_is_kept_while_nothing_changed(world: World) -> None:
    ec2 = world.client(NO_RETRIES)
    backend = world.backend()
    eni = ec2.create_network_interface(SubnetId=world.subnet_id, SecondaryPrivateIpAddressCount=2)
    subnet = backend.get_subnet(world.subnet_id)
    first = _kept(subnet)
    ec2.describe_subnets(SubnetIds=[world.subnet_id])
    ec2.describe_network_interfaces(
        NetworkInterfaceIds=[eni["NetworkInterface"]["NetworkInterfaceId"]]
    )
    assert _kept(subnet) is first  # reads change nothing: the same object, not worked out again
    drawn = eni_rules.subnet_space(subnet)
    drawn.occupied.add(drawn.first_usable)  # the caller's copy: drawing from it keeps nothing
    assert _kept(subnet) is first


CHANGES: dict[str, Callable[[Any, Any], None]] = {
    "append": lambda eni, _: eni.private_ip_addresses.append(
        {"Primary": False, "PrivateIpAddress": "10.0.200.1"}
    ),
    "extend": lambda eni, _: eni.private_ip_addresses.extend(
        [{"Primary": False, "PrivateIpAddress": "10.0.200.2"}]
    ),
    "insert": lambda eni, _: eni.private_ip_addresses.insert(
        1, {"Primary": False, "PrivateIpAddress": "10.0.200.3"}
    ),
    "remove": lambda eni, _: eni.private_ip_addresses.remove(eni.private_ip_addresses[-1]),
    "pop": lambda eni, _: eni.private_ip_addresses.pop(),
    "setitem": lambda eni, _: eni.private_ip_addresses.__setitem__(
        -1, {"Primary": False, "PrivateIpAddress": "10.0.200.4"}
    ),
    "delitem": lambda eni, _: eni.private_ip_addresses.__delitem__(-1),
    "iadd": lambda eni, _: eni.private_ip_addresses.__iadd__(
        [{"Primary": False, "PrivateIpAddress": "10.0.200.5"}]
    ),
    "new list": lambda eni, _: setattr(eni, "private_ip_addresses", eni.private_ip_addresses[:1]),
    "prefix": lambda eni, _: eni_rules.eni_prefixes(eni).append("10.0.201.0/28"),
    "subnet_ips set": lambda _, subnet: subnet._subnet_ips.__setitem__("10.0.202.1", None),
    "subnet_ips pop": lambda _, subnet: subnet._subnet_ips.pop(next(iter(subnet._subnet_ips))),
    "subnet_ips update": lambda _, subnet: subnet._subnet_ips.update({"10.0.202.2": None}),
    "eni gone": lambda eni, _: eni.ec2_backend.enis.pop(eni.id),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_any_change_where_addresses_live_moves_the_generation(world: World, change: str) -> None:
    ec2 = world.client(NO_RETRIES)
    backend = world.backend()
    made = ec2.create_network_interface(SubnetId=world.subnet_id, SecondaryPrivateIpAddressCount=2)
    eni = backend.enis[made["NetworkInterface"]["NetworkInterfaceId"]]
    subnet = backend.get_subnet(world.subnet_id)
    assert isinstance(eni.private_ip_addresses, WatchedList)
    before, kept = space_watch.generation(subnet), _kept(subnet)
    CHANGES[change](eni, subnet)
    assert space_watch.generation(subnet) > before
    assert _kept(subnet) == eni_rules._occupied(subnet) and _kept(subnet) is not kept


def test_an_eni_that_enters_the_table_moves_the_generation(world: World) -> None:
    ec2 = world.client(NO_RETRIES)
    backend = world.backend()
    made = ec2.create_network_interface(SubnetId=world.subnet_id, SecondaryPrivateIpAddressCount=2)
    subnet = backend.get_subnet(world.subnet_id)
    eni = backend.enis.pop(made["NetworkInterface"]["NetworkInterfaceId"])
    before = space_watch.generation(subnet)
    backend.enis[eni.id] = eni  # its addresses come back with it, their list untouched
    assert space_watch.generation(subnet) > before
    assert _kept(subnet) == eni_rules._occupied(subnet)
