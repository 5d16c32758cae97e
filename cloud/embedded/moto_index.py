"""Indexes over moto's EC2 state, so that a lookup costs what it looks at rather than the account.

moto 5.2.5 keeps every ENI of an account and Region in one dict (`NetworkInterfaceBackend.enis`) and
every instance in its reservations, and finds an ENI by ID, an instance by ID, or the ENIs of one
subnet by scanning all of them (`get_instance` even copies every reservation first). Our extension
asks for a subnet's ENIs on every address it assigns (`cloud.embedded.eni_rules.subnet_space`), so
with many nodes in one account each request cost grew with the account, and a cluster's run time
with the square of its size. The indexes here change no answer; they only find the same objects
faster:

- `EniTable` replaces each backend's `enis` dict (same keys, values and order) and keeps, on every
  insertion and removal, the ENIs by subnet ID, the ENIs whose status is `available` and the
  attached ENIs by attachment ID;
- `NetworkInterface.status` becomes a property over the same attribute that tells the table when
  it changes (moto sets it on creation, and on attach and detach after the attachment ID);
- `get_network_interface` reads the dict instead of scanning it, and `detach_network_interface`
  finds the attachment in the index (and refuses an ID the index lacks with moto's own error);
- `get_instance` keeps instances by ID once found (moto never removes an instance from its
  reservation, terminated ones included), scanning as moto does only for an ID it has not seen.

`install()` is called by `cloud.embedded.moto_ext.install`, under its lock and once per process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from moto.ec2.exceptions import InvalidNetworkAttachmentIdError, LastEniDetachError
from moto.ec2.models.elastic_network_interfaces import NetworkInterface, NetworkInterfaceBackend
from moto.ec2.models.instances import InstanceBackend

from cloud.embedded import space_watch

AVAILABLE = "available"
_INSTANCES_ATTR = "_ipamd_instances_by_id"
_ATTACHMENT_ATTR = "_ipamd_indexed_attachment"
"""On an ENI: the attachment ID the table indexed it under."""


def _subnet_id(eni: Any) -> str | None:
    subnet = getattr(eni, "subnet", None)
    return None if subnet is None else str(subnet.id)


class EniTable(dict[str, Any]):
    """`NetworkInterfaceBackend.enis`, indexed by subnet and by `available` status. Every way of
    adding or removing an entry goes through `_added` / `_removed`."""

    def __init__(self, items: Iterable[tuple[str, Any]] = ()) -> None:
        super().__init__()
        self._by_subnet: dict[str | None, dict[str, Any]] = {}
        self._available: dict[str, Any] = {}
        self._attachments: dict[str, Any] = {}
        """Attachment ID -> the ENI it attaches, for every ENI with an attachment."""
        self._rank: dict[str, int] = {}
        """Each key's place in the dict's own order (insertion order)."""
        self._next_rank = 0
        for key, eni in items:
            self[key] = eni

    def in_subnet(self, subnet_id: str) -> list[Any]:
        """The subnet's ENIs, in the order they were added (the order a scan of the dict gives)."""
        return list(self._by_subnet.get(subnet_id, {}).values())

    def available(self) -> list[Any]:
        """ENIs whose status is `available` (attached to nothing), in the dict's order."""
        return [self._available[k] for k in sorted(self._available, key=self._rank.__getitem__)]

    def attached_by(self, attachment_id: str) -> Any | None:
        """The ENI `attachment_id` attaches, if the index knows it (and it still does)."""
        eni = self._attachments.get(attachment_id)
        return eni if eni is not None and eni.attachment_id == attachment_id else None

    def status_changed(self, eni: Any) -> None:
        key = str(eni.id)
        if self.get(key) is eni:
            self._index_status(key, eni)

    def _index_status(self, key: str, eni: Any) -> None:
        if eni.__dict__.get("status") == AVAILABLE:
            self._available.setdefault(key, eni)
        else:
            self._available.pop(key, None)
        self._unindex_attachment(eni)
        attachment_id = eni.__dict__.get("attachment_id")
        if attachment_id is not None:
            self._attachments[attachment_id] = eni
            eni.__dict__[_ATTACHMENT_ATTR] = attachment_id

    def _unindex_attachment(self, eni: Any) -> None:
        old = eni.__dict__.pop(_ATTACHMENT_ATTR, None)
        if old is not None and self._attachments.get(old) is eni:
            del self._attachments[old]

    def _added(self, key: str, eni: Any) -> None:
        if key not in self._rank:
            self._rank[key] = self._next_rank
            self._next_rank += 1
        self._by_subnet.setdefault(_subnet_id(eni), {})[key] = eni
        self._index_status(key, eni)
        space_watch.touch(getattr(eni, "subnet", None))

    def _removed(self, key: str, eni: Any) -> None:
        subnet_id = _subnet_id(eni)
        members = self._by_subnet.get(subnet_id)
        if members is not None:
            members.pop(key, None)
            if not members:
                del self._by_subnet[subnet_id]
        self._available.pop(key, None)
        self._unindex_attachment(eni)
        self._rank.pop(key, None)
        space_watch.touch(getattr(eni, "subnet", None))

    def __setitem__(self, key: str, eni: Any) -> None:
        old = self.get(key)
        if old is not None and old is not eni:
            rank = self._rank[key]
            self._removed(key, old)
            self._rank[key] = rank  # a replaced value keeps its key's place, as in a dict
        super().__setitem__(key, eni)
        self._added(key, eni)

    def __delitem__(self, key: str) -> None:
        eni = self[key]
        super().__delitem__(key)
        self._removed(key, eni)

    def pop(self, key: str, *default: Any) -> Any:
        if key not in self:
            if default:
                return default[0]
            raise KeyError(key)
        eni = super().pop(key)
        self._removed(key, eni)
        return eni

    def popitem(self) -> tuple[str, Any]:
        key, eni = super().popitem()
        self._removed(key, eni)
        return key, eni

    def clear(self) -> None:
        super().clear()
        self._by_subnet.clear()
        self._available.clear()
        self._attachments.clear()
        self._rank.clear()

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, eni in dict(*args, **kwargs).items():
            self[key] = eni

    def __ior__(self, other: Any) -> EniTable:  # type: ignore[override,misc]
        self.update(other)
        return self

    def __reduce__(self) -> Any:
        return (EniTable, (list(self.items()),))


