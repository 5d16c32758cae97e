"""What the test API server (`bench.kube_api.server`) admits: every built-in object against the
Kubernetes schemas that kubernetes-validate ships (its strict ones, in which a misspelt field is an
error), and every ENIConfig against the openAPIV3Schema of VPC CNI's own CRD
(`bench/kube_api/eniconfigs-crd-v1.23.1.yaml`, its header cites the commit), its metadata
against ObjectMeta, after pruning the fields that schema does not keep, as the real server prunes a
custom resource.

`kubernetes_validate.validate` reads and parses its 1.8 MB definitions on every call (about 20 ms);
`Schemas` builds the same validator (the same files, the same draft, the same registry) once per
kind, so a test may store thousands of objects. tests/unit/kube_api/test_schemas.py checks that the
two agree.

`Schemas.cursor` walks a kind's schema by field: the strategic merge patch (`patch.py`) reads
each list's `x-kubernetes-patch-strategy` and `x-kubernetes-patch-merge-key` from it, as the real
server reads them from the Go types.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped,unused-ignore]
import kubernetes_validate  # type: ignore[import-untyped]
from kubernetes_validate import utils as validate_utils
from referencing import Registry, Resource

Obj = dict[str, Any]

KUBERNETES_VERSION = "1.37"
"""The newest Kubernetes kubernetes-validate knows (tests/deploy validates the manifests with it)."""

ENICONFIG_CRD = Path(__file__).resolve().parent / "eniconfigs-crd-v1.23.1.yaml"
ENICONFIG_API_VERSION = "crd.k8s.amazonaws.com/v1alpha1"
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"


@dataclass(frozen=True, slots=True)
class Cause:
    """One field the server refused, as a Status's `details.causes[]` entry names it."""

    field: str
    message: str
    reason: str = "FieldValueInvalid"

    def as_json(self) -> Obj:
        return {"reason": self.reason, "message": self.message, "field": self.field}


class Invalid(ValueError):
    """The object does not satisfy its kind's schema: 422 Invalid, one cause per error."""

    def __init__(self, kind: str, name: str, causes: list[Cause]) -> None:
        joined = ", ".join(f"{c.field}: {c.message}" for c in causes)
        super().__init__(f'{kind} "{name}" is invalid: [{joined}]')
        self.kind = kind
        self.name = name
        self.causes = causes


def _field_path(path: Any) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "<root>"


def _causes(validator: Any, obj: Obj, prefix: str = "") -> list[Cause]:
    errors = sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
    causes = []
    for error in errors:
        field = _field_path(error.absolute_path)
        if prefix:
            field = prefix if field == "<root>" else f"{prefix}.{field}"
        reason = "FieldValueRequired" if error.validator == "required" else "FieldValueInvalid"
        if error.validator == "additionalProperties":
            reason = "FieldValueNotSupported"
        causes.append(Cause(field, error.message, reason))
    return causes


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


class SchemaCursor:
    """A position in a kind's schema: a field's own schema, its items', and what the patch
    strategies say of it (empty when the schema says nothing)."""

    def __init__(self, node: Mapping[str, Any], definitions: Mapping[str, Any]) -> None:
        while "$ref" in node:
            node = definitions[_ref_name(node["$ref"])]
        self.node = node
        self._definitions = definitions

    def field(self, name: str) -> SchemaCursor | None:
        properties = self.node.get("properties") or {}
        if name in properties:
            return SchemaCursor(properties[name], self._definitions)
        extra = self.node.get("additionalProperties")
        return SchemaCursor(extra, self._definitions) if isinstance(extra, Mapping) else None

    def items(self) -> SchemaCursor | None:
        items = self.node.get("items")
        return SchemaCursor(items, self._definitions) if isinstance(items, Mapping) else None

    @property
    def patch_strategy(self) -> str:
        return str(self.node.get("x-kubernetes-patch-strategy", ""))

    @property
    def merge_key(self) -> str:
        return str(self.node.get("x-kubernetes-patch-merge-key", ""))


