"""Bring a fine-tuning dataset into the run workspace (`datasets/<name>/`) as validated parquet shards.

Loads with the `datasets` library (HF dataset repos, or json / jsonl / csv / parquet / arrow files or folders
from s3://, https://, file:// and paths; JSON Lines files are streamed into its Arrow format by pyarrow), selects a split expression (`train[:3000]`, `train[90%:]`), maps
columns to the canonical names of the dataset type, validates every row before writing, optionally holds out
an eval split, and writes `train/` and `eval/` parquet shards plus a manifest. Rows stream from the Arrow cache
on disk to the shards, so memory does not grow with the dataset.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from kfp_finetune.components._shared import storage
from kfp_finetune.components._shared.artifacts import (
    ArtifactLike,
    entry_name,
    remove_stale_temps,
    utc_now,
    workspace_relative,
    write_artifact,
)
from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.workspace import (
    MANIFEST,
    area_dir,
    atomic_dir,
    read_manifest,
    sha256_file,
    write_json_atomic,
)

log = get_logger(__name__)

DATASET_TYPES = ("instruct", "chat", "text")
FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet", ".arrow": "arrow"}
FORMAT_PREFERENCE = ("parquet", "arrow", "json", "csv")  # typed formats first
COMPRESSION_SUFFIXES = (".gz", ".bz2", ".xz", ".zst")
# Files beside the data that are not data (HF dataset cards, save_to_disk metadata).
NOT_DATA = ("README.md", ".gitattributes", "dataset_info.json", "state.json", "dataset_dict.json")
MAX_REPORTED_ROWS = 5
OPENAI_ROLES = {"system", "user", "assistant", "tool", "ipython"}
SHAREGPT_ROLES = {"system", "human", "gpt", "tool", "function_call", "observation"}


class DatasetValidationError(ValueError):
    """The data does not fit the dataset type; the message names the columns and first bad rows."""


@dataclass
class Schema:
    """What a dataset type needs: `style` names the variant; `columns` the canonical column names written."""

    style: str
    columns: tuple[str, ...]
    optional: tuple[str, ...] = ()


@dataclass
class DatasetInitResult:
    path: Path
    manifest: dict
    train_metadata: dict
    eval_metadata: dict
    skipped: bool


# --- source ------------------------------------------------------------------------------------------------


def detect_format(paths: list[str], explicit: str = "") -> tuple[str, list[str]]:
    """The `datasets` packaged builder for these files and the data files among them."""
    candidates = [p for p in paths if PurePosixPath(p).name not in NOT_DATA]

    def suffix(path: str) -> str:
        pure = PurePosixPath(path)
        if pure.suffix in COMPRESSION_SUFFIXES:
            pure = pure.with_suffix("")
        return pure.suffix.lower()

    if explicit:
        explicit = {"jsonl": "json"}.get(explicit, explicit)
        if explicit not in set(FORMATS.values()):
            raise ValueError(f"data_format {explicit!r} is not one of json, jsonl, csv, parquet, arrow")
        matching = [p for p in candidates if FORMATS.get(suffix(p)) == explicit]
        return explicit, matching or candidates
    formats = {FORMATS[suffix(p)] for p in candidates if suffix(p) in FORMATS}
    if not formats:
        raise ValueError(
            f"no data files (json, jsonl, csv, parquet, arrow) among: {', '.join(paths[:10])}; "
            "set data_format if the files have other extensions"
        )
    # The same data is often published in several formats (e.g. jsonl + parquet): take the most exact one.
    fmt = next(f for f in FORMAT_PREFERENCE if f in formats)
    if len(formats) > 1:
        log.warning("found %s files; reading the %s ones (set data_format to choose)", sorted(formats), fmt)
    return fmt, [p for p in candidates if FORMATS.get(suffix(p)) == fmt]


class _Source:
    """Loads splits from one source; files from s3/https are fetched once into a temp dir in the workspace."""

    def __init__(self, uri: str, listing: storage.Listing, data_format: str, subset: str, scratch: Path):
        self.uri, self.listing, self.subset, self.scratch = uri, listing, subset, scratch
        self.is_hub = listing.uri.scheme == "hf"
        self.format, self.data_files = (
            ("", []) if self.is_hub else detect_format([f.path for f in listing.files], data_format)
        )
        self._local_root: Path | None = None

    def _root(self) -> Path:
        if self._local_root is None:
            if self.listing.uri.scheme == "file":  # read in place; a single file is listed by its name
                path = Path(self.listing.uri.path)
                self._local_root = path if path.is_dir() else path.parent
            else:
                self._local_root = self.scratch / "raw"
                storage.download(self.listing, self.data_files, self._local_root)
        return self._local_root

    def load(self, split: str, num_proc: int):
        import datasets

        datasets.disable_progress_bars()  # per-batch bars garble step logs; we log per split and shard
        cache_dir = str(self.scratch / "cache")
        num_proc = num_proc if num_proc > 1 else None
        try:
            if self.is_hub:
                # Retried as a whole: files already in the cache are not fetched again.
                return storage.with_retries(
                    lambda: datasets.load_dataset(
                        self.listing.uri.repo_id,
                        self.subset or None,
                        revision=self.listing.commit_sha,
                        data_dir=self.listing.uri.path or None,
                        split=split,
                        cache_dir=cache_dir,
                        token=os.environ.get("HF_TOKEN") or False,
                        num_proc=num_proc,
                    ),
                    what=f"load {self.uri} split {split!r}",
                )
            root = self._root()
            files = [str(root / p) for p in self.data_files]
            # Split names come from file/folder names as in `datasets` (train*, validation*/dev*, test*/eval*);
            # a single file or unnamed files form the `train` split.
            data_files = _files_by_split(files, root)
            if self.format == "json" and split in data_files:
                streamed = _read_json_lines(data_files[split], Path(cache_dir) / f"{split}.arrow")
                if streamed is not None:
                    return streamed
            return datasets.load_dataset(
                self.format, data_files=data_files, split=split, cache_dir=cache_dir, num_proc=num_proc
            )
        except ValueError as exc:
            if "corresponds to no data" in str(exc):
                raise DatasetValidationError(f"{self.uri}: split {split!r} is empty (no rows)") from exc
            if "Unknown split" in str(exc) or "Bad split" in str(exc):
                raise ValueError(f"{self.uri}: split {split!r}: {exc}") from exc
            raise


def _read_json_lines(files: list[str], arrow_path: Path):
    """JSON Lines files as a `datasets.Dataset` on a memory-mapped Arrow file, or None when pyarrow cannot read
    them as one table (not JSON Lines, a field or type that changes after the first block, files that differ):
    then the caller uses the `datasets` JSON builder, which handles those.

    pyarrow's streaming reader parses block by block in C++ straight into the Arrow file: about 3x faster than the
    `datasets` JSON builder, which also re-parses rows in Python to infer types. Same types either way (that
    builder parses with pyarrow too), and memory stays flat as with `load_dataset`. Needs pyarrow >= 20.
    """
    import datasets
    import pyarrow as pa
    import pyarrow.json as pa_json

    arrow_path.parent.mkdir(parents=True, exist_ok=True)
    writer = None
    try:
        with pa.OSFile(str(arrow_path), "wb") as sink:
            for file in files:
                for batch in pa_json.open_json(file):
                    if writer is None:
                        writer = pa.ipc.new_stream(sink, batch.schema)
                    writer.write_batch(batch)
            if writer is None:
                return None  # no rows: the datasets builder reports the empty split
            writer.close()
    except (pa.ArrowInvalid, ValueError) as error:
        log.info(
            "reading %s with the datasets JSON builder (%s)", ", ".join(files), str(error).splitlines()[0]
        )
        return None
    return datasets.Dataset.from_file(str(arrow_path))


def _files_by_split(files: list[str], root: Path) -> dict[str, list[str]]:
    """Group `files` into splits with the `datasets` library's own file-name conventions."""
    from datasets.data_files import DataFilesDict, get_data_patterns

    if len(files) == 1:
        return {"train": files}
    resolved = DataFilesDict.from_patterns(get_data_patterns(str(root)), base_path=str(root))
    chosen = {os.path.realpath(f): f for f in files}
    result = {}
    for split, split_files in resolved.items():
        matched = sorted({chosen[r] for r in map(os.path.realpath, split_files) if r in chosen})
        if matched:
            result[split] = matched
    return result or {"train": sorted(files)}


