"""Bring a fine-tuning dataset into the run workspace (`datasets/<name>/`) as validated parquet shards.

Loads with the `datasets` library (sources.py: HF dataset repos, or json / jsonl / csv / parquet / arrow / txt
files or folders from s3://, https://, file:// and paths), selects a split expression (`train[:3000]`,
`train[90%:]`), maps columns to the canonical names of the dataset type, validates every row before writing
(validation.py; errors name the source file and line), optionally holds out an eval split, and writes `train/`
and `eval/` parquet shards plus a manifest. Instruct rows with a per-row system prompt are written as OpenAI
messages, the one torchtune shape that keeps it. Multimodal rows (images.py) are written with their images
embedded, classification rows (labels.py) with class ids; neither is packed. Rows stream from the Arrow cache on
disk to the shards, so memory does not grow with the dataset.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kfp_finetune.components._shared import cpus, storage
from kfp_finetune.components._shared.artifacts import (
    ArtifactLike,
    entry_name,
    remove_stale_temps,
    utc_now,
    workspace_relative,
    write_artifact,
)
from kfp_finetune.components._shared.contract import DatasetSplit
from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.workspace import (
    MANIFEST,
    area_dir,
    atomic_dir,
    partial_path,
    read_manifest,
    write_json_atomic,
)
from kfp_finetune.components.dataset_initialize import images, labels
from kfp_finetune.components.dataset_initialize.images import IMAGE_COLUMN, dropped_images_hint, embed_images
from kfp_finetune.components.dataset_initialize.packs import pack_train
from kfp_finetune.components.dataset_initialize.sources import (
    SOURCE_ROW,
    DatasetValidationError,
    Loaded,
    Source,
)
from kfp_finetune.components.dataset_initialize.validation import Schema, resolve_schema, validate

log = get_logger(__name__)
#: Dataset types whose rows are not packed, and why (logged).
NOT_PACKED = {
    "multimodal": "multimodal rows are not packed (a vision-language model trains on whole rows, its images "
    "turned into tokens by the model's own transform); the fine-tune step tokenizes them",
    "classification": "classification rows are not packed (torchtune's packs are causal-LM sequences; a sequence "
    "classifier takes one padded row per example, tokenized by its own engine)",
}


@dataclass
class DatasetInitResult:
    path: Path
    manifest: dict
    train_metadata: dict
    eval_metadata: dict
    skipped: bool


# --- writing -----------------------------------------------------------------------------------------------


def write_shards(ds, out_dir: Path, rows_per_shard: int) -> list[Path]:
    """Write `ds` as parquet shards `part-0000k-of-0000n.parquet`, batch by batch from the Arrow cache.

    Shards are written by a thread each (up to one per CPU): pyarrow encodes and compresses without the GIL.
    """
    from concurrent.futures import ThreadPoolExecutor

    out_dir.mkdir(parents=True, exist_ok=True)
    num_shards = max(1, math.ceil(len(ds) / rows_per_shard))
    shards = {
        out_dir / f"part-{index:05d}-of-{num_shards:05d}.parquet": ds.shard(
            num_shards, index, contiguous=True
        )
        for index in range(num_shards)
    }
    with ThreadPoolExecutor(max_workers=min(num_shards, os.cpu_count() or 1)) as pool:
        list(pool.map(lambda path: shards[path].to_parquet(str(path)), shards))
    return list(shards)


def _split_records(files: list[Path], root: Path) -> list[dict]:
    return [
        {
            "path": p.relative_to(root).as_posix(),
            "size": p.stat().st_size,
            "sha256": storage.hash_file(p).sha256,
        }
        for p in files
    ]


def _present_copy_matches(final: Path, fingerprint: str) -> dict | None:
    manifest = read_manifest(final)
    if not manifest or manifest.get("fingerprint") != fingerprint:
        return None
    records = [record for split in manifest["splits"].values() for record in split["files"]]
    damaged = storage.damaged_files(final, records)  # a size proves nothing: hashed once per change of a file
    if damaged:
        log.warning("%s: %s changed in place since written: building it again", final, ", ".join(damaged))
        return None
    return manifest


def _torchtune_hints(style: str) -> dict:
    """The torchtune dataset-builder arguments the written columns imply, for the fine-tune step."""
    if style in ("openai", "sharegpt"):
        return {
            "conversation_style": style,
            "conversation_column": "messages" if style == "openai" else "conversations",
        }
    if style == "text":
        return {"text_column": "text"}
    return {}


def _artifact_metadata(
    manifest: dict, split: str, final: Path, workspace: str, skipped: bool, packed: dict | None = None
) -> dict:
    info = manifest["splits"].get(split, {"num_rows": 0, "files": [], "source_split": ""})
    rel = workspace_relative(final, workspace)
    return DatasetSplit(
        workspace_path=f"{rel}/{split}",
        data_files=[f"{rel}/{f['path']}" for f in info["files"]],
        format="parquet",
        split=split,
        source_split=info["source_split"],
        num_rows=info["num_rows"],
        columns=manifest["columns"],
        dataset_type=manifest["dataset_type"],
        data_style=manifest["data_style"],
        **_torchtune_hints(manifest["data_style"]),
        column_map=manifest["column_map"],
        source_uri=manifest["source_uri"],
        revision=manifest["revision"] or "",
        commit_sha=manifest["commit_sha"] or "",
        files=info["files"],
        total_bytes=sum(f["size"] for f in info["files"]),
        reused_existing_copy=skipped,
        **(packed or {}),
        **images.split_metadata(manifest, info),
        **labels.split_metadata(manifest, info),
    ).to_metadata()


def initialize_dataset(
    source_uri: str,
    workspace_path: str,
    name: str = "",
    dataset_type: str = "instruct",
    column_map: dict[str, str] | None = None,
    train_split: str = "train",
    eval_split: str = "",
    eval_fraction: float = 0.0,
    seed: int = 42,
    data_format: str = "",
    subset: str = "",
    csv_delimiter: str = "",
    rows_per_shard: int = 100_000,
    num_proc: int | None = None,
    s3_endpoint_url: str = "",
    task_id: str = "",
    output_train: ArtifactLike | None = None,
    output_eval: ArtifactLike | None = None,
    base_model_path: str | os.PathLike | None = None,
    max_seq_len: int | None = None,
    train_on_input: bool | None = None,
    new_system_prompt: str | None = None,
    batch_size: int | None = None,
    gradient_accumulation_steps: int | None = None,
    image_dir: str = "",
    image_tag: str = "<image>",
    num_labels: int | None = None,
    label_names: list[str] | None = None,
) -> DatasetInitResult:
    """Load, validate and write the dataset at `source_uri` into `<workspace_path>/datasets/<name>-<task>/`
    (`<task>`: a hash of `task_id`, see names.instance_name); with `base_model_path`, also tokenize and pack
    the train split with that model's tokenizer, the masking `train_on_input` and the `new_system_prompt` the
    fine-tune step gets (packs.py; None: torchtune's defaults; `max_seq_len` None: chosen from the data).
    `num_proc` processes parse the sources and tokenize (None: as many as the pod can keep busy, _shared/cpus.py).
    `batch_size` / `gradient_accumulation_steps` (None: unset) are the fine-tune's, when the user set them: a train
    split too small for one optimizer step of them is refused here, before any training. Multimodal rows
    (images.py) read image files under `image_dir` and count `image_tag` placeholders; they are not packed.
    Classification rows (labels.py) have `num_labels` classes (None: from the data), named in `label_names` order
    when given (else string labels sorted); they are not packed."""
    column_map = dict(column_map or {})
    label_names = labels.check_parameters(dataset_type, num_labels, label_names)
    if eval_split and eval_fraction:
        raise ValueError("set either data_eval_split or data_eval_fraction, not both")
    if not 0 <= eval_fraction < 1:
        raise ValueError(f"data_eval_fraction must be in [0, 1), got {eval_fraction}")
    if rows_per_shard < 1:
        raise ValueError("rows_per_shard must be positive")
    if num_proc is not None and num_proc < 1:
        raise ValueError(f"num_proc must be at least 1, or -1 for as many as the pod's CPUs (got {num_proc})")
    processes = cpus.pod_processes() if num_proc is None else cpus.Processes(num_proc, "set by num_proc")
    log.info("parsing and tokenizing with %s", processes)
    num_proc = processes.count
    parsed = storage.parse_uri(source_uri)
    name = entry_name(name, parsed.repo_id or parsed.raw, task_id)
    final = area_dir(workspace_path, "datasets", name)
    listing = storage.list_files(parsed, repo_type="dataset", endpoint_url=s3_endpoint_url or None)
    source_uri = parsed.shown  # from here on the URI is only shown and recorded: never with its credentials
    params = [dataset_type, column_map, train_split, eval_split, eval_fraction, seed, data_format, subset,
              csv_delimiter]  # fmt: skip
    if dataset_type == "multimodal":  # only here: the fingerprints of text entries written before still match
        params += [image_dir, image_tag]
    if dataset_type == "classification":
        params += [num_labels, label_names]
    fingerprint = hashlib.sha256(
        json.dumps([listing.fingerprint(f.path for f in listing.files), params, rows_per_shard]).encode()
    ).hexdigest()

    def pack(manifest: dict, where: Callable[[int], str] | None = None) -> dict | None:
        if not (base_model_path and manifest["splits"].get("train", {}).get("num_rows")):
            return None
        if manifest["dataset_type"] in NOT_PACKED:
            log.info("no packs written: %s", NOT_PACKED[manifest["dataset_type"]])
            return None
        hints = {"dataset_type": manifest["dataset_type"], "data_style": manifest["data_style"],
                 **_torchtune_hints(manifest["data_style"])}  # fmt: skip
        return pack_train(
            final, manifest, hints, Path(base_model_path), workspace_path, max_seq_len, num_proc,
            train_on_input=bool(train_on_input), new_system_prompt=new_system_prompt, where=where,
        )  # fmt: skip

    manifest = _present_copy_matches(final, fingerprint)
    skipped = manifest is not None
    if skipped:
        log.info("datasets/%s already holds %s with a matching manifest: skipping", name, source_uri)
        packed = pack(manifest)  # rows named by their number in the written split: the sources are not read
    else:
        remove_stale_temps(final)
        manifest, packed = _build(
            listing, final, fingerprint, pack, source_uri=source_uri, name=name, dataset_type=dataset_type,
            column_map=column_map, train_split=train_split, eval_split=eval_split, eval_fraction=eval_fraction,
            seed=seed, data_format=data_format, subset=subset, csv_delimiter=csv_delimiter,
            rows_per_shard=rows_per_shard, num_proc=num_proc, image_dir=image_dir, image_tag=image_tag,
            num_labels=num_labels, label_names=label_names,
        )  # fmt: skip
    check_one_optimizer_step(manifest["splits"]["train"]["num_rows"], batch_size, gradient_accumulation_steps)
    train_meta = _artifact_metadata(manifest, "train", final, workspace_path, skipped, packed)
    eval_meta = _artifact_metadata(manifest, "eval", final, workspace_path, skipped)
    write_artifact(output_train, manifest, train_meta)
    write_artifact(output_eval, manifest, eval_meta)
    return DatasetInitResult(final, manifest, train_meta, eval_meta, skipped)


def check_one_optimizer_step(rows: int, batch_size: int | None, accumulation: int | None) -> None:
    """Refuse a train split that cannot fill one optimizer step of the batch settings the user set (None: unset,
    counted as 1). torchtune drops an incomplete last batch and a pack holds at least one row, so fewer rows than
    batch_size x gradient_accumulation_steps train no step on any number of devices, packed or not."""
    if batch_size is None and accumulation is None:
        return  # the fine-tune's defaults fit the batch to the data (run_length.py)
    needed = (batch_size or 1) * (accumulation or 1)
    if rows < needed:
        raise DatasetValidationError(
            f"{rows} training row(s) cannot fill one optimizer step of tune_batch_size={batch_size or 'unset'} x "
            f"tune_gradient_accumulation_steps={accumulation or 'unset'} ({needed} rows): the run would train "
            "nothing. Lower them (or leave them unset: -1), or add rows"
        )


def _build(
    listing: storage.Listing, final: Path, fingerprint: str, pack: Callable, **p
) -> tuple[dict, dict | None]:
    """Write the entry; then `pack(manifest, where)` while the sources can still be read, so the rows packing
    finds unfit are named by file and line (`where(i)`: written train row i)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    # Scratch (downloads + Arrow cache) lives beside the entry, on the workspace volume, and is always removed
    # (named like atomic_dir's temp dirs, so remove_stale_temps also clears one a killed run left).
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=f".{final.name}.tmp-scratch-") as scratch:
        raw = partial_path(final)  # downloads: kept across a killed or retried attempt, removed once written
        source = Source(p["source_uri"], listing, p["data_format"], p["subset"], Path(scratch), raw,
                        csv_delimiter=p["csv_delimiter"])  # fmt: skip
        where = p["source_uri"] + (f" (commit {listing.commit_sha})" if listing.commit_sha else "")
        log.info("loading split %r from %s", p["train_split"], where)
        train = source.load(p["train_split"], p["num_proc"])
        schema, rename = resolve_schema(p["dataset_type"], _data_columns(train), p["column_map"])
        if not schema.images and (hint := dropped_images_hint(_data_columns(train))):
            log.warning("%s", hint)
        train = _canonical(train, rename, schema, source.format)
        held_out, eval_source = None, ""
        if p["eval_split"]:
            log.info("loading eval split %r", p["eval_split"])
            held_out = _canonical(source.load(p["eval_split"], p["num_proc"]), rename, schema, source.format)
            eval_source = p["eval_split"]
        elif p["eval_fraction"]:
            if math.ceil(len(train.ds) * p["eval_fraction"]) >= len(train.ds):  # as `datasets` rounds it
                raise DatasetValidationError(
                    f"data_eval_fraction={p['eval_fraction']:g} of {len(train.ds)} row(s) leaves none to train on: "
                    "add rows, or set data_eval_fraction=0 (none held out) or data_eval_split"
                )
            # Rows keep their SOURCE_ROW through the shuffle, so errors still name the file's own lines.
            parts = train.ds.train_test_split(test_size=p["eval_fraction"], seed=p["seed"], shuffle=True)
            train, held_out = Loaded(parts["train"], train.where), Loaded(parts["test"], train.where)
            eval_source = f"{p['train_split']} (held-out {p['eval_fraction']:g}, seed {p['seed']})"
        validate(train.ds, schema, "train", train.where)
        if held_out is not None:
            validate(held_out.ds, schema, "eval", held_out.where)
        image_stats = {}
        if schema.images:  # after the text checks: the images of valid rows only are read

            def embed(split: str, loaded: Loaded) -> Loaded:
                ds, image_stats[split] = embed_images(
                    loaded.ds, split=split, style=schema.style, where=loaded.where, listing=listing, raw=raw,
                    image_dir=p["image_dir"], image_tag=p["image_tag"],
                )  # fmt: skip
                return Loaded(ds, loaded.where)

            train = embed("train", train)
            held_out = embed("eval", held_out) if held_out is not None else None
        table, label_counts = None, {}
        if schema.style == "classification":  # after every row is checked: ids and names across both splits
            train, held_out, table, label_counts = labels.class_ids(
                train, held_out, p["num_labels"], p["label_names"]
            )
        dataset_type, style = p["dataset_type"], schema.style
        outputs = {
            "train": _written(train.ds, schema),
            "eval": _written(held_out.ds, schema) if held_out else None,
        }
        if "system" in outputs["train"].column_names and schema.style in ("alpaca", "input_output"):
            dataset_type, style = "chat" if not schema.images else dataset_type, "openai"
            log.info(
                "the rows have a per-row system prompt (column %r): writing them as OpenAI messages (system, user, "
                "assistant), dataset_type %s, so torchtune's chat builders train on them with the same masking",
                {v: k for k, v in rename.items()}["system"],
                dataset_type,
            )
            outputs = {
                k: _as_messages(v, schema.style) if v is not None else None for k, v in outputs.items()
            }

        with atomic_dir(final) as tmp:
            splits = {}
            for split, source_split in (("train", p["train_split"]), ("eval", eval_source)):
                ds = outputs[split]
                if ds is None:
                    continue
                files = write_shards(ds, tmp / split, p["rows_per_shard"])
                splits[split] = {
                    "num_rows": len(ds),
                    "source_split": source_split,
                    "files": _split_records(files, tmp),
                }
                if split in image_stats:
                    stats = image_stats[split]
                    splits[split].update(num_images=stats.num_images, image_bytes=stats.image_bytes)
                splits[split].update({"label_counts": label_counts[split]} if split in label_counts else {})
                log.info("datasets/%s/%s: %d rows in %d shard(s)", final.name, split, len(ds), len(files))
            manifest = {
                "kind": "dataset",
                "name": final.name,
                "source_uri": p["source_uri"],
                "revision": listing.revision,
                "commit_sha": listing.commit_sha,
                "source_format": source.format or "hub",
                "fingerprint": fingerprint,
                "dataset_type": dataset_type,
                "data_style": style,
                "columns": list(outputs["train"].column_names),
                "column_types": {c: str(t) for c, t in outputs["train"].features.items()},
                "column_map": {v: k for k, v in rename.items() if k != v},
                "seed": p["seed"],
                "eval_fraction": p["eval_fraction"],
                "splits": splits,
                "created_at": utc_now(),
            }
            if schema.images:
                manifest.update(image_column=IMAGE_COLUMN, image_tag=p["image_tag"])
            manifest.update(labels.manifest_keys(table) if table is not None else {})
            write_json_atomic(tmp / MANIFEST, manifest)
        packed = pack(manifest, lambda row: train.where(train.ds[row][SOURCE_ROW]))
    shutil.rmtree(raw, ignore_errors=True)
    return manifest, packed


