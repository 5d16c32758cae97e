"""The three PATCH bodies the test API server (`bench.kube_api.server`) applies, with the real
server's answers when one cannot be applied.

- `application/merge-patch+json`: RFC 7386. A map merges key by key, `null` removes a key, any
  other value (a list included) replaces what was there.
- `application/json-patch+json`: RFC 6902, every op (`add`, `remove`, `replace`, `move`, `copy`,
  `test`). A body that is not a list of ops is 400 BadRequest; an op that cannot be applied (a
  failed `test`, a `remove` or `replace` of a path that is not there) is 422, as the API server
  answers (staging/src/k8s.io/apiserver/pkg/endpoints/handlers/patch.go, `applyJSPatch`). A careful
  client removes one taint with a `test` of `/spec/taints/<i>` before the `remove` of it, so that a
  list changed meanwhile fails the patch instead of removing another taint.
- `application/strategic-merge-patch+json`: apimachinery's strategic merge, driven by the kind's
  schema (`schemas.SchemaCursor`) as the server drives it by the Go types. A list whose
  schema says `x-kubernetes-patch-strategy: merge` merges: by its `x-kubernetes-patch-merge-key`
  for a list of maps (containers by `name`, conditions by `type`), as a union for a list of
  strings (finalizers). Any other list is replaced whole: the Node's `spec.taints` has no patch
  strategy (`x-kubernetes-list-type: atomic` in the schema; `Taints []Taint` carries no
  `patchStrategy` tag in k8s.io/api/core/v1/types.go), so a strategic merge patch of
  `spec.taints` replaces the node's whole list, exactly like a merge patch. Directives:
  `$patch: replace` and `$patch: delete` (a map, a list item), `$deleteFromPrimitiveList/<field>`
  and `$retainKeys`; `$setElementOrder/<field>` is accepted and ignored (the order stays the
  merge's). Not done: a `$patch` directive inside a list of primitives.
"""

from __future__ import annotations

import copy
from typing import Any

from bench.kube_api.schemas import SchemaCursor

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
PATCH_TYPES = (JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH)


class PatchError(Exception):
    """The patch cannot be applied: `status` 400 (a malformed body) or 422 (an op that fails)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# -- RFC 7386 ---------------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# -- RFC 6902 ---------------------------------------------------------------------------------------


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise PatchError(400, f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]] if path else []


def _index(container: list[Any], token: str, *, adding: bool) -> int:
    if adding and token == "-":
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise PatchError(422, f"invalid array index {token!r}")
    index = int(token)
    if index > len(container) or (index == len(container) and not adding):
        raise PatchError(422, f"array index {index} out of bounds")
    return index


def _parent(doc: Any, tokens: list[str], path: str) -> Any:
    node = doc
    for token in tokens[:-1]:
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, adding=False)]
        else:
            raise PatchError(422, f"doc is missing path: {path!r}")
    return node


def _get(doc: Any, path: str) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return doc
    parent = _parent(doc, tokens, path)
    if isinstance(parent, dict) and tokens[-1] in parent:
        return parent[tokens[-1]]
    if isinstance(parent, list):
        return parent[_index(parent, tokens[-1], adding=False)]
    raise PatchError(422, f"doc is missing path: {path!r}")


def _remove(doc: Any, path: str) -> Any:
    tokens = _pointer(path)
    if not tokens:
        raise PatchError(422, "cannot remove the whole document")
    parent = _parent(doc, tokens, path)
    if isinstance(parent, dict) and tokens[-1] in parent:
        return parent.pop(tokens[-1])
    if isinstance(parent, list):
        return parent.pop(_index(parent, tokens[-1], adding=False))
    raise PatchError(422, f"unable to remove nonexistent key: {tokens[-1]}: missing value")


def _add(doc: Any, path: str, value: Any, *, replace: bool = False) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return value
    parent = _parent(doc, tokens, path)
    if isinstance(parent, dict):
        if replace and tokens[-1] not in parent:
            raise PatchError(422, f"replace operation does not apply: doc is missing key: {path}")
        parent[tokens[-1]] = value
    elif isinstance(parent, list):
        index = _index(parent, tokens[-1], adding=not replace)
        if replace:
            parent[index] = value
        else:
            parent.insert(index, value)
    else:
        raise PatchError(422, f"doc is missing path: {path!r}")
    return doc


def json_patch(document: Any, ops: Any) -> Any:
    if not isinstance(ops, list) or not all(isinstance(op, dict) for op in ops):
        raise PatchError(400, "json patch must be a list of operations")
    doc = copy.deepcopy(document)
    for op in ops:
        name, path = op.get("op"), op.get("path")
        if name in ("add", "replace", "test") and "value" not in op:
            raise PatchError(400, f"json patch {name} operation has no value")
        if name == "add":
            doc = _add(doc, path, copy.deepcopy(op["value"]))
        elif name == "replace":
            doc = _add(doc, path, copy.deepcopy(op["value"]), replace=True)
        elif name == "remove":
            _remove(doc, path)
        elif name == "test":
            if _get(doc, path) != op["value"]:
                raise PatchError(422, f"testing value {path} failed: test failed")
        elif name in ("move", "copy"):
            value = _remove(doc, op.get("from")) if name == "move" else _get(doc, op.get("from"))
            doc = _add(doc, path, copy.deepcopy(value))
        else:
            raise PatchError(400, f"unexpected json patch operation {name!r}")
    return doc


# -- strategic merge patch --------------------------------------------------------------------------

DIRECTIVE = "$patch"
RETAIN_KEYS = "$retainKeys"
DELETE_FROM = "$deleteFromPrimitiveList/"
ELEMENT_ORDER = "$setElementOrder/"


def _strip(value: Any) -> Any:
    """A value new to the object: its directives and null fields dropped."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if v is not None and not k.startswith("$")}
    if isinstance(value, list):
        return [
            _strip(v) for v in value if not (isinstance(v, dict) and v.get(DIRECTIVE) == "delete")
        ]
    return value