# --- types and validation ----------------------------------------------------------------------------------


def resolve_schema(dataset_type: str, columns: list[str], column_map: dict[str, str]) -> tuple[Schema, dict]:
    """The schema for `dataset_type` given the source columns, and the rename {source: canonical}.

    `column_map` maps canonical names to source column names, as in torchtune ({"input": "question"}).
    """
    if dataset_type not in DATASET_TYPES:
        raise ValueError(f"dataset_type {dataset_type!r} is not one of {', '.join(DATASET_TYPES)}")

    def source(canonical: str) -> str:
        return column_map.get(canonical, canonical)

    if dataset_type == "instruct":
        alpaca = source("instruction") in columns
        schema = Schema("alpaca", ("instruction", "output"), ("input",)) if alpaca else Schema(
            "input_output", ("input", "output")
        )  # fmt: skip
    elif dataset_type == "chat":
        if source("messages") in columns:
            schema = Schema("openai", ("messages",))
        elif source("conversations") in columns:
            schema = Schema("sharegpt", ("conversations",))
        else:
            raise DatasetValidationError(
                f"chat data needs a `messages` (OpenAI) or `conversations` (ShareGPT) column; the data has "
                f"{columns}. Map another name with column_map, e.g. {{'messages': 'dialog'}}."
            )
    else:
        schema = Schema("text", ("text",))
    missing = [
        repr(c) + (f" (mapped to {source(c)!r})" if source(c) != c else "")
        for c in schema.columns
        if source(c) not in columns
    ]
    if missing:
        raise DatasetValidationError(
            f"{dataset_type} data ({schema.style}) needs column(s) {', '.join(missing)}; the data has {columns}. "
            "Map other names with column_map, e.g. {'input': 'question', 'output': 'answer'}."
        )
    wanted = schema.columns + tuple(c for c in schema.optional if source(c) in columns)
    return schema, {source(c): c for c in wanted}