def _data_columns(loaded: Loaded) -> list[str]:
    return [c for c in loaded.ds.column_names if c != SOURCE_ROW]


def _canonical(loaded: Loaded, rename: dict[str, str], schema: Schema, source_format: str) -> Loaded:
    """Keep the type's columns only, under their canonical names (saying which are dropped); blank lines of
    .txt corpora are separators, not rows."""
    columns = _data_columns(loaded)
    missing = [old for old, new in rename.items() if new in schema.columns and old not in columns]
    if missing:  # an eval split without a column the train split has
        raise DatasetValidationError(
            f"a split lacks column(s) {missing} that the train split has (it has {columns}): give every split "
            "the same columns"
        )
    dropped = [c for c in columns if c not in rename]
    if dropped:
        log.info("columns not used by %s data, dropped: %s", schema.style, ", ".join(dropped))
    ds = loaded.ds.select_columns([*(c for c in rename if c in columns), SOURCE_ROW])
    renames = {old: new for old, new in rename.items() if old != new}
    ds = ds.rename_columns(renames) if renames else ds
    if source_format == "text" and schema.style == "text":
        kept = ds.filter(lambda texts: [bool(t.strip()) for t in texts], input_columns="text", batched=True)
        if len(kept) < len(ds):
            log.info("skipped %d blank line(s) of the text files", len(ds) - len(kept))
        ds = kept
    return Loaded(ds, loaded.where)


