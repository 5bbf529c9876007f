"""The serving hand-off (issue 29 item 4): a KServe InferenceService (serving.kserve.io/v1beta1) that serves an
exported model, written by export (its `serving` output) and printed for any export by `kfp-finetune
serve-manifest`.

KServe's Hugging Face runtime serves it (`modelFormat: huggingface`, the kserve-huggingfaceserver image), with
vLLM as its engine for text and vision-language generation (`--backend=vllm`) and transformers for sequence
classification. `storageUri` is the export pinned to its bytes where the destination can say so: an OCI ModelCar
by its manifest digest (KServe mounts it as a ModelCar), a hub repo by its commit; s3:// as exported. A path on a
volume has no URI another namespace can read, and an adapter alone needs its base model beside it: neither gets a
manifest. Resources follow the weights' size: GPUs enough to hold them in GPU_SHARE of the GPUs' memory (vLLM's
KV cache takes the rest), as a power of two (tensor parallelism splits attention heads evenly); host memory for
the weights plus HOST_OVERHEAD_GIB.
"""

from __future__ import annotations

import math
import re

import yaml

from kfp_finetune.components._shared import storage
from kfp_finetune.components._shared.engines import CLASSIFICATION

API_VERSION = "serving.kserve.io/v1beta1"
GPU_MEMORY_GIB = 80  # an A100 / H100 80 GB
GPU_SHARE = 0.6  # of the GPUs' memory for the weights; the rest is vLLM's KV cache and activations
HOST_OVERHEAD_GIB = 8
CPUS_PER_GPU = 4
# KServe appends "-predictor" and Knative revision suffixes to the name; Kubernetes caps names at 63.
NAME_LIMIT = 45
_GIB = 1 << 30


class NotServable(ValueError):
    """The export cannot be served as it is; the message says what to export instead."""


def service_name(text: str) -> str:
    """A DNS-1035 label KServe accepts, from a model's name: lowercase, letters, digits and '-', a letter first."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    name = re.sub(r"-{2,}", "-", name)[:NAME_LIMIT].rstrip("-")
    return name if name[:1].isalpha() else f"model-{name}"[:NAME_LIMIT].rstrip("-")


def gpus_for(weight_bytes: int, gpu_memory_gib: int = GPU_MEMORY_GIB) -> int:
    """The fewest GPUs, a power of two, whose memory holds the weights in GPU_SHARE of it."""
    needed = max(1, math.ceil(weight_bytes / (GPU_SHARE * gpu_memory_gib * _GIB)))
    return 1 << (needed - 1).bit_length()


def storage_uri(destination: str, pin: str = "") -> str:
    """Where KServe reads the model: the destination pinned to its bytes (storage.pinned_uri); a local path has
    no URI KServe can read."""
    if storage.parse_uri(destination).scheme == "file":
        raise NotServable(
            f"{destination} is a path on a volume: KServe cannot read it by URI. Export to s3://, hf:// or oci:// "
            "to serve it (or write the InferenceService yourself with a pvc:// storageUri)"
        )
    return storage.pinned_uri(destination, pin)


def inference_service(
    name: str, uri: str, weight_bytes: int, *, task: str = "", namespace: str = "", adapter_only: bool = False,
    gpu_memory_gib: int = GPU_MEMORY_GIB,
) -> dict:  # fmt: skip
    """The InferenceService serving the model at `uri`, its weights `weight_bytes` long."""
    if adapter_only:
        raise NotServable(
            "an adapter alone is served with its base model: export with export_format=merged or both to serve it"
        )
    if weight_bytes <= 0:
        raise NotServable(f"{uri} holds no safetensors weights at its root: nothing to serve")
    gpus = gpus_for(weight_bytes, gpu_memory_gib)
    name = service_name(name)
    if task == CLASSIFICATION:
        args = [f"--model_name={name}", "--backend=huggingface", "--task=sequence_classification"]
    else:
        args = [f"--model_name={name}", "--backend=vllm"]
        if gpus > 1:
            args.append(f"--tensor-parallel-size={gpus}")
    memory = f"{math.ceil(weight_bytes / _GIB + HOST_OVERHEAD_GIB)}Gi"
    resources = {"cpu": str(CPUS_PER_GPU * gpus), "memory": memory, "nvidia.com/gpu": str(gpus)}
    metadata = {"name": name, "labels": {"app.kubernetes.io/managed-by": "kfp-finetune"}}
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": API_VERSION,
        "kind": "InferenceService",
        "metadata": metadata,
        "spec": {
            "predictor": {
                "model": {
                    "modelFormat": {"name": "huggingface"},
                    "storageUri": uri,
                    "args": args,
                    "resources": {"requests": dict(resources), "limits": dict(resources)},
                }
            }
        },
    }


def to_yaml(manifest: dict) -> str:
    return yaml.safe_dump(manifest, sort_keys=False)
