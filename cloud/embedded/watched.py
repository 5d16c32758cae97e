"""Containers that call a hook after every change to them (nothing else differs from `list` and
`dict`): how `cloud.embedded.space_watch` hears of a change where a subnet's addresses live, and the
cluster simulator of a change to the ENIs an engine holds back (`bench.cluster.waiting`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, SupportsIndex


class WatchedList(list[Any]):
    """A list that calls `on_change` after any change to it, and counts them (`changes`)."""

    def __init__(self, items: Iterable[Any], on_change: Callable[[], None]) -> None:
        super().__init__(items)
        self._changed = on_change
        self.changes = 0

    def _bump(self) -> None:
        self.changes += 1
        self._changed()

    def append(self, item: Any) -> None:
        super().append(item)
        self._bump()

    def extend(self, items: Iterable[Any]) -> None:
        super().extend(items)
        self._bump()

    def insert(self, index: SupportsIndex, item: Any) -> None:
        super().insert(index, item)
        self._bump()

    def remove(self, item: Any) -> None:
        super().remove(item)
        self._bump()

    def pop(self, index: SupportsIndex = -1) -> Any:
        item = super().pop(index)
        self._bump()
        return item

    def clear(self) -> None:
        super().clear()
        self._bump()

    def __setitem__(self, index: Any, value: Any) -> None:
        super().__setitem__(index, value)
        self._bump()

    def __delitem__(self, index: Any) -> None:
        super().__delitem__(index)
        self._bump()

    def __iadd__(self, items: Iterable[Any]) -> WatchedList:  # type: ignore[misc]
        super().__iadd__(items)
        self._bump()
        return self

    def __imul__(self, times: SupportsIndex) -> WatchedList:
        super().__imul__(times)
        self._bump()
        return self


class WatchedDict(dict[str, Any]):
    """A dict that calls `on_change` after any change to it, and counts them (`changes`)."""

    def __init__(self, items: Mapping[str, Any], on_change: Callable[[], None]) -> None:
        super().__init__(items)
        self._changed = on_change
        self.changes = 0

    def _bump(self) -> None:
        self.changes += 1
        self._changed()

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        self._bump()

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        self._bump()

    def pop(self, key: str, *default: Any) -> Any:
        found = super().pop(key, *default)
        self._bump()
        return found

    def popitem(self) -> tuple[str, Any]:
        item = super().popitem()
        self._bump()
        return item

    def setdefault(self, key: str, default: Any = None) -> Any:
        found = super().setdefault(key, default)
        self._bump()
        return found

    def update(self, *args: Any, **kwargs: Any) -> None:
        super().update(*args, **kwargs)
        self._bump()

    def clear(self) -> None:
        super().clear()
        self._bump()

    def __ior__(self, other: Any) -> WatchedDict:  # type: ignore[override, misc]
        super().__ior__(other)
        self._bump()
        return self