def _merge_list(original: list[Any], patch: list[Any], cursor: SchemaCursor) -> list[Any]:
    key = cursor.merge_key
    items = cursor.items()
    if not key:  # a list of primitives that merges: a union, the original's order first
        return list(original) + [_strip(v) for v in patch if v not in original]
    if any(isinstance(v, dict) and v.get(DIRECTIVE) == "replace" for v in patch):
        return [_strip(v) for v in patch if not (isinstance(v, dict) and DIRECTIVE in v)]
    result = [copy.deepcopy(v) for v in original]
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise PatchError(422, f"map in a list merged by {key!r} has no {key!r}: {item!r}")
        positions = [
            i for i, v in enumerate(result) if isinstance(v, dict) and v.get(key) == item[key]
        ]
        if item.get(DIRECTIVE) == "delete":
            result = [v for i, v in enumerate(result) if i not in positions]
        elif positions:
            result[positions[0]] = _merge_map(result[positions[0]], item, items)
        else:
            result.append(_strip(item))
    return result


def _merge_map(original: dict[str, Any], patch: dict[str, Any], cursor: SchemaCursor | None) -> Any:
    if patch.get(DIRECTIVE) == "replace":
        return _strip(patch)
    result = copy.deepcopy(original)
    for key, value in patch.items():
        if key in (DIRECTIVE, RETAIN_KEYS) or key.startswith(ELEMENT_ORDER):
            continue
        if key.startswith(DELETE_FROM):
            field = key[len(DELETE_FROM) :]
            result[field] = [v for v in result.get(field) or [] if v not in (value or [])]
            continue
        old = result.get(key)
        sub = cursor.field(key) if cursor is not None else None
        if value is None or (isinstance(value, dict) and value.get(DIRECTIVE) == "delete"):
            result.pop(key, None)
        elif isinstance(value, dict) and isinstance(old, dict):
            result[key] = _merge_map(old, value, sub)
        elif (
            isinstance(value, list)
            and isinstance(old, list)
            and sub is not None
            and "merge" in sub.patch_strategy.split(",")
        ):
            result[key] = _merge_list(old, value, sub)
        else:
            result[key] = _strip(value)
    if isinstance(patch.get(RETAIN_KEYS), list):
        result = {k: v for k, v in result.items() if k in patch[RETAIN_KEYS]}
    return result


def strategic_merge_patch(original: dict[str, Any], patch: Any, cursor: SchemaCursor) -> Any:
    if not isinstance(patch, dict):
        raise PatchError(400, "strategic merge patch must be a JSON object")
    return _merge_map(original, patch, cursor)