def _written(ds, schema: Schema):
    """The rows as written: canonical columns in schema order, without the source-row numbers."""
    columns = schema.columns + schema.optional + ((IMAGE_COLUMN,) if schema.images else ())
    return ds.select_columns([c for c in columns if c in ds.column_names])


def _as_messages(ds, style: str):
    """Instruct rows as OpenAI messages: the row's system prompt (when not blank), the user turn (alpaca: the
    instruction, then the input after a blank line when there is one), the assistant turn (the output)."""

    def convert(batch: dict) -> dict:
        conversations = []
        for i, output in enumerate(batch["output"]):
            if style == "alpaca":
                extra = (batch.get("input") or [None] * len(batch["output"]))[i]
                user = batch["instruction"][i] + (f"\n\n{extra}" if extra and extra.strip() else "")
            else:
                user = batch["input"][i]
            system = (batch.get("system") or [None] * len(batch["output"]))[i]
            turns = [{"role": "system", "content": system}] if system and system.strip() else []
            turns += [{"role": "user", "content": user}, {"role": "assistant", "content": output}]
            conversations.append(turns)
        return {"messages": conversations}

    return ds.map(convert, batched=True, remove_columns=[c for c in ds.column_names if c != IMAGE_COLUMN])


def iter_rows(paths: list[Path]) -> Iterator[dict]:
    """Rows of written parquet shards, in order (for tests and later steps that stream them)."""
    import pyarrow.parquet as pq

    for path in paths:
        for batch in pq.ParquetFile(path).iter_batches():
            yield from batch.to_pylist()
