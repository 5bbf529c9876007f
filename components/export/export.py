"""Export a fine-tuned model from the workspace to where serving and registries read it.

1. Check everything that can be checked before a byte moves: format against what training produced, dtype,
   destination URI, credentials in the environment. An adapter run saves only its adapter (no GPU idles while
   the model is merged at each epoch end): a merged export merges it into the base model first, on CPU, into the
   run folder's `merged/` (_shared/torchtune/merge.py), which a later export or evaluation reuses.
2. Stage the export in the workspace (`<run>/exports/.<task>.tmp-*`): the merged HF folder and/or the PEFT
   adapter, hard-linked (no copy) unless the weights are converted to another dtype; then the model card
   (README.md) and `checksums.sha256` (sha256sum format, every other file).
3. Publish with storage.publish_directory: resumable, verified by reading sizes and checksums back, a no-op
   when the destination already holds this content, refused when it holds other content (unless overwrite).
   `checksums.sha256` is also the export's manifest, recognised by its first line (which names the run, task
   and time of the export that wrote it): overwrite replaces or deletes only files an export's manifest at the
   destination lists; files no export wrote there are left alone, and one in the way (a user's README.md,
   config.json or own checksums.sha256) fails the export naming it, whatever overwrite says.

Layout: format=merged or adapter puts that folder at the root; format=both puts the merged model at the root
(transformers loads it as is) and the adapter in `adapter/` (never beside the merged weights: transformers
would treat a root adapter_config.json as a PEFT model and load the base instead).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kfp_finetune.components._shared import engines, serving, storage
from kfp_finetune.components._shared.artifacts import ArtifactLike, entry_path, write_artifact
from kfp_finetune.components._shared.contract import ArtifactInput, EvalMetrics, ExportedModel, TunedModel
from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.export_settings import DTYPES, dtype_problem, format_problem
from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.names import instance_name
from kfp_finetune.components._shared.safetensors_header import read_tensor_entries
from kfp_finetune.components.export.model_card import CardInputs, render_card

log = get_logger(__name__)

CHECKSUMS = "checksums.sha256"
CARD = "README.md"
ADAPTER_SUBDIR = "adapter"
_INDEX_SUFFIX = ".safetensors.index.json"


class ExportError(ValueError):
    """The export cannot be done as asked; the message says why and what to change."""


@dataclass
class ExportResult:
    destination: str
    state: str
    files: dict[str, dict]  # path in the export -> {size, sha256}
    manifest_sha256: str
    uploaded: list[str]
    metadata: dict

    @property
    def total_bytes(self) -> int:
        return sum(f["size"] for f in self.files.values())


def normalize_dtype(dtype: str) -> str:
    """'' (keep the trained dtype) or a torch dtype name; raise ExportError for anything else."""
    problem = dtype_problem(dtype)
    if problem:
        raise ExportError(str(problem))
    key = (dtype or "").strip().lower()
    return DTYPES[key] if key else ""


def check_request(
    model: TunedModel, fmt: str, dtype: str, destination: str, oci_base_image: str = ""
) -> storage.StorageUri:
    """Validate format/dtype/destination/credentials against the model; nothing is written."""
    problem = format_problem(fmt)
    if problem:
        raise ExportError(str(problem))
    normalize_dtype(dtype)
    method = model.method or "?"
    if fmt in ("adapter", "both") and not model.adapter_path:
        why = (
            "a full fine-tune has no adapter"
            if method == "full"
            else "the model artifact has no adapter_path (connect torchtune-finetune's model output)"
        )
        raise ExportError(
            f"export_format={fmt} needs a PEFT adapter, but {why} (tune_method={method}): set export_format=merged."
        )
    if fmt in ("merged", "both") and not model.merged_path and not (model.adapter_path and model.run_dir):
        raise ExportError(
            f"export_format={fmt} needs merged weights, but the model has neither merged weights nor an adapter "
            "and its fine-tune run folder to merge them from (connect torchtune-finetune's model output)."
        )
    try:
        uri = storage.parse_uri(destination)
    except ValueError as err:
        raise ExportError(str(err)) from err
    if uri.scheme not in ("s3", "hf", "file", "oci"):
        raise ExportError(
            f"cannot export to {uri.shown!r}: use s3://bucket/prefix, hf://org/repo, oci://registry/repository:tag "
            "or a path"
        )
    if uri.scheme == "oci":
        if uri.revision and uri.revision.startswith("sha256:"):
            raise ExportError(
                f"export_destination {uri.shown} names a digest: an export pushes to a tag, e.g. "
                f"oci://{uri.bucket}/{uri.repo_id}:v1"
            )
        try:
            storage.parse_image(oci_base_image) if oci_base_image else None
        except ValueError as err:
            raise ExportError(str(err)) from err
    try:
        storage.refuse_root(uri)  # never a whole disk or bucket
    except storage.StorageError as err:
        raise ExportError(str(err)) from err
    storage.require_credentials(uri)
    return uri


def export_model(
    *,
    workspace: str | os.PathLike,
    model_metadata: dict,
    destination: str,
    format: str = "merged",
    dtype: str = "",
    eval_metrics: dict | None = None,
    overwrite: bool = False,
    s3_endpoint_url: str = "",
    hf_private: bool = True,
    oci_base_image: str = "",
    run_name: str = "",
    run_id: str = "",
    task_name: str = "export",
    max_workers: int = 8,
    output: ArtifactLike | None = None,
    task_id: str = "",
    serving_output: ArtifactLike | None = None,
) -> ExportResult:
    """Stage, describe and publish the model; fill `output` (uri = destination) with what was exported.
    `model_metadata` is the tuned model's (contract.TunedModel), `eval_metrics` a Metrics output's."""
    model = TunedModel.from_metadata(model_metadata, input_name="model")
    uri = check_request(model, format, dtype, destination, oci_base_image)
    # Shown in the model card and recorded in metadata: never with a credential an upstream URI carried.
    model.base_model = storage.redact_uri(model.base_model) if model.base_model else ""
    model.dataset_source = storage.redact_uri(model.dataset_source) if model.dataset_source else ""
    torch_dtype = normalize_dtype(dtype)
    workspace = Path(workspace)
    if format in ("merged", "both") and not model.merged_path:
        model.merged_path = _merge_adapter(workspace, model)
    sources = _sources(workspace, model, format)
    run_dir = _run_dir(workspace, model, sources)
    staging_root = run_dir / "exports"
    staging_root.mkdir(parents=True, exist_ok=True)
    # Named from this task's own KFP id: another export of the same model in this run stages beside us untouched.
    staging_name = instance_name(task_name, task_id)
    for stale in staging_root.glob(f".{staging_name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)  # left by an interrupted attempt of this task
    stage = staging_root / f".{staging_name}.tmp-{uuid.uuid4().hex[:8]}"
    metrics = EvalMetrics.from_metadata(eval_metrics or {}, input_name="metrics").numeric()
    try:
        layout, staged_from = _stage(stage, sources, torch_dtype)
        card = CardInputs(
            title=_title(uri, model),
            model=model,
            format=format,
            dtype=torch_dtype,
            layout=layout,
            training_config=_training_config(workspace, model),
            eval_metrics=metrics,
            run_name=run_name,
            run_id=run_id,
            task_name=task_name,
        )
        (stage / CARD).write_text(render_card(card))
        identity = _identity(run_name, run_id, task_name, task_id)
        hashes = _write_checksums(
            stage, _recorded(staged_from, run_dir, model_metadata), identity, max_workers
        )
        log.info("staged %d files (%s) for %s", len(hashes), format, uri.shown)
        published = storage.publish_directory(
            stage,
            uri,
            overwrite=overwrite,
            manifest=CHECKSUMS,
            endpoint_url=s3_endpoint_url or None,
            private=hf_private,
            base_image=oci_base_image,
            commit_message=f"Export {format} model from kfp-finetune run {run_name or run_id or 'local'}",
            max_workers=max_workers,
            hashes=hashes,
        )
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        with contextlib.suppress(OSError):
            staging_root.rmdir()  # only when empty: another export task may be staging beside us
    # From what was published: a destination already holding this content keeps its manifest, which names the
    # export that wrote it.
    files = {r.path: {"size": r.size, "sha256": r.sha256} for r in published.records}
    manifest_sha256 = files[CHECKSUMS]["sha256"]
    training = {"final_loss": model.final_loss, "min_loss": model.min_loss}
    metadata = ExportedModel(
        destination=uri.shown,
        format=format,
        dtype=torch_dtype or "as trained",
        state=published.state,
        files=files,
        num_files=len(files),
        total_bytes=published.total_bytes,
        uploaded_files=len(published.uploaded),
        manifest_sha256=manifest_sha256,
        base_model=model.base_model,
        base_model_revision=model.base_model_revision,
        method=model.method,
        dataset_source=model.dataset_source,
        metrics={**{k: v for k, v in training.items() if v is not None}, **metrics},
        layout=layout,
        commit_sha=(published.commit_sha or "") if uri.scheme == "hf" else "",
        image_digest=(published.commit_sha or "") if uri.scheme == "oci" else "",
        run_id=run_id,
        run_name=run_name,
    ).to_metadata()
    if output is not None:
        write_artifact(output, {"kind": "exported-model", **metadata}, metadata)
        # After writing the manifest: KFP derives the artifact's local path from its uri. Not for s3://: KFP's
        # launcher uploads an output artifact to an object-store uri and fails unless it is under the pipeline
        # root's bucket, so an S3 destination is recorded in metadata["destination"] and the uri stays KFP's.
        if uri.scheme != "s3":
            output.uri = uri.path if uri.scheme == "file" else uri.shown
    _write_serving(serving_output, uri, format, published.commit_sha or "", files, model.task)
    log.info(
        "exported %s to %s: %s, %d files, %s uploaded",
        format, uri.shown, published.state, len(files), len(published.uploaded),
    )  # fmt: skip
    return ExportResult(uri.shown, published.state, files, manifest_sha256, published.uploaded, metadata)


def _write_serving(
    artifact: ArtifactLike | None, uri: storage.StorageUri, fmt: str, pin: str, files: dict, task: str
) -> None:
    """The KServe InferenceService serving this export (_shared/serving.py), as the `serving` output; a note
    saying why instead when the export cannot be served as it is (a path, an adapter alone)."""
    if artifact is None:
        return
    weights = sum(f["size"] for path, f in files.items() if "/" not in path and path.endswith(".safetensors"))
    try:
        manifest = serving.inference_service(
            storage.last_name(uri), serving.storage_uri(uri.shown, pin), weights, task=task,
            adapter_only=fmt == "adapter",
        )  # fmt: skip
    except serving.NotServable as why:
        log.info("no InferenceService for this export: %s", why)
        Path(artifact.path).parent.mkdir(parents=True, exist_ok=True)
        Path(artifact.path).write_text(f"# not servable as exported: {why}\n")
        artifact.metadata.update(servable=False, reason=str(why))
        return
    Path(artifact.path).parent.mkdir(parents=True, exist_ok=True)
    Path(artifact.path).write_text(serving.to_yaml(manifest))
    model = manifest["spec"]["predictor"]["model"]
    artifact.metadata.update(
        servable=True, name=manifest["metadata"]["name"], storage_uri=model["storageUri"],
        gpus=int(model["resources"]["limits"]["nvidia.com/gpu"]),
    )  # fmt: skip
    log.info("KServe InferenceService %s: %s", manifest["metadata"]["name"], model["storageUri"])


def _sources(workspace: Path, meta: TunedModel, fmt: str) -> dict[str, tuple[str, Path]]:
    """Export folder ("" = root) -> (kind, source folder in the workspace)."""
    wanted = {
        "merged": {"": ("merged", "merged_path")},
        "adapter": {"": ("adapter", "adapter_path")},
        "both": {"": ("merged", "merged_path"), ADAPTER_SUBDIR: ("adapter", "adapter_path")},
    }[fmt]
    sources = {}
    for folder, (kind, key) in wanted.items():
        path = workspace / getattr(meta, key)
        if not path.is_dir():
            raise ExportError(f"the {kind} model folder {path} ({key}) is not in the workspace")
        sources[folder] = (kind, path)
    return sources


def _merge_adapter(workspace: Path, meta: TunedModel) -> str:
    """The run's merged model folder (workspace-relative), merged from its adapter unless an earlier export or
    evaluation already did: adapter runs save no merged weights while training (no GPU waits for it)."""
    base_dir = entry_path(workspace, meta.base_model_path) if meta.base_model_path else None
    if base_dir is None or not base_dir.is_dir():
        raise ExportError(
            f"export_format=merged needs the base model to merge the adapter into, but the fine-tune's base model "
            f"folder {base_dir or '(base_model_path not recorded)'} is not in this step's workspace or volumes: "
            "mount the volume holding it, or set export_format=adapter"
        )
    log.info("the run saved only its adapter: merging it into the base model %s on CPU", base_dir)
    run_dir = workspace / meta.run_dir
    try:
        merged = engines.face(meta.engine).merged_model_dir(run_dir, base_dir)
    except ConfigError as err:
        raise ExportError(f"export_format=merged: {err}") from err
    return merged.relative_to(workspace).as_posix()


def _run_dir(workspace: Path, meta: TunedModel, sources: dict[str, tuple[str, Path]]) -> Path:
    if meta.run_dir:
        return workspace / meta.run_dir
    return next(iter(sources.values()))[1].parent


def _title(uri: storage.StorageUri, meta: TunedModel) -> str:
    if uri.scheme == "hf":
        return uri.repo_id.split("/")[-1]
    base = (meta.base_model or "model").rstrip("/").split("/")[-1]
    return f"{base} ({meta.method or 'fine-tuned'})"


def _training_config(workspace: Path, meta: TunedModel) -> dict:
    """The run's resolved config, when it is in the workspace (for the hyperparameters)."""
    return engines.face(meta.engine).read_resolved_config(workspace / meta.run_dir) if meta.run_dir else {}


