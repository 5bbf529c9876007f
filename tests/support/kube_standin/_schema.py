"""Validation of created objects against the CRD openAPIV3Schema, as the API server does it."""

from __future__ import annotations

import copy
import functools
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from ._common import TRAINER_GROUP, TRAINER_VERSION

_OBJECT_META_FIELDS = {
    "name",
    "generateName",
    "namespace",
    "labels",
    "annotations",
    "finalizers",
    "ownerReferences",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
}


def default_crd_dir() -> Path | None:
    """The Trainer CRDs' folder, ``$KFP_FINETUNE_CRD_DIR`` (CI points it at the upstream files); None when unset:
    a clone of the repository alone validates with the typed models (_typed_schema.py)."""
    value = os.environ.get("KFP_FINETUNE_CRD_DIR")
    return Path(value) if value else None


_JSON_TYPE_NAMES = (
    (bool, "boolean"),
    (int, "integer"),
    (float, "number"),
    (str, "string"),
    (list, "array"),
    (dict, "object"),
)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    return next(name for py_type, name in _JSON_TYPE_NAMES if isinstance(value, py_type))


def _go_quote(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else json.dumps(_json_type(value))


class SchemaValidator:
    """Validates (and defaults) an object against a CRD openAPIV3Schema like the API server does on create.

    Structural checks: types, unknown fields, required, enum, lengths, patterns, bounds, int32/int64 ranges,
    list-map key uniqueness; CEL ``x-kubernetes-validations`` of the shapes the Trainer CRDs use. Non-nullable
    ``null`` values are pruned, as the API server does.
    """

    def __init__(self, schema: dict):
        self.schema = schema

    def validate(self, obj: dict) -> list[tuple[str, str]]:
        """Defaults ``obj`` in place; returns (field path, message) pairs, empty when valid."""
        errors: list[tuple[str, str]] = []
        self._walk(obj, self.schema, "", errors, root=True)
        return errors

    def _walk(self, value: Any, schema: dict, path: str, errors: list, root: bool = False) -> None:
        where = path or "<root>"
        if schema.get("x-kubernetes-int-or-string"):
            if isinstance(value, bool) or not isinstance(value, int | str):
                errors.append(
                    (
                        path,
                        f"Invalid value: {_go_quote(value)}: {where} in body must be of type "
                        f"integer or string: {_go_quote(value)}",
                    )
                )
            return
        expected = schema.get("type")
        if expected:
            actual = _json_type(value)
            if actual != expected and not (expected == "number" and actual == "integer"):
                errors.append(
                    (
                        path,
                        f'Invalid value: "{actual}": {where} in body must be of type {expected}: "{actual}"',
                    )
                )
                return
        if isinstance(value, dict):
            self._walk_object(value, schema, path, errors, root)
        elif isinstance(value, list):
            self._walk_array(value, schema, path, errors)
        else:
            self._check_scalar(value, schema, path, errors)
        self._check_cel(value, schema, path, errors)

    def _walk_object(self, value: dict, schema: dict, path: str, errors: list, root: bool) -> None:
        properties = schema.get("properties", {})
        for key in [k for k, v in value.items() if v is None and not properties.get(k, {}).get("nullable")]:
            del value[key]  # the API server prunes non-nullable nulls
        for key, sub in properties.items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
        for key in schema.get("required", []):
            if key not in value:
                errors.append((f"{path}.{key}".lstrip("."), "Required value"))
        if len(value) < schema.get("minProperties", 0):
            errors.append(
                (
                    path,
                    f"Invalid value: {len(value)}: should have at least {schema['minProperties']} properties",
                )
            )
        additional = schema.get("additionalProperties")
        for key, item in value.items():
            child = f"{path}.{key}".lstrip(".")
            if root and key == "metadata":
                _validate_object_meta(item, errors)
            elif root and key in ("apiVersion", "kind"):
                continue
            elif key in properties:
                self._walk(item, properties[key], child, errors)
            elif isinstance(additional, dict):
                self._walk(item, additional, child, errors)
            elif properties and not schema.get("x-kubernetes-preserve-unknown-fields") and not additional:
                errors.append((child, f'unknown field "{child}"'))

    def _walk_array(self, value: list, schema: dict, path: str, errors: list) -> None:
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append((path, f"Too many: {len(value)}: must have at most {schema['maxItems']} items"))
        if "minItems" in schema and len(value) < schema["minItems"]:
            errors.append(
                (path, f"Invalid value: {len(value)}: must have at least {schema['minItems']} items")
            )
        items = schema.get("items", {})
        for index, item in enumerate(value):
            self._walk(item, items, f"{path}[{index}]", errors)
        keys = schema.get("x-kubernetes-list-map-keys")
        list_type = schema.get("x-kubernetes-list-type")
        if list_type == "map" and keys:
            seen = set()
            for index, item in enumerate(value):
                if not isinstance(item, dict):
                    continue
                key = tuple(json.dumps(item.get(k), sort_keys=True) for k in keys)
                if key in seen:
                    shown = ", ".join(f"{k}={json.dumps(item.get(k))}" for k in keys)
                    errors.append(
                        (f"{path}[{index}]", f"Duplicate value: map[string]interface {{}}{{{shown}}}")
                    )
                seen.add(key)
        elif list_type == "set":
            rendered = [json.dumps(item, sort_keys=True) for item in value]
            for index, item in enumerate(rendered):
                if item in rendered[:index]:
                    errors.append((f"{path}[{index}]", f"Duplicate value: {item}"))

    @staticmethod
    def _check_scalar(value: Any, schema: dict, path: str, errors: list) -> None:
        shown = _go_quote(value) if isinstance(value, str) else json.dumps(value)
        if "enum" in schema and value not in schema["enum"]:
            allowed = ", ".join(json.dumps(v) for v in schema["enum"])
            errors.append((path, f"Unsupported value: {shown}: supported values: {allowed}"))
        if isinstance(value, str):
            if "maxLength" in schema and len(value) > schema["maxLength"]:
                errors.append((path, f"Too long: may not be more than {schema['maxLength']} bytes"))
            if "minLength" in schema and len(value) < schema["minLength"]:
                errors.append(
                    (
                        path,
                        f"Invalid value: {shown}: {path} in body should be at least "
                        f"{schema['minLength']} chars long",
                    )
                )
            if "pattern" in schema and not re.search(schema["pattern"], value):
                errors.append(
                    (path, f"Invalid value: {shown}: {path} in body should match '{schema['pattern']}'")
                )
        elif isinstance(value, int | float) and not isinstance(value, bool):
            bits = {"int32": 31, "int64": 63}.get(schema.get("format", ""))
            if bits and not -(2**bits) <= value < 2**bits:
                errors.append(
                    (path, f"Invalid value: {shown}: {path} in body is out of {schema['format']} range")
                )
            if "minimum" in schema and value < schema["minimum"]:
                errors.append(
                    (
                        path,
                        f"Invalid value: {shown}: {path} in body should be greater than or equal "
                        f"to {schema['minimum']}",
                    )
                )
            if "maximum" in schema and value > schema["maximum"]:
                errors.append(
                    (
                        path,
                        f"Invalid value: {shown}: {path} in body should be less than or equal "
                        f"to {schema['maximum']}",
                    )
                )

    @staticmethod
    def _check_cel(value: Any, schema: dict, path: str, errors: list) -> None:
        for validation in schema.get("x-kubernetes-validations", []):
            check = _cel_check(validation["rule"])
            if check is not None and not check(value):
                errors.append((path, f'Invalid value: "{_json_type(value)}": {validation["message"]}'))


def _cel_check(rule: str) -> Callable[[Any], bool] | None:
    """A Python predicate for the CEL rule shapes used by the Trainer CRDs (None: not evaluated on create)."""
    rule = " ".join(rule.split())
    if "oldSelf" in rule or rule.startswith("has("):  # transition rules; status-only rules
        return None
    if match := re.fullmatch(r"self\.metadata\.name\.matches\('(.*)'\)", rule):
        pattern = match.group(1)
        return lambda obj: bool(re.search(pattern, obj.get("metadata", {}).get("name", "")))
    if match := re.fullmatch(r"size\(self\.metadata\.name\) <= (\d+)", rule):
        limit = int(match.group(1))
        return lambda obj: len(obj.get("metadata", {}).get("name", "")) <= limit
    if match := re.fullmatch(r"self == '' \|\| self\.matches\('(.*)'\)", rule):
        pattern = match.group(1)
        return lambda value: value == "" or bool(re.search(pattern, value))
    if match := re.fullmatch(r"self in \[(.*)\]", rule):
        allowed = re.findall(r"'([^']*)'", match.group(1))
        return lambda value: value in allowed
    if match := re.fullmatch(r"self >= (\d+)", rule):
        bound = int(match.group(1))
        return lambda value: value >= bound
    return None


_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _validate_object_meta(meta: Any, errors: list) -> None:
    """ObjectMeta checks the API server applies to every object (name, labels, annotations, unknown fields)."""
    if not isinstance(meta, dict):
        errors.append(
            ("metadata", f'Invalid value: "{_json_type(meta)}": metadata in body must be of type object')
        )
        return
    for key in meta:
        if key not in _OBJECT_META_FIELDS:
            errors.append((f"metadata.{key}", f'unknown field "metadata.{key}"'))
    name = meta.get("name", "")
    if not name:
        errors.append(("metadata.name", "Required value: name or generateName is required"))
    elif len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        errors.append(
            (
                "metadata.name",
                f'Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist '
                "of lower case alphanumeric characters, '-' or '.'",
            )
        )
    for key, value in (meta.get("labels") or {}).items():
        label_name = key.rsplit("/", 1)[-1]
        if len(label_name) > 63 or not _LABEL_NAME.match(label_name):
            errors.append(
                (
                    "metadata.labels",
                    f'Invalid value: "{key}": name part must be no more than 63 '
                    "characters and consist of alphanumerics, '-', '_' or '.'",
                )
            )
        if not isinstance(value, str):
            errors.append((f"metadata.labels.{key}", f"Invalid value: {_go_quote(value)}: must be a string"))
        elif len(value) > 63:
            errors.append(
                ("metadata.labels", f'Invalid value: "{value}": must be no more than 63 characters')
            )
        elif not _LABEL_VALUE.match(value):
            errors.append(
                (
                    "metadata.labels",
                    f'Invalid value: "{value}": a valid label must be an empty string or '
                    "consist of alphanumeric characters, '-', '_' or '.'",
                )
            )
    for key, value in (meta.get("annotations") or {}).items():
        if not isinstance(value, str):
            errors.append(
                (f"metadata.annotations.{key}", f"Invalid value: {_go_quote(value)}: must be a string")
            )


@functools.lru_cache(maxsize=4)
def load_schemas(crd_dir: Path) -> dict[str, SchemaValidator]:
    """Reads the served version's openAPIV3Schema of each Trainer CRD in ``crd_dir`` (cached: parsing takes ~2 s)."""
    schemas = {}
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    for path in sorted(crd_dir.glob(f"{TRAINER_GROUP}_*.yaml")):
        for doc in yaml.load_all(path.read_text(), Loader=loader):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            version = next(v for v in doc["spec"]["versions"] if v["name"] == TRAINER_VERSION)
            schemas[doc["spec"]["names"]["plural"]] = SchemaValidator(version["schema"]["openAPIV3Schema"])
    if "trainjobs" not in schemas:
        raise FileNotFoundError(f"no TrainJob CRD in {crd_dir} (set KFP_FINETUNE_CRD_DIR)")
    return schemas
