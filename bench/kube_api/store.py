"""The test API server's storage (`bench.kube_api.server` serves it; `kinds` says what it stores and
how lists select): a store with the real server's bookkeeping.

- One cluster-wide revision counter, as etcd's: every create, update and delete takes the next
  one, and it becomes the object's `metadata.resourceVersion` (a string) and the change's. A list
  answers the counter as it was when the list was taken.
- A history of the last `history_window` changes. A watch from a resourceVersion inside it replays
  the changes after that version; one from before it (`compacted`) is gone: 410. `compact()` makes
  every version seen so far too old, as a compaction does.
- Watchers are told of every change under the store's lock (a thread-safe callback each), so a
  watch registered while taking its snapshot misses nothing and sees nothing twice.
- Stored objects are never mutated: a change stores a new dict, so a snapshot may be read after
  the lock is released.
- Bulk populations (`Bulk`): many objects generated from their index on demand, never held. They
  take a range of revisions, one change in the history and one in each watcher's queue, expanded
  only for a watch or list that asks for them. A write to one of them moves it into the store.

Thread-safe: the server may run on a loop in another thread while a test seeds it.
"""

from __future__ import annotations

import itertools
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

from bench.kube_api.kinds import KINDS, Key, Kind, Obj, Scope


@dataclass(slots=True)
class Bulk:
    """`count` objects of one kind made from their index on demand (`bench.kube_api.objects` makes
    the builders): object `i` has resourceVersion `first_rv + i`, and a name that says `i`."""

    kind: Kind
    count: int
    build: Callable[[int, int], Obj]
    """(index, resourceVersion) -> the object."""
    encode: Callable[[int, int], bytes]
    """(index, resourceVersion) -> the object's JSON, without building it (as fast as a template)."""
    key_of: Callable[[int], Key]
    index_of_name: Callable[[str], int | None]
    node_range: Callable[[str], range] | None = None
    """For pods: the indices bound to a node (spec.nodeName), so that a selector by node is cheap."""
    first_rv: int = 0
    hidden: set[int] = field(default_factory=set)
    """Indices moved into the store by a write, or deleted."""

    def obj(self, index: int) -> Obj:
        return self.build(index, self.first_rv + index)

    def index_of(self, key: Key) -> int | None:
        index = self.index_of_name(key[1])
        return index if index is not None and self.key_of(index) == key else None

    def candidates(self, scope: Scope) -> Iterable[int]:
        node = scope.fields.equals("spec.nodeName")
        if node is not None and self.node_range is not None:
            return self.node_range(node)
        name = scope.fields.equals("metadata.name")
        if name is not None:
            index = self.index_of_name(name)
            return [] if index is None else [index]
        return range(self.count)

    def _by_candidates(self, scope: Scope) -> bool:
        """Whether every candidate of the scope matches it but for its namespace."""
        if scope.labels.terms or len(scope.fields.terms) > 1:
            return False
        return all(
            eq and (f == "metadata.name" or (f == "spec.nodeName" and self.node_range is not None))
            for f, _, eq in scope.fields.terms
        )

    def select(
        self, scope: Scope, *, skip: frozenset[int] | None = None, since: int | None = None
    ) -> Iterator[Obj | bytes]:
        """The matching objects (as JSON when no field needs reading), but for the indices in
        `skip` and those at or before revision `since`."""
        encoded = self._by_candidates(scope)
        for index in self.candidates(scope):
            rv = self.first_rv + index
            if (skip is not None and index in skip) or (since is not None and rv <= since):
                continue
            if encoded:
                if not scope.namespace or self.key_of(index)[0] == scope.namespace:
                    yield self.encode(index, rv)
            elif scope.matches(obj := self.build(index, rv)):
                yield obj


@dataclass(frozen=True, slots=True)
class Change:
    """One stored change: type ADDED, MODIFIED or DELETED; `old` is the object before it."""

    rv: int
    kind: Kind
    type: str
    obj: Obj
    old: Obj | None = None


@dataclass(frozen=True, slots=True)
class BulkAdded:
    """A bulk population's creation, one entry standing for its `count` ADDED changes."""

    rv: int
    """The last of its revisions."""
    bulk: Bulk
    hidden: frozenset[int] | None = None
    """For a watch's first state: the indices no longer served from the population then."""

    @property
    def kind(self) -> Kind:
        return self.bulk.kind


Entry = Change | BulkAdded


class StoreError(Exception):
    """A refusal: status and reason as the Status answers them (404 NotFound, 409 Conflict or
    AlreadyExists, 410 Expired/Gone)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message


@dataclass(eq=False, slots=True)
class Watcher:
    scope: Scope
    deliver: Callable[[object], object]
    """Called under the store's lock with each Entry, and with whatever `notify` is given."""


def timestamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Store:
    def __init__(
        self, history_window: int = 1000, admit: Callable[[Obj], Obj] | None = None
    ) -> None:
        self.lock = threading.RLock()
        self.revision = 0
        self.compacted = 0
        """A watch from a resourceVersion below this is gone (410)."""
        self.history_window = history_window
        self._admit = admit or (lambda obj: obj)
        self._objects: dict[Kind, dict[Key, Obj]] = {k: {} for k in KINDS.values()}
        self._bulks: dict[Kind, list[Bulk]] = {k: [] for k in KINDS.values()}
        self._history: deque[Entry] = deque()
        self._watchers: set[Watcher] = set()
        self._names = itertools.count(1)

    # -- changes ------------------------------------------------------------------------------------

    def _record(self, entry: Entry) -> None:
        self._history.append(entry)
        while len(self._history) > self.history_window:
            self.compacted = max(self.compacted, self._history.popleft().rv)
        for watcher in list(self._watchers):
            if watcher.scope.kind == entry.kind:
                watcher.deliver(entry)

    def _key(self, kind: Kind, obj: Obj) -> Key:
        meta = obj.get("metadata") or {}
        return (meta.get("namespace", "") if kind.namespaced else "", meta.get("name", ""))

    def _find(self, kind: Kind, key: Key) -> tuple[Obj | None, Bulk | None, int]:
        if key in self._objects[kind]:
            return self._objects[kind][key], None, -1
        for bulk in self._bulks[kind]:
            index = bulk.index_of(key)
            if index is not None and index not in bulk.hidden:
                return bulk.obj(index), bulk, index
        return None, None, -1

    def create(self, kind: Kind, obj: Obj, *, admit: bool = True) -> Obj:
        obj = dict(obj, apiVersion=kind.api_version, kind=kind.kind)
        meta = dict(obj.get("metadata") or {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = f"{meta['generateName']}{next(self._names):05x}"
        obj["metadata"] = meta
        with self.lock:
            key = self._key(kind, obj)
            if self._find(kind, key)[0] is not None:
                raise StoreError(409, "AlreadyExists", f'{kind.plural} "{key[1]}" already exists')
            stored = self._admit(obj) if admit else obj
            self.revision += 1
            rv = self.revision
            stored["metadata"] = dict(
                stored["metadata"],
                resourceVersion=str(rv),
                uid=str(uuid.uuid5(uuid.NAMESPACE_OID, f"ipamd-test-kube-api/{rv}")),
                creationTimestamp=meta.get("creationTimestamp") or timestamp(),
            )
            self._objects[kind][key] = stored
            self._record(Change(rv, kind, "ADDED", stored))
            return stored

    def get(self, kind: Kind, key: Key) -> Obj | None:
        with self.lock:
            return self._find(kind, key)[0]

    def update(
        self, kind: Kind, key: Key, change: Callable[[Obj], Obj], *, admit: bool = True
    ) -> Obj:
        """The object after `change` (given the current one, returning a new one) is stored. A
        resourceVersion the new object names is a precondition: another one is 409 Conflict."""
        with self.lock:
            current, bulk, index = self._find(kind, key)
            if current is None:
                raise StoreError(404, "NotFound", f'{kind.plural} "{key[1]}" not found')
            new = change(current)
            meta = dict(new.get("metadata") or {})
            asked = meta.get("resourceVersion")
            if asked and asked != current["metadata"]["resourceVersion"]:
                raise StoreError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {kind.plural} "{key[1]}": the object has '
                    "been modified; please apply your changes to the latest version and try again",
                )
            for owned in ("uid", "creationTimestamp", "name", "namespace"):
                if owned in current["metadata"]:
                    meta[owned] = current["metadata"][owned]
            meta["resourceVersion"] = current["metadata"]["resourceVersion"]
            new = dict(new, apiVersion=kind.api_version, kind=kind.kind, metadata=meta)
            stored = self._admit(new) if admit else new
            if stored == current:
                return current  # no change: no new revision, no event (as the real server)
            self.revision += 1
            stored["metadata"] = dict(stored["metadata"], resourceVersion=str(self.revision))
            if bulk is not None:
                bulk.hidden.add(index)
            self._objects[kind][key] = stored
            self._record(Change(self.revision, kind, "MODIFIED", stored, current))
            return stored

    def delete(self, kind: Kind, key: Key) -> Obj:
        with self.lock:
            current, bulk, index = self._find(kind, key)
            if current is None:
                raise StoreError(404, "NotFound", f'{kind.plural} "{key[1]}" not found')
            if bulk is not None:
                bulk.hidden.add(index)
            self._objects[kind].pop(key, None)
            self.revision += 1
            gone = dict(
                current, metadata=dict(current["metadata"], resourceVersion=str(self.revision))
            )
            self._record(Change(self.revision, kind, "DELETED", gone, current))
            return gone

    def add_bulk(self, bulk: Bulk) -> None:
        with self.lock:
            bulk.first_rv = self.revision + 1
            self.revision += bulk.count
            self._bulks[bulk.kind].append(bulk)
            self._record(BulkAdded(self.revision, bulk))

    def compact(self) -> int:
        """Forgets the history: every resourceVersion seen so far is too old to watch from."""
        with self.lock:
            self._history.clear()
            self.compacted = self.revision
            return self.compacted

    # -- reads --------------------------------------------------------------------------------------

    def snapshot(self, scope: Scope) -> tuple[int, Iterator[Obj | bytes]]:
        """The revision of the snapshot and its matching objects (bulk ones generated lazily, as
        JSON when they need not be built to be matched)."""
        with self.lock:
            rv = self.revision
            stored = sorted(self._objects[scope.kind].items())
            bulks = [(b, frozenset(b.hidden)) for b in self._bulks[scope.kind] if b.first_rv <= rv]
        return rv, self._listed(scope, [o for _, o in stored], bulks)

    @staticmethod
    def _listed(
        scope: Scope, stored: list[Obj], bulks: list[tuple[Bulk, frozenset[int]]]
    ) -> Iterator[Obj | bytes]:
        yield from (o for o in stored if scope.matches(o))
        for bulk, hidden in bulks:
            yield from bulk.select(scope, skip=hidden)

    def objects(self, kind: Kind) -> list[Obj]:
        """The kind's stored objects (not its bulk ones), by key."""
        with self.lock:
            return [o for _, o in sorted(self._objects[kind].items())]

    def watch(self, watcher: Watcher, since: int | None) -> tuple[int, list[Entry]]:
        """Registers the watcher and answers the current revision and what the watcher must be
        sent first: the changes after `since`, or, when `since` is None, every matching object as
        ADDED. A `since` older than the history is gone (StoreError 410)."""
        with self.lock:
            if since is not None and since < self.compacted:
                raise StoreError(
                    410, "Expired", f"too old resource version: {since} ({self.compacted})"
                )
            if since is None:
                first: list[Entry] = [
                    Change(int(o["metadata"]["resourceVersion"]), watcher.scope.kind, "ADDED", o)
                    for o in self._objects[watcher.scope.kind].values()
                    if watcher.scope.matches(o)
                ]
                first += [
                    BulkAdded(b.first_rv + b.count - 1, b, frozenset(b.hidden))
                    for b in self._bulks[watcher.scope.kind]
                ]
            else:
                first = [e for e in self._history if e.kind == watcher.scope.kind and e.rv > since]
            self._watchers.add(watcher)
            return self.revision, first

    def unwatch(self, watcher: Watcher) -> None:
        with self.lock:
            self._watchers.discard(watcher)

    def notify(
        self, make: Callable[[int], object], predicate: Callable[[Watcher], bool] = lambda w: True
    ) -> int:
        """Hands `make(current revision)` to every watcher the predicate picks, after every change
        already handed to it (a bookmark, an order to end). Answers how many it reached."""
        with self.lock:
            picked = [w for w in self._watchers if predicate(w)]
            for watcher in picked:
                watcher.deliver(make(self.revision))
            return len(picked)

    def watcher_count(self, predicate: Callable[[Watcher], bool] = lambda w: True) -> int:
        with self.lock:
            return sum(1 for w in self._watchers if predicate(w))


def watch_events(
    entry: Entry, scope: Scope, since: int | None = None
) -> Iterator[tuple[str, Obj | bytes]]:
    """What a watch of `scope` is sent for an entry, as the real server's watch cache filters by
    selector: a change that makes an object match is ADDED, one that makes it stop matching is
    DELETED (carrying the object as it is now), one that keeps it matching is MODIFIED; changes
    at or before `since` are not sent."""
    if isinstance(entry, BulkAdded):
        for obj in entry.bulk.select(scope, skip=entry.hidden, since=since):
            yield "ADDED", obj
        return
    now = scope.matches(entry.obj)
    before = entry.old is not None and scope.matches(entry.old)
    if entry.type == "ADDED" and now:
        yield "ADDED", entry.obj
    elif entry.type == "MODIFIED" and (now or before):
        yield ("MODIFIED" if before else "ADDED") if now else "DELETED", entry.obj
    elif entry.type == "DELETED" and before:
        yield "DELETED", entry.obj