def table(backend: Any) -> EniTable | None:
    """The backend's indexed ENI table; None if something replaced it with a plain dict."""
    enis = getattr(backend, "enis", None)
    return enis if isinstance(enis, EniTable) else None


def subnet_enis(subnet: Any) -> list[Any]:
    """The ENIs in `subnet`, as a scan of the backend's ENIs in order would find them."""
    backend = subnet.ec2_backend
    indexed = table(backend)
    if indexed is not None:
        return indexed.in_subnet(subnet.id)
    return [eni for eni in list(backend.enis.values()) if eni.subnet.id == subnet.id]


def attached_eni(backend: Any, attachment_id: str) -> Any | None:
    """The ENI `attachment_id` attaches, as a scan of the backend's ENIs would find it."""
    indexed = table(backend)
    if indexed is not None:
        # Complete: moto sets an attachment ID in one place (`Instance.attach_eni`), just before
        # the status the table hears of.
        return indexed.attached_by(attachment_id)
    return next((e for e in list(backend.enis.values()) if e.attachment_id == attachment_id), None)


def available_enis(backend: Any) -> list[Any]:
    """The backend's ENIs with status `available`, as a scan would find them."""
    indexed = table(backend)
    if indexed is not None:
        return indexed.available()
    return [eni for eni in list(backend.enis.values()) if eni.status == AVAILABLE]


# -- patches -----------------------------------------------------------------------------------


def _status_get(eni: Any) -> Any:
    try:
        return eni.__dict__["status"]
    except KeyError:
        raise AttributeError("status") from None


def _status_set(eni: Any, value: Any) -> None:
    eni.__dict__["status"] = value
    indexed = table(eni.__dict__.get("ec2_backend"))
    if indexed is not None:
        indexed.status_changed(eni)


def _backend_init(original: Callable[..., None]) -> Callable[..., None]:
    def init(backend: Any) -> None:
        original(backend)
        backend.enis = EniTable(backend.enis.items())

    return init


def _get_network_interface(original: Callable[..., Any]) -> Callable[..., Any]:
    def get_network_interface(backend: Any, eni_id: str) -> Any:
        eni = backend.enis.get(eni_id)
        if eni is not None and eni.id == eni_id:
            return eni
        return original(backend, eni_id)  # raises moto's own not-found error

    return get_network_interface


def _detach_network_interface(original: Callable[..., None]) -> Callable[..., None]:
    """moto's own steps (its last-ENI rule, then the instance's detach) on the indexed ENI."""

    def detach_network_interface(backend: Any, attachment_id: str) -> None:
        eni = attached_eni(backend, attachment_id)
        if eni is None and table(backend) is not None:
            raise InvalidNetworkAttachmentIdError(attachment_id)  # moto's own, without its scan
        if eni is None or eni.instance is None:
            original(backend, attachment_id)
            return
        if len(eni.instance.nics) == 1:
            raise LastEniDetachError
        eni.instance.detach_eni(eni)

    return detach_network_interface


def _get_instance(original: Callable[..., Any]) -> Callable[..., Any]:
    def get_instance(backend: Any, instance_id: str) -> Any:
        known: dict[str, Any] = backend.__dict__.setdefault(_INSTANCES_ATTR, {})
        instance = known.get(instance_id)
        if instance is not None:
            return instance
        instance = original(backend, instance_id)  # moto's scan; raises for an unknown ID
        known.update(_instances(backend))
        return instance

    return get_instance


def _instances(backend: Any) -> Iterator[tuple[str, Any]]:
    for reservation in list(backend.reservations.values()):
        for instance in reservation.instances:
            yield instance.id, instance


def install() -> None:
    """Put the indexes in place (see the module docstring). Call once, before any backend exists
    or with none holding ENIs yet (existing backends keep their plain dict and are scanned), and
    before `cloud.embedded.moto_ext` wraps the same methods."""
    NetworkInterfaceBackend.__init__ = _backend_init(  # type: ignore[method-assign]
        NetworkInterfaceBackend.__init__
    )
    NetworkInterfaceBackend.get_network_interface = _get_network_interface(  # type: ignore[method-assign]
        NetworkInterfaceBackend.get_network_interface
    )
    NetworkInterfaceBackend.detach_network_interface = _detach_network_interface(  # type: ignore[method-assign]
        NetworkInterfaceBackend.detach_network_interface
    )
    InstanceBackend.get_instance = _get_instance(  # type: ignore[method-assign]
        InstanceBackend.get_instance
    )
    setattr(NetworkInterface, "status", property(_status_get, _status_set))  # noqa: B010
