"""Register an exported model in the Kubeflow Model Registry, with its lineage (issue 29 item 3).

1. Decide the names: the model's (registry_model_name, else the export destination's last part) and the version's
   (registry_version, else the KFP run's name: one version per run).
2. Connect with the token (_shared/model_registry.py); the client's first read checks it.
3. A version of that name already registered with this very export (its artifact URI and export manifest) is this
   step run again: nothing is written. Any other version of that name is refused before anything is written.
4. Register: the model (found or created), the version with its lineage as custom properties — base model and
   its digest, dataset and its sha256, every evaluation metric with its confidence interval, the gate's verdict,
   the KFP run, the report — and the model artifact (URI pinned to the exported content, format).
5. Read the version and artifact back and check what was written is what the registry holds.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

from kfp_finetune.components._shared import model_registry, storage
from kfp_finetune.components._shared.artifacts import ArtifactLike, write_artifact
from kfp_finetune.components._shared.contract import (
    ArtifactInput,
    BaseModel,
    DatasetSplit,
    EvalMetrics,
    ExportedModel,
)
from kfp_finetune.components._shared.errors import SettingError
from kfp_finetune.components._shared.logs import get_logger

log = get_logger(__name__)

# Model Registry's model formats (ModelArtifact.modelFormatName), by export format: the merged folder is a
# safetensors model; an adapter alone is a PEFT adapter.
_FORMATS = {"merged": ("safetensors", "1"), "both": ("safetensors", "1"), "adapter": ("peft", "1")}


@dataclass
class Registration:
    state: str  # registered | already registered
    address: str
    model_name: str
    version: str
    registered_model_id: str
    model_version_id: str
    model_artifact_id: str
    artifact_uri: str
    properties: dict[str, Any]

    def metadata(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "properties"} | {"properties": self.properties}


def artifact_uri(exported: ExportedModel) -> str:
    """Where the registered version's bytes are, pinned to them where the destination can be: an OCI image by its
    manifest digest, a hub repo by its commit."""
    return storage.pinned_uri(exported.destination, exported.image_digest or exported.commit_sha)


def files_sha256(files: list[dict] | dict[str, dict]) -> str:
    """sha256 of the files' sha256sum-format listing (`<sha256>  <path>` lines, sorted by path): one digest for a
    folder's exact content."""
    entries = files.items() if isinstance(files, dict) else ((f["path"], f) for f in files)
    listing = "".join(f"{entry['sha256']}  {path}\n" for path, entry in sorted(entries))
    return hashlib.sha256(listing.encode()).hexdigest()


def lineage(
    exported: ExportedModel, metrics: EvalMetrics, base: BaseModel, train: DatasetSplit, report_uri: str,
    run_id: str, run_name: str,
) -> dict[str, Any]:  # fmt: skip
    """The version's custom properties: where it came from and how good it is."""
    properties: dict[str, Any] = {
        "kfp_run_id": run_id,
        "kfp_run_name": run_name,
        "base_model": storage.redact_uri(base.source_uri or exported.base_model),
        "base_model_revision": base.pinned_revision or exported.base_model_revision,
        "base_model_files_sha256": files_sha256(base.files) if base.files else "",
        "dataset": storage.redact_uri(train.source_uri or exported.dataset_source),
        "dataset_revision": train.commit_sha or train.revision,
        "dataset_sha256": files_sha256(train.files) if train.files else "",
        "dataset_rows": train.num_rows,
        "method": exported.method,
        "export_format": exported.format,
        "export_dtype": exported.dtype,
        "export_destination": exported.destination,
        "export_manifest_sha256": exported.manifest_sha256,
        "image_digest": exported.image_digest,
        "commit_sha": exported.commit_sha,
        "report_uri": report_uri,
        "gate_passed": metrics.passed,
    }
    # Every evaluation number as evaluate wrote it: tuned_* / base_* scores, *_improvement with *_ci_low / _high.
    properties |= {name: value for name, value in metrics.numeric().items() if name != "passed"}
    return {k: v for k, v in properties.items() if v not in ("", None) and not _nan(v)}


