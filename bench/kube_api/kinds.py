"""The kinds the test API server (`bench.kube_api`) knows, and the field and label selectors of its
lists and watches, as the real server reads them: a field selector names only the fields the kind
allows (an unsupported one is 400), a missing boolean field reads as "false".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]
Key = tuple[str, str]
"""(namespace, name); the namespace is "" for a cluster-scoped kind."""


@dataclass(frozen=True, slots=True)
class Kind:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    fields: frozenset[str] = frozenset()
    """The fields a field selector may name beyond metadata.name and metadata.namespace."""
    status_subresource: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


POD_FIELDS = frozenset(
    {
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    }
)
EVENT_FIELDS = frozenset(
    {
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    }
)
NODES = Kind("", "v1", "nodes", "Node", False, frozenset({"spec.unschedulable"}), True)
PODS = Kind("", "v1", "pods", "Pod", True, POD_FIELDS, True)
EVENTS = Kind("", "v1", "events", "Event", True, EVENT_FIELDS)
EVENTS_V1 = Kind(
    "events.k8s.io",
    "v1",
    "events",
    "Event",
    True,
    frozenset({"regarding.kind", "regarding.namespace", "regarding.name", "reason", "type"}),
)
ENICONFIGS = Kind("crd.k8s.amazonaws.com", "v1alpha1", "eniconfigs", "ENIConfig", False)
KINDS = {(k.group, k.version, k.plural): k for k in (NODES, PODS, EVENTS, EVENTS_V1, ENICONFIGS)}

FIELD_DEFAULTS = {"spec.hostNetwork": "false", "spec.unschedulable": "false"}
FIELD_PATHS = {"source": "source.component"}


class SelectorError(ValueError):
    """A selector the server refuses: 400 BadRequest."""


def field_value(obj: Obj, name: str) -> str:
    node: Any = obj
    for part in FIELD_PATHS.get(name, name).split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if node is None:
        return FIELD_DEFAULTS.get(name, "")
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


@dataclass(frozen=True, slots=True)
class FieldSelector:
    terms: tuple[tuple[str, str, bool], ...] = ()
    """(field, value, equal): `field=value` / `field==value` when equal, `field!=value` when not."""

    @classmethod
    def parse(cls, text: str, kind: Kind) -> FieldSelector:
        terms = []
        for term in filter(None, (t.strip() for t in text.split(","))):
            match = re.fullmatch(r"([^=!]+)(!=|==|=)(.*)", term)
            if match is None:
                raise SelectorError(f"invalid selector: '{text}'; can't understand '{term}'")
            name, op, value = match.groups()
            if name not in kind.fields | {"metadata.name", "metadata.namespace"}:
                raise SelectorError(f"field label not supported: {name}")
            terms.append((name, value, op != "!="))
        return cls(tuple(terms))

    def matches(self, obj: Obj) -> bool:
        return all((field_value(obj, f) == v) == eq for f, v, eq in self.terms)

    def equals(self, name: str) -> str | None:
        """The value this selector requires of a field, if it requires one."""
        return next((v for f, v, eq in self.terms if f == name and eq), None)


@dataclass(frozen=True, slots=True)
class LabelSelector:
    terms: tuple[tuple[str, str, frozenset[str]], ...] = ()
    """(key, op, values) with op one of = != in notin exists !exists."""

    @classmethod
    def parse(cls, text: str) -> LabelSelector:
        terms: list[tuple[str, str, frozenset[str]]] = []
        for raw in re.findall(r"(?:[^,(]|\([^)]*\))+", text):
            term = raw.strip()
            if set_based := re.fullmatch(r"(\S+)\s+(in|notin)\s+\(([^)]*)\)", term):
                key, op, values = set_based.groups()
                terms.append((key, op, frozenset(v.strip() for v in values.split(","))))
            elif equality := re.fullmatch(r"([^=!\s]+)\s*(!=|==|=)\s*(\S*)", term):
                key, op, value = equality.groups()
                terms.append((key, "!=" if op == "!=" else "=", frozenset({value})))
            elif existence := re.fullmatch(r"(!?)([^=!\s]+)", term):
                terms.append((existence[2], "!exists" if existence[1] else "exists", frozenset()))
            else:
                raise SelectorError(f"unable to parse requirement: {term!r}")
        return cls(tuple(terms))

    def matches(self, obj: Obj) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        for key, op, values in self.terms:
            present, value = key in labels, labels.get(key)
            ok = {
                "=": present and value in values,
                "in": present and value in values,
                "!=": not present or value not in values,
                "notin": not present or value not in values,
                "exists": present,
                "!exists": not present,
            }[op]
            if not ok:
                return False
        return True


@dataclass(frozen=True, slots=True)
class Scope:
    """What a list or watch asks for: one kind, a namespace ("" for all), selectors."""

    kind: Kind
    namespace: str = ""
    fields: FieldSelector = FieldSelector()
    labels: LabelSelector = LabelSelector()

    def matches(self, obj: Obj) -> bool:
        meta = obj.get("metadata") or {}
        if self.namespace and meta.get("namespace", "") != self.namespace:
            return False
        return self.fields.matches(obj) and self.labels.matches(obj)
