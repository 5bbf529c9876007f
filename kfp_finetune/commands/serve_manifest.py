"""`kfp-finetune serve-manifest DESTINATION`: the KServe InferenceService that serves a finished run's export.

Reads the export where it is (the run's `export_destination`: s3://, hf:// or oci://, with the credentials the steps
use from the environment), pins it to the bytes there now (an OCI image's manifest digest, a hub commit), sizes
GPUs and memory from its weights and prints the manifest (_shared/serving.py) for `kubectl apply -f -`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ADAPTER_CONFIG = "adapter_config.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "destination", help="the run's export_destination, e.g. oci://registry/models/my-llm:v1"
    )
    parser.add_argument("--name", default="", help="the InferenceService's name (default: the destination's)")
    parser.add_argument(
        "--namespace", default="", help="the namespace to serve in (default: none in the manifest)"
    )
    parser.add_argument(
        "--gpu-memory-gib", type=int, default=80, help="memory of one serving GPU, GiB (default: 80)"
    )


def run(args: argparse.Namespace) -> int:
    from kfp_finetune.components._shared import serving, storage
    from kfp_finetune.components._shared.engines import CLASSIFICATION

    try:
        storage.refuse_credentials(destination=args.destination)
        serving.storage_uri(args.destination)  # a path is refused before anything is read
        listing = storage.list_files(args.destination)
        root = {f.path: f for f in listing.files if "/" not in f.path}
        adapter_only = ADAPTER_CONFIG in root and "config.json" not in root
        weights = sum(f.size or 0 for p, f in root.items() if p.endswith(".safetensors") and not adapter_only)
        task = CLASSIFICATION if _classifier(listing) else ""
        manifest = serving.inference_service(
            args.name or storage.last_name(args.destination),
            serving.storage_uri(args.destination, listing.commit_sha or ""), weights, task=task,
            namespace=args.namespace, adapter_only=adapter_only, gpu_memory_gib=args.gpu_memory_gib,
        )  # fmt: skip
    except (serving.NotServable, storage.StorageError, ValueError) as error:
        print(f"error: {storage.redact_text(error)}", file=sys.stderr)
        return 1
    print(serving.to_yaml(manifest), end="")
    return 0


def _classifier(listing) -> bool:
    """Whether config.json names a sequence-classification architecture (served by transformers, not vLLM)."""
    from kfp_finetune.components._shared import storage

    if "config.json" not in listing.by_path():
        return False
    with tempfile.TemporaryDirectory() as folder:
        storage.download(listing, ["config.json"], folder)
        config = json.loads((Path(folder) / "config.json").read_text())
    return any(str(a).endswith("ForSequenceClassification") for a in config.get("architectures") or [])