def _nan(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def register(
    *,
    address: str,
    exported: ExportedModel,
    metrics: EvalMetrics,
    base: BaseModel,
    train: DatasetSplit,
    report_uri: str = "",
    model_name: str = "",
    version: str = "",
    author: str = "kfp-finetune",
    description: str = "",
    run_id: str = "",
    run_name: str = "",
) -> Registration:
    address = model_registry.check_address(address)
    if not metrics.passed:
        raise SettingError(
            "metrics", "the quality gate did not pass: a model that failed it is never registered"
        )
    model_name = model_name.strip() or storage.last_name(exported.destination)
    version = version.strip() or run_name or run_id
    if not version:
        raise SettingError("registry_version", "is empty and there is no KFP run name to use: set one")
    uri = artifact_uri(exported)
    properties = lineage(exported, metrics, base, train, report_uri, run_id, run_name)
    client = model_registry.connect(address, author)
    with model_registry.mapped(address, f"register {model_name} {version}"):
        known = model_registry.existing_version(client, model_name, version)
        if known is not None:
            return _registered_before(client, address, model_name, version, known, uri, exported)
        model_format, format_version = _FORMATS.get(exported.format, ("safetensors", "1"))
        client.register_model(
            model_name, uri, model_format_name=model_format, model_format_version=format_version, version=version,
            version_description=description or f"fine-tuned by kfp-finetune run {run_name or run_id}",
            metadata=properties,
        )  # fmt: skip
        return _read_back(client, address, model_name, version, uri, properties, "registered")


def _registered_before(
    client: Any, address: str, model_name: str, version: str, known: Any, uri: str, exported: ExportedModel
) -> Registration:
    held = known.custom_properties or {}
    if (
        held.get("export_manifest_sha256") != exported.manifest_sha256
        or _artifact(client, model_name, version).uri != uri
    ):
        raise SettingError(
            "registry_version",
            f"{version!r} of model {model_name!r} is already registered at {address} with another model "
            f"(run {held.get('kfp_run_name') or held.get('kfp_run_id') or 'unknown'}): set a new registry_version",
        )
    log.info(
        "%s %s is already registered with this export (a retried step): nothing written", model_name, version
    )
    return _read_back(client, address, model_name, version, uri, dict(held), "already registered")


def _artifact(client: Any, model_name: str, version: str) -> Any:
    artifact = client.get_model_artifact(model_name, version)
    if artifact is None:
        raise model_registry.RegistryError(f"{model_name} {version} has no model artifact in the registry")
    return artifact


def _read_back(
    client: Any, address: str, model_name: str, version: str, uri: str, properties: dict, state: str
) -> Registration:
    model = client.get_registered_model(model_name)
    held = client.get_model_version(model_name, version)
    artifact = _artifact(client, model_name, version)
    stored = held.custom_properties or {}
    differs = sorted(k for k, v in properties.items() if stored.get(k) != v)
    if artifact.uri != uri or differs:
        raise model_registry.RegistryError(
            f"read back from {address}, {model_name} {version} does not hold what was registered "
            f"(artifact {artifact.uri!r}; properties {differs[:5]})"
        )
    log.info("%s %s %s at %s: version %s, artifact %s", state, model_name, version, address, held.id, uri)
    return Registration(state, address, model_name, version, model.id, held.id, artifact.id, uri, stored)


def run_component(**params: Any) -> Registration:
    """What the component body calls with all its parameters."""
    registration = register(
        address=params["address"],
        exported=ExportedModel.from_metadata(
            ArtifactInput.of(params["exported"]).metadata, input_name="exported"
        ),
        metrics=EvalMetrics.from_metadata(ArtifactInput.of(params["metrics"]).metadata, input_name="metrics"),
        base=BaseModel.from_metadata(
            ArtifactInput.of(params["base_model"]).metadata, input_name="base_model"
        ),
        train=DatasetSplit.from_metadata(
            ArtifactInput.of(params["train_data"]).metadata, input_name="train_data"
        ),
        report_uri=storage.redact_uri(getattr(params.get("eval_report"), "uri", "") or ""),
        model_name=params["model_name"],
        version=params["version"],
        author=params["author"],
        description=params["description"],
        run_id=params["run_id"],
        run_name=params["run_name"],
    )
    output: ArtifactLike = params["registered"]
    write_artifact(
        output, {"kind": "model-registry-version", **registration.metadata()}, registration.metadata()
    )
    output.uri = (
        f"{registration.address}/api/model_registry/v1alpha3/model_versions/{registration.model_version_id}"
    )
    return registration