def _prune(obj: Any, schema: Mapping[str, Any]) -> Any:
    """The object without the fields a structural schema does not specify (unless it says
    `x-kubernetes-preserve-unknown-fields`), as the API server prunes a custom resource."""
    if isinstance(obj, dict):
        properties = schema.get("properties")
        keep_all = schema.get("x-kubernetes-preserve-unknown-fields") or properties is None
        pruned = {}
        for key, value in obj.items():
            if properties and key in properties:
                pruned[key] = _prune(value, properties[key])
            elif keep_all:
                pruned[key] = value
        return pruned
    if isinstance(obj, list) and isinstance(schema.get("items"), Mapping):
        return [_prune(item, schema["items"]) for item in obj]
    return obj


class Schemas:
    """The validators of one Kubernetes version, built once per kind."""

    def __init__(self, version: str = KUBERNETES_VERSION) -> None:
        self.version = version
        (self._schema_dir,) = {
            f"v{v}-local-strict"
            for v in validate_utils.all_versions()
            if validate_utils.major_minor(v) == version
        }

    @functools.cached_property
    def _definitions_document(self) -> Obj:
        document: Obj = validate_utils.schema_contents(
            f"kubernetes-json-schema/{self._schema_dir}/_definitions.json", self.version
        )
        return document

    @property
    def definitions(self) -> Mapping[str, Any]:
        defs: Mapping[str, Any] = self._definitions_document["$defs"]
        return defs

    def _kind_schema(self, api_version: str, kind: str) -> Obj:
        # The file name kubernetes_validate.validate reads: rbac.authorization.k8s.io/v1 -> rbac-v1.
        api = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
        path = f"kubernetes-json-schema/{self._schema_dir}/{kind.lower()}-{api}.json"
        try:
            schema: Obj = validate_utils.schema_contents(path, self.version)
        except FileNotFoundError:
            raise kubernetes_validate.SchemaNotFoundError(
                version=self.version, kind=kind, api_version=api_version
            ) from None
        return schema

    @functools.cache  # noqa: B019 (one Schemas per server; its validators live as long as it)
    def _validator(self, api_version: str, kind: str) -> Any:
        schema = self._kind_schema(api_version, kind)
        registry: Registry[Any] = Resource.from_contents(schema) @ Registry()
        registry = Resource.from_contents(self._definitions_document) @ registry
        return jsonschema.validators.Draft202012Validator(schema, registry=registry)

    @functools.cached_property
    def _object_meta_validator(self) -> Any:
        schema = {"$ref": f"{self._definitions_document['$id']}#/$defs/{OBJECT_META}"}
        registry: Registry[Any] = Resource.from_contents(self._definitions_document) @ Registry()
        return jsonschema.validators.Draft202012Validator(schema, registry=registry)

    @functools.cached_property
    def eniconfig_schema(self) -> Obj:
        """The CRD's openAPIV3Schema (v1alpha1), as the fixture holds it."""
        (crd,) = validate_utils.resources_from_file(str(ENICONFIG_CRD))
        (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
        schema: Obj = version["schema"]["openAPIV3Schema"]
        return schema

    @functools.cached_property
    def _eniconfig_validator(self) -> Any:
        return jsonschema.validators.Draft202012Validator(self.eniconfig_schema)

    def cursor(self, api_version: str, kind: str) -> SchemaCursor:
        if api_version == ENICONFIG_API_VERSION:
            return SchemaCursor(self.eniconfig_schema, {})
        return SchemaCursor(self._kind_schema(api_version, kind), self.definitions)

    def admit(self, obj: Obj) -> Obj:
        """The object as the server would store it (an ENIConfig pruned), or `Invalid`."""
        api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
        name = str((obj.get("metadata") or {}).get("name", ""))
        causes: list[Cause] = []
        if not name:
            causes.append(
                Cause("metadata.name", "name or generateName is required", "FieldValueRequired")
            )
        if api_version == ENICONFIG_API_VERSION and kind == "ENIConfig":
            obj = _prune(copy.deepcopy(obj), self.eniconfig_schema)
            causes += _causes(self._eniconfig_validator, obj)
            causes += _causes(self._object_meta_validator, obj.get("metadata") or {}, "metadata")
        else:
            causes += _causes(self._validator(api_version, kind), obj)
        if causes:
            raise Invalid(kind, name, causes)
        return obj