def _message_problem(messages, style: str) -> str | None:
    role_key, text_key, roles = ("role", "content", OPENAI_ROLES) if style == "openai" else (
        "from", "value", SHAREGPT_ROLES
    )  # fmt: skip
    if messages is None:
        return "is null"
    if not isinstance(messages, list) or not messages:
        return "is not a non-empty list of messages"
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or role_key not in message or text_key not in message:
            return f"message {i} lacks {role_key!r}/{text_key!r}"
        if message[role_key] not in roles:
            return f"message {i} has {role_key} {message[role_key]!r} (expected one of {sorted(roles)})"
        if not isinstance(message[text_key], str):
            return f"message {i} {text_key} is {type(message[text_key]).__name__}, not a string"
    return None


def validate(ds, schema: Schema, split: str, batch_size: int = 1000) -> None:
    """Check types and every row; raise DatasetValidationError with the first bad rows by index."""
    import pyarrow as pa

    if len(ds) == 0:
        raise DatasetValidationError(f"the {split} split is empty")
    present = [c for c in schema.columns + schema.optional if c in ds.column_names]
    chat = schema.style in ("openai", "sharegpt")
    for column in present:
        arrow_type = ds.data.schema.field(column).type
        if chat:
            ok = pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)
        else:
            ok = (
                pa.types.is_string(arrow_type)
                or pa.types.is_large_string(arrow_type)
                or pa.types.is_null(arrow_type)
            )
        if not ok:
            want = "a list of messages" if chat else "strings"
            raise DatasetValidationError(f"{split}: column {column!r} has type {arrow_type}, expected {want}")
    if not chat:
        bad_count, bad = _blank_string_rows(ds, [c for c in schema.columns if c in present])
    else:
        bad_count, bad = _bad_message_rows(ds, present, schema, batch_size)
    if bad:
        raise DatasetValidationError(
            f"{split}: {bad_count} of {len(ds)} rows are not valid {schema.style} data; first: "
            + "; ".join(bad)
        )


