"""The KServe InferenceService schema the serving tests validate against (with the API server's structural rules:
tests/support/kube_standin/_schema.py): the full CRD when KFP_FINETUNE_CRD_DIR holds
`serving.kserve.io_inferenceservices.yaml`, else a transcription of the nodes the project writes, from KServe's
config/crd/full/serving.kserve.io_inferenceservices.yaml (v1beta1's openAPIV3Schema, kserve/kserve at 67bcf1a):
spec.predictor (required) and its model's modelFormat (name required), storageUri, args, runtime and resources
(quantities: int-or-string). Every other field is unknown to it, so a field the project writes by mistake is
refused, as the API server's strict field validation refuses it."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from tests.support.kube_standin._schema import SchemaValidator

CRD_FILE = "serving.kserve.io_inferenceservices.yaml"
_QUANTITY = {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True}
_RESOURCES = {"type": "object", "properties": {
    "limits": {"type": "object", "additionalProperties": _QUANTITY},
    "requests": {"type": "object", "additionalProperties": _QUANTITY},
}}  # fmt: skip
TRANSCRIBED = {
    "type": "object",
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
        "spec": {"type": "object", "required": ["predictor"], "properties": {
            "predictor": {"type": "object", "properties": {
                "minReplicas": {"type": "integer", "format": "int32"},
                "maxReplicas": {"type": "integer", "format": "int32"},
                "model": {"type": "object", "properties": {
                    "modelFormat": {"type": "object", "required": ["name"], "properties": {
                        "name": {"type": "string"}, "version": {"type": "string"},
                    }},
                    "storageUri": {"type": "string"},
                    "runtime": {"type": "string"},
                    "args": {"type": "array", "items": {"type": "string"}},
                    "resources": _RESOURCES,
                }},
            }},
        }},
    },
}  # fmt: skip


def validator() -> SchemaValidator:
    crd_dir = os.environ.get("KFP_FINETUNE_CRD_DIR")
    if crd_dir and (Path(crd_dir) / CRD_FILE).is_file():
        crd = yaml.safe_load((Path(crd_dir) / CRD_FILE).read_text())
        version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1beta1")
        return SchemaValidator(version["schema"]["openAPIV3Schema"])
    return SchemaValidator(TRANSCRIBED)