def _stage(
    stage: Path, sources: dict[str, tuple[str, Path]], torch_dtype: str
) -> tuple[dict[str, str], dict[str, Path]]:
    """Stage the folders; returns the layout and, for every staged file, the workspace file it came from."""
    layout, staged_from = {}, {}
    for folder, (kind, source) in sources.items():
        target = stage / folder if folder else stage
        converted = 0
        for path in sorted(p for p in source.rglob("*") if p.is_file()):
            rel = path.relative_to(source)
            if rel.as_posix() in (CARD, CHECKSUMS):
                continue  # ours to write; a copied base-model README would describe the wrong model
            out = target / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            staged_from[out.relative_to(stage).as_posix()] = path
            if torch_dtype and path.name.endswith(".safetensors"):
                converted += _convert_safetensors(path, out, torch_dtype)
            else:
                _link(path, out)
        if torch_dtype:
            _update_config_and_index(target, torch_dtype)
        what = "merged model (HF safetensors)" if kind == "merged" else "PEFT adapter"
        layout[folder] = what + (f", {converted} tensors converted to {torch_dtype}" if converted else "")
    return layout, staged_from


def _recorded(staged_from: dict[str, Path], run_dir: Path, meta: dict) -> dict[str, storage.FileHash]:
    """The hashes torchtune-finetune recorded for the staged files' sources (metadata `files`, run-dir-relative);
    whether each still holds is checked against the staged file (size and mtime) when it is used."""
    recorded = meta.get("files") if isinstance(meta.get("files"), dict) else {}
    known = {}
    for staged, source in staged_from.items():
        try:
            entry = recorded.get(source.relative_to(run_dir).as_posix())
        except ValueError:  # a source outside the run folder: nothing recorded for it
            continue
        digest = storage.FileHash.from_dict(entry) if isinstance(entry, dict) else None
        if digest is not None:
            known[staged] = digest
    return known