def _blank_string_rows(ds, columns: list[str], batch_size: int = 100_000) -> tuple[int, list[str]]:
    """Null or blank values in required string columns, found with Arrow kernels (types are checked already;
    optional string columns may hold anything of that type)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    bad: list[str] = []
    bad_count = 0
    start = 0
    for batch in ds.select_columns(columns).with_format("arrow").iter(batch_size=batch_size):
        problems = []
        for column in columns:
            values = batch.column(column)
            null = pc.is_null(values)
            if pa.types.is_null(values.type):
                blank = null
            else:
                blank = pc.and_(
                    pc.invert(null), pc.equal(pc.utf8_trim_whitespace(pc.fill_null(values, "x")), "")
                )
            problems.append((column, null, blank))
        any_bad = problems[0][1]
        for _, null, blank in problems:
            any_bad = pc.or_(any_bad, pc.or_(null, blank))
        rows = pc.indices_nonzero(any_bad).to_pylist()
        bad_count += len(rows)
        for row in rows[: max(0, MAX_REPORTED_ROWS - len(bad))]:
            column, null, _ = next(p for p in problems if p[1][row].as_py() or p[2][row].as_py())
            bad.append(f"row {start + row}: {column} {'is null' if null[row].as_py() else 'is empty'}")
        start += batch.num_rows
    return bad_count, bad


def _bad_message_rows(ds, present: list[str], schema: Schema, batch_size: int) -> tuple[int, list[str]]:
    bad: list[str] = []
    bad_count = 0
    start = 0
    for batch in ds.select_columns(present).iter(batch_size=batch_size):
        rows = len(batch[present[0]])
        for offset in range(rows):
            for column in present:
                value = batch[column][offset]
                if column in schema.optional:
                    problem = None if value is None or isinstance(value, str) else "is not a string"
                else:
                    problem = _message_problem(value, schema.style)
                if problem:
                    bad_count += 1
                    if len(bad) < MAX_REPORTED_ROWS:
                        bad.append(f"row {start + offset}: {column} {problem}")
                    break
        start += rows
    return bad_count, bad


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
        {"path": p.relative_to(root).as_posix(), "size": p.stat().st_size, "sha256": sha256_file(p)}
        for p in files
    ]


def _present_copy_matches(final: Path, fingerprint: str) -> dict | None:
    manifest = read_manifest(final)
    if not manifest or manifest.get("fingerprint") != fingerprint:
        return None
    for split in manifest["splits"].values():
        for record in split["files"]:
            path = final / record["path"]
            if not path.is_file() or path.stat().st_size != record["size"]:
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


def _artifact_metadata(manifest: dict, split: str, final: Path, workspace: str, skipped: bool) -> dict:
    info = manifest["splits"].get(split, {"num_rows": 0, "files": [], "source_split": ""})
    rel = workspace_relative(final, workspace)
    return {
        "workspace_path": f"{rel}/{split}",
        "data_files": [f"{rel}/{f['path']}" for f in info["files"]],
        "format": "parquet",
        "split": split,
        "source_split": info["source_split"],
        "num_rows": info["num_rows"],
        "columns": manifest["columns"],
        "dataset_type": manifest["dataset_type"],
        "data_style": manifest["data_style"],
        **_torchtune_hints(manifest["data_style"]),
        "column_map": manifest["column_map"],
        "source_uri": manifest["source_uri"],
        "revision": manifest["revision"] or "",
        "commit_sha": manifest["commit_sha"] or "",
        "files": info["files"],
        "total_bytes": sum(f["size"] for f in info["files"]),
        "reused_existing_copy": skipped,
    }


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
    rows_per_shard: int = 100_000,
    num_proc: int = 1,
    s3_endpoint_url: str = "",
    output_train: ArtifactLike | None = None,
    output_eval: ArtifactLike | None = None,
) -> DatasetInitResult:
    """Load, validate and write the dataset at `source_uri` into `<workspace_path>/datasets/<name>/`."""
    column_map = dict(column_map or {})
    if eval_split and eval_fraction:
        raise ValueError("set either eval_split or eval_fraction, not both")
    if not 0 <= eval_fraction < 1:
        raise ValueError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
    if rows_per_shard < 1:
        raise ValueError("rows_per_shard must be positive")
    parsed = storage.parse_uri(source_uri)
    name = entry_name(name, parsed.repo_id or source_uri)
    final = area_dir(workspace_path, "datasets", name)
    listing = storage.list_files(source_uri, repo_type="dataset", endpoint_url=s3_endpoint_url or None)
    params = [dataset_type, column_map, train_split, eval_split, eval_fraction, seed, data_format, subset]
    fingerprint = hashlib.sha256(
        json.dumps([listing.fingerprint(f.path for f in listing.files), params, rows_per_shard]).encode()
    ).hexdigest()

    manifest = _present_copy_matches(final, fingerprint)
    skipped = manifest is not None
    if skipped:
        log.info("datasets/%s already holds %s with a matching manifest: skipping", name, source_uri)
    else:
        remove_stale_temps(final)
        manifest = _build(
            listing, final, fingerprint, source_uri=source_uri, name=name, dataset_type=dataset_type,
            column_map=column_map, train_split=train_split, eval_split=eval_split, eval_fraction=eval_fraction,
            seed=seed, data_format=data_format, subset=subset, rows_per_shard=rows_per_shard, num_proc=num_proc,
        )  # fmt: skip

    train_meta = _artifact_metadata(manifest, "train", final, workspace_path, skipped)
    eval_meta = _artifact_metadata(manifest, "eval", final, workspace_path, skipped)
    write_artifact(output_train, manifest, train_meta)
    write_artifact(output_eval, manifest, eval_meta)
    return DatasetInitResult(final, manifest, train_meta, eval_meta, skipped)


def _build(listing: storage.Listing, final: Path, fingerprint: str, **p) -> dict:
    final.parent.mkdir(parents=True, exist_ok=True)
    # Scratch (downloads + Arrow cache) lives beside the entry, on the workspace volume, and is always removed
    # (named like atomic_dir's temp dirs, so remove_stale_temps also clears one a killed run left).
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=f".{final.name}.tmp-scratch-") as scratch:
        source = _Source(p["source_uri"], listing, p["data_format"], p["subset"], Path(scratch))
        where = p["source_uri"] + (f" (commit {listing.commit_sha})" if listing.commit_sha else "")
        log.info("loading split %r from %s", p["train_split"], where)
        train = source.load(p["train_split"], p["num_proc"])
        schema, rename = resolve_schema(p["dataset_type"], train.column_names, p["column_map"])
        train = _canonical(train, rename)
        held_out, eval_source = None, ""
        if p["eval_split"]:
            log.info("loading eval split %r", p["eval_split"])
            held_out = _canonical(source.load(p["eval_split"], p["num_proc"]), rename)
            eval_source = p["eval_split"]
        elif p["eval_fraction"]:
            parts = train.train_test_split(test_size=p["eval_fraction"], seed=p["seed"], shuffle=True)
            train, held_out = parts["train"], parts["test"]
            eval_source = f"{p['train_split']} (held-out {p['eval_fraction']:g}, seed {p['seed']})"
        validate(train, schema, "train")
        if held_out is not None:
            validate(held_out, schema, "eval")

        with atomic_dir(final) as tmp:
            splits = {}
            for split, ds, source_split in (
                ("train", train, p["train_split"]),
                ("eval", held_out, eval_source),
            ):
                if ds is None:
                    continue
                files = write_shards(ds, tmp / split, p["rows_per_shard"])
                splits[split] = {
                    "num_rows": len(ds),
                    "source_split": source_split,
                    "files": _split_records(files, tmp),
                }
                log.info("datasets/%s/%s: %d rows in %d shard(s)", final.name, split, len(ds), len(files))
            manifest = {
                "kind": "dataset",
                "name": final.name,
                "source_uri": p["source_uri"],
                "revision": listing.revision,
                "commit_sha": listing.commit_sha,
                "source_format": source.format or "hub",
                "fingerprint": fingerprint,
                "dataset_type": p["dataset_type"],
                "data_style": schema.style,
                "columns": list(train.column_names),
                "column_types": {c: str(t) for c, t in train.features.items()},
                "column_map": {v: k for k, v in rename.items() if k != v},
                "seed": p["seed"],
                "eval_fraction": p["eval_fraction"],
                "splits": splits,
                "created_at": utc_now(),
            }
            write_json_atomic(tmp / MANIFEST, manifest)
    return manifest


def _canonical(ds, rename: dict[str, str]):
    """Keep the type's columns only, under their canonical names."""
    ds = ds.select_columns(list(rename))
    renames = {old: new for old, new in rename.items() if old != new}
    return ds.rename_columns(renames) if renames else ds


def iter_rows(paths: list[Path]) -> Iterator[dict]:
    """Rows of written parquet shards, in order (for tests and later steps that stream them)."""
    import pyarrow.parquet as pq

    for path in paths:
        for batch in pq.ParquetFile(path).iter_batches():
            yield from batch.to_pylist()
