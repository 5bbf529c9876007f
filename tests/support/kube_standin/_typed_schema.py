"""Validation of Trainer objects without the CRD files, from what the project installs: the `kubeflow-trainer-api`
typed models (generated from the same Go types as the CRDs) with unknown fields forbidden, plus the CRD's
defaults and validation markers on TrainJob's own fields, from kubeflow/trainer v2.3.0
pkg/apis/trainer/v1alpha1/trainjob_types.go (`+kubebuilder:default`, `+kubebuilder:validation:*`, XValidation).

With ``KFP_FINETUNE_CRD_DIR`` set, the stand-in validates against the CRD schemas instead (_schema.py): those also
check the pod template fields' patterns, bounds and CEL rules, which the typed models cannot.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from ._common import TRAINER_GROUP
from ._schema import _validate_object_meta

# `+kubebuilder:default` markers of TrainJobSpec and RuntimeRef: (path, default).
TRAINJOB_DEFAULTS = (
    (("spec", "runtimeRef", "apiGroup"), TRAINER_GROUP),
    (("spec", "runtimeRef", "kind"), "ClusterTrainingRuntime"),
    (("spec", "managedBy"), "trainer.kubeflow.org/trainjob-controller"),
    (("spec", "suspend"), False),
)
_MANAGERS = ("trainer.kubeflow.org/trainjob-controller", "kueue.x-k8s.io/multikueue")
_RFC1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# Pydantic error types -> the OpenAPI type the API server names in "must be of type ...".
_TYPE_ERRORS = {
    "int_type": "integer", "int_parsing": "integer", "int_from_float": "integer", "string_type": "string",
    "bool_type": "boolean", "bool_parsing": "boolean", "dict_type": "object", "model_type": "object",
    "model_attributes_type": "object", "list_type": "array", "float_type": "number",
}  # fmt: skip


def _trainjob_rules(job: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The validation markers on TrainJob's own fields (the pod template's are not in the typed models)."""
    errors = []
    name = (job.get("metadata") or {}).get("name") or ""
    if not _RFC1035.match(name):
        errors.append(("", 'Invalid value: "object": metadata.name must match RFC 1035 DNS label format'))
    if len(name) > 63:
        errors.append(("", 'Invalid value: "object": metadata.name must be no more than 63 characters'))
    spec = job.get("spec") or {}
    deadline = spec.get("activeDeadlineSeconds")
    if isinstance(deadline, int) and deadline < 1:
        errors.append(
            (
                "spec.activeDeadlineSeconds",
                f"Invalid value: {deadline}: spec.activeDeadlineSeconds in body should be greater than or equal to 1",
            )
        )
    if spec.get("managedBy") not in (None, *_MANAGERS):
        errors.append(
            (
                "spec.managedBy",
                f'Invalid value: "string": ManagedBy must be {_MANAGERS[0]} or {_MANAGERS[1]} if set',
            )
        )
    patches = [p.get("manager") for p in spec.get("runtimePatches") or [] if isinstance(p, dict)]
    if len(patches) != len(set(patches)):
        errors.append(("spec.runtimePatches", "Duplicate value: runtimePatches[].manager must be unique"))
    return errors


class TypedModelValidator:
    """The stand-in's validator for one kind when no CRD files are given: ``validate(obj)`` defaults ``obj`` in
    place and returns (field path, message) pairs like :class:`_schema.SchemaValidator`."""

    def __init__(
        self,
        model: type,
        defaults: tuple[tuple[tuple[str, ...], Any], ...] = (),
        rules: Callable[[Mapping[str, Any]], list[tuple[str, str]]] | None = None,
    ):
        self.model, self.defaults, self.rules = model, defaults, rules

    def validate(self, obj: dict) -> list[tuple[str, str]]:
        errors: list[tuple[str, str]] = []
        _validate_object_meta(obj.get("metadata"), errors)
        for path, value in self.defaults:
            node = obj
            for key in path[:-1]:
                node = node.get(key) if isinstance(node, dict) else None
            if isinstance(node, dict):
                node.setdefault(path[-1], copy.deepcopy(value))
        errors += typed_model_errors(obj, self.model)
        if self.rules and not errors:
            errors += self.rules(obj)
        return errors


def typed_model_errors(obj: Mapping[str, Any], model: type) -> list[tuple[str, str]]:
    """Parse ``obj`` (all but its metadata) into the typed model: wrong types, missing required fields and unknown
    fields (keys the model does not keep) are errors, named by their JSON path as the API server names them."""
    from pydantic import ValidationError

    body = {key: copy.deepcopy(value) for key, value in obj.items() if key != "metadata"}
    try:
        # The generated from_dict is the reference parser (it unwraps oneOf types such as Quantity)...
        parsed = model.from_dict(copy.deepcopy(body))
    except ValueError as error:  # pydantic's ValidationError, or the oneOf wrappers' ValueError
        # ... but names fields relative to the nested model that failed: validate again for full paths.
        try:
            model.model_validate(body)
        except ValidationError as located:
            errors = [_field_error(e) for e in located.errors() if not _one_of_value(e)]
            if errors:
                return errors
        return [("", f"Invalid value: {str(error).splitlines()[0]}")]
    return [(path, f'unknown field "{path}"') for path in _dropped_keys(body, parsed.to_dict())]


def _one_of_value(error: Mapping[str, Any]) -> bool:
    """A scalar where the model has a oneOf wrapper (Quantity, IntOrString): valid if the wrapper parses it."""
    from kubeflow_trainer_api import models

    wrapper = getattr(models, (error.get("ctx") or {}).get("class_name", ""), None)
    if error["type"] != "model_type" or not hasattr(wrapper, "one_of_schemas"):
        return False
    try:
        wrapper.from_json(json.dumps(error["input"]))
    except ValueError:
        return False
    return True


def _field_error(error: Mapping[str, Any]) -> tuple[str, str]:
    path = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error["loc"]).lstrip(".")
    if error["type"] == "missing":
        return path, "Required value"
    expected = _TYPE_ERRORS.get(error["type"])
    if expected:
        return path, f"Invalid value: {error['input']!r}: {path} in body must be of type {expected}"
    return path, f"Invalid value: {error['input']!r}: {error['msg']}"


def _dropped_keys(original: Any, kept: Any, path: str = "") -> list[str]:
    if isinstance(original, Mapping):
        kept = kept if isinstance(kept, Mapping) else {}
        dropped = []
        for key, value in original.items():
            child = f"{path}.{key}" if path else key
            if key not in kept and value is not None:
                dropped.append(child)
            elif key in kept:
                dropped += _dropped_keys(value, kept[key], child)
        return dropped
    if isinstance(original, list) and isinstance(kept, list):
        return [
            d
            for i, (a, b) in enumerate(zip(original, kept, strict=False))
            for d in _dropped_keys(a, b, f"{path}[{i}]")
        ]
    return []


def typed_model_validators() -> dict[str, TypedModelValidator]:
    """Validators by resource plural, as :func:`_schema.load_schemas` returns them from CRD files."""
    from kubeflow_trainer_api.models import (
        TrainerV1alpha1ClusterTrainingRuntime,
        TrainerV1alpha1TrainingRuntime,
        TrainerV1alpha1TrainJob,
    )

    return {
        "trainjobs": TypedModelValidator(TrainerV1alpha1TrainJob, TRAINJOB_DEFAULTS, _trainjob_rules),
        "trainingruntimes": TypedModelValidator(TrainerV1alpha1TrainingRuntime),
        "clustertrainingruntimes": TypedModelValidator(TrainerV1alpha1ClusterTrainingRuntime),
    }