def _link(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:  # filesystems without hard links
        shutil.copy2(source, target)


def _convert_safetensors(source: Path, target: Path, torch_dtype: str) -> int:
    """Write `source` with its floating-point tensors in `torch_dtype`; return how many changed. Unchanged
    files are linked, so a no-op conversion costs nothing."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    dtype = getattr(torch, torch_dtype)
    with safe_open(str(source), framework="pt") as f:
        header = f.metadata() or {}
        tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    changed = sum(1 for t in tensors.values() if t.is_floating_point() and t.dtype != dtype)
    if not changed:
        _link(source, target)
        return 0
    converted = {
        name: (t.to(dtype) if t.is_floating_point() else t).contiguous() for name, t in tensors.items()
    }
    save_file(converted, str(target), metadata={"format": "pt", **header})
    return changed


def _update_config_and_index(folder: Path, torch_dtype: str) -> None:
    """Keep config.json's dtype and each index's total_size true to the converted weights. Linked files are
    replaced, never edited in place (that would change the training run's copy too)."""
    config = folder / "config.json"
    if config.is_file():
        data = json.loads(config.read_text())
        data["torch_dtype"] = torch_dtype
        if "dtype" in data:  # newer transformers write `dtype`
            data["dtype"] = torch_dtype
        _replace_json(config, data)
    for index in folder.glob(f"*{_INDEX_SUFFIX}"):
        data = json.loads(index.read_text())
        shards = sorted(set(data.get("weight_map", {}).values()))
        data.setdefault("metadata", {})["total_size"] = sum(_tensor_bytes(folder / s) for s in shards)
        _replace_json(index, data)


def _tensor_bytes(path: Path) -> int:
    """Bytes of tensor data in a safetensors file, from its header (what HF indexes call total_size)."""
    return sum(v["data_offsets"][1] - v["data_offsets"][0] for v in read_tensor_entries(path).values())


def _replace_json(path: Path, data: Any) -> None:
    path.unlink()
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _identity(run_name: str, run_id: str, task_name: str, task_id: str) -> str:
    """Which export wrote a manifest: the first line of checksums.sha256 names its run, task and time."""
    run = " ".join(part for part in (run_name, f"(id {run_id})" if run_id else "") if part) or "outside KFP"
    task = task_name + (f" (id {task_id})" if task_id else "")
    return f"run {run}, task {task}, at {datetime.datetime.now(datetime.UTC):%Y-%m-%dT%H:%M:%SZ}"


def _write_checksums(
    stage: Path, known: dict[str, storage.FileHash], identity: str, max_workers: int
) -> dict[str, storage.FileHash]:
    """Write checksums.sha256 (sha256sum format, its first line naming this export: `sha256sum -c` skips it, and
    it tells an export's manifest from a user's); return every file's hash, itself included. A hash recorded
    after training is reused while the staged file still has its size and mtime; only the other files (ones the
    export wrote: converted weights, config edits, the model card; or ones changed since) are hashed."""
    paths = sorted(p for p in stage.rglob("*") if p.is_file())
    reused = {
        p: known[p.relative_to(stage).as_posix()] for p in paths if p.relative_to(stage).as_posix() in known
    }
    reused = {p: h for p, h in reused.items() if h.matches(p)}
    fresh = storage.hash_files([p for p in paths if p not in reused], max_workers=max_workers)
    if fresh:
        log.info("hashed %d files the export wrote or that changed since training; reused %d recorded hashes",
                 len(fresh), len(reused))  # fmt: skip
    hashes = {p.relative_to(stage).as_posix(): h for p, h in (reused | fresh).items()}
    (stage / CHECKSUMS).write_text(storage.manifest_text({p: h.sha256 for p, h in hashes.items()}, identity))
    hashes[CHECKSUMS] = storage.hash_file(stage / CHECKSUMS)
    return dict(sorted(hashes.items()))


def run_component(**params: Any) -> ExportResult:
    """What the component body calls with all its parameters."""
    metrics = params.get("metrics")
    return export_model(
        workspace=params["workspace_path"],
        model_metadata=ArtifactInput.of(params["model"]).metadata,
        destination=params["destination"],
        format=params["format"],
        dtype=params["dtype"],
        eval_metrics=ArtifactInput.of(metrics).metadata if metrics is not None else None,
        overwrite=params["overwrite"],
        s3_endpoint_url=params["s3_endpoint_url"],
        hf_private=params["hf_private"],
        oci_base_image=params.get("oci_base_image", ""),
        run_name=params["run_name"],
        run_id=params["run_id"],
        task_name=params["task_name"],
        max_workers=params["max_workers"],
        output=params["exported"],
        task_id=params.get("task_id", ""),
        serving_output=params.get("serving"),
    )
